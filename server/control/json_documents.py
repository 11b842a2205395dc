"""JSON documents that are not tensor data, checked by pydantic models in our own words.

The control-plane request bodies (repository index, load and unload, shared-memory
register, log settings; trace settings the same way) are pydantic models, so one definition
both checks a document and describes it in the HTTP front end's OpenAPI document. Tensor
data never comes here: the infer codecs stay hand-written for speed.

Clients match on error text, much of it Triton's ("expect boolean for 'log_info'
setting"), so a failed check is a `ServerError` INVALID_ARG whose message is the sentence
the model gives for that field (`worded`), not pydantic's report. Models are strict: JSON
`true` is not the integer 1, and `1.0` is not an integer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Final, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from ..errors import ErrorCode, ServerError

# The pydantic error type of a message given with `worded`.
WORDED: Final = "ge_serve_worded"

D = TypeVar("D", bound="Document")


class Document(BaseModel):
    """Base of the checked documents: strict types, immutable once checked.

    `missing_field` and `unknown_field` word a required field that is absent and a field
    the model forbids; `{what}` names the document, `{field}` the field and `{fields}`
    lists the model's fields.
    """

    model_config = ConfigDict(strict=True, frozen=True)

    missing_field: ClassVar[str] = "the {what} has no '{field}' field"
    unknown_field: ClassVar[str] = "unknown field '{field}' in the {what}: expected one of {fields}"


def worded(message: str | Callable[[Any], str]) -> WrapValidator:
    """An `Annotated` marker: pydantic still checks the value, and a failure of the value
    itself reads `message` (or `message(value)`). Failures inside a nested model keep
    their own wording."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            if any(error["loc"] or error["type"] == WORDED for error in exc.errors()):
                raise
            text = message(value) if callable(message) else message
            # The text goes in as context, so braces in it are never read as a template.
            raise PydanticCustomError(WORDED, "{text}", {"text": text}) from None

    return WrapValidator(check)


def reject(message: str) -> PydanticCustomError:
    """A failure raised by a model's own validator, worded like `worded`'s."""
    return PydanticCustomError(WORDED, "{text}", {"text": message})


def validate(model: type[D], data: Any, what: str) -> D:
    """`data` checked against `model`; the first problem is a ServerError INVALID_ARG.

    A missing field is reported before a wrong one, so a document with several problems
    names the one a reader fixes first.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = next((e for e in errors if e["type"] == "missing"), errors[0])
        raise ServerError(ErrorCode.INVALID_ARG, _message(model, first, what)) from None


def _message(model: type[Document], error: ErrorDetails, what: str) -> str:
    field = ".".join(str(part) for part in error["loc"])
    kind = error["type"]
    if kind == WORDED:
        return error["msg"]
    fields = ", ".join(f"'{name}'" for name in model.model_fields)
    if kind == "missing":
        return model.missing_field.format(what=what, field=field, fields=fields)
    if kind == "extra_forbidden":
        return model.unknown_field.format(what=what, field=field, fields=fields)
    if field:
        return f"'{field}' of the {what} is not valid: {error['msg']}"
    return f"the {what} is not valid: {error['msg']}"
