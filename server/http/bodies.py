"""The JSON request bodies of the HTTP control plane, as pydantic models.

Each endpoint reads its body with `decode_body` (after the front end's size cap and
decompression), and the OpenAPI document describes the body with the same model, so the
two cannot disagree. The messages are the ones clients have matched on since these bodies
were checked by hand.

`InferRequestBody` is different: the infer path is decoded by the hand-written codec
(`codec.decode_infer_request`) for speed, and the model only describes that JSON for the
OpenAPI document.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, WrapValidator, model_validator
from pydantic.config import JsonDict

from ge_serve.server.control.json_documents import Document, reject, validate, worded
from ge_serve.server.control.model_control import FILE_PREFIX
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference import error_texts
from ge_serve.server.inference.types import DataType

from . import codec

D = TypeVar("D", bound=Document)
# The longest base64 text a `file:` load parameter may have (Triton's INT_MAX).
FILE_TEXT_LIMIT = error_texts.INT_MAX


def decode_body(model: type[D], body: bytes, what: str, *, optional: bool = False) -> D:
    """Parse and check a JSON body; with `optional`, an empty body is the model's defaults.

    Malformed JSON reads "failed to parse the <what> JSON buffer: ...".
    """
    if optional and not body.strip():
        return validate(model, {}, what)
    document = codec.decode_json_object(body, what)
    if _depth_exceeds(document, error_texts.MAX_JSON_DEPTH):
        raise error_texts.json_document_too_deep(what)
    return validate(model, document, what)


def _depth_exceeds(document: Any, limit: int) -> bool:
    """Whether objects and arrays nest deeper than `limit`, without recursion."""
    pending = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > limit:
            return True
        if isinstance(value, dict):
            pending.extend((v, depth + 1) for v in value.values() if isinstance(v, dict | list))
        elif isinstance(value, list):
            pending.extend((v, depth + 1) for v in value if isinstance(v, dict | list))
    return False


def _no_default(schema: JsonDict) -> None:
    """For a field whose absence means something else than any value it could have."""
    schema.pop("default", None)


# --- model repository -----------------------------------------------------------------------


class RepositoryIndexRequest(Document):
    ready: Annotated[bool, worded(error_texts.READY_NOT_BOOLEAN)] = Field(
        False, description="List only the models that are ready."
    )


def decode_index_request(body: bytes) -> RepositoryIndexRequest:
    """The repository index request. Triton parses a document of any depth and then reads
    `ready` alone; orjson stops at 1024 levels, and the depth limit at 100. A document
    refused for either whose `ready` is plainly no boolean gets Triton's answer for that."""
    what = "repository index request"
    try:
        return decode_body(RepositoryIndexRequest, body, what, optional=True)
    except ServerError:
        start = member_start(body, b"ready")
        if start is not None and start not in b"tf":
            raise ServerError(ErrorCode.INVALID_ARG, error_texts.READY_NOT_BOOLEAN) from None
        raise


# How far into a body `member_start` looks: the answer is for a person, not worth an
# unbounded scan of a body that may be as large as --http-max-input-size.
MEMBER_SCAN_LIMIT = 1 << 16


def member_start(body: bytes, name: bytes) -> bytes | None:
    """The first byte of the value of top-level member `name` of the JSON object text
    `body`, found by scanning its first MEMBER_SCAN_LIMIT bytes without parsing (so at any
    depth); None when not found there."""
    depth = 0
    last = 0  # the last significant byte
    key: bytes | None = None
    end = min(len(body), MEMBER_SCAN_LIMIT)
    i = 0
    while i < end:
        c = body[i]
        if c in b" \t\r\n":
            i += 1
            continue
        if depth == 1 and last == _COLON and key == name:
            return body[i : i + 1]
        if c == _QUOTE:
            j = i + 1
            while j < end and body[j] != _QUOTE:
                j += 2 if body[j] == _BACKSLASH else 1
            if depth == 1 and last in (_OPEN_OBJECT, _COMMA):
                key = body[i + 1 : j]
            i = j + 1
            last = _QUOTE
            continue
        if c in b"[{":
            depth += 1
        elif c in b"]}":
            depth -= 1
        last = c
        i += 1
    return None


_QUOTE, _BACKSLASH, _COLON, _COMMA, _OPEN_OBJECT = b'"'[0], b"\\"[0], b":"[0], b","[0], b"{"[0]


class LoadParameters(Document):
    """`config` and `file:<version>/<name>` entries; other parameters are ignored."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "patternProperties": {
                "^file:": {
                    "type": "string",
                    "contentEncoding": "base64",
                    "description": "A file of the model, `file:<version>/<name>`, in base64. "
                    "Needs `config`.",
                }
            }
        },
    )

    config: Annotated[
        str,
        worded("load parameter 'config' must be a JSON string"),
        Field(
            description="The model configuration as JSON text, replacing the repository's.",
            json_schema_extra=_no_default,
        ),
    ] = ""
    _files: dict[str, bytes] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _decode_files(self) -> Self:
        for key, value in (self.model_extra or {}).items():
            if not key.startswith(FILE_PREFIX):
                continue
            if not isinstance(value, str):
                raise reject(f"load parameter '{key}' must be a base64 string")
            if len(value) > FILE_TEXT_LIMIT:
                raise reject(error_texts.file_too_large(key).message)
            try:
                content = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise reject(f"load parameter '{key}' is not valid base64") from None
            self._files[key[len(FILE_PREFIX) :]] = content
        return self

    @property
    def config_json(self) -> str | None:
        """The config text, None when the request gives none."""
        return self.config if "config" in self.model_fields_set else None

    @property
    def files(self) -> dict[str, bytes]:
        """`<version>/<name>` -> decoded content."""
        return self._files


class RepositoryLoadRequest(Document):
    parameters: Annotated[
        LoadParameters, worded("'parameters' of the load request must be an object")
    ] = Field(default_factory=lambda: LoadParameters())


class UnloadParameters(Document):
    unload_dependents: Annotated[
        bool, worded("unload parameter 'unload_dependents' must be a boolean")
    ] = False


class RepositoryUnloadRequest(Document):
    parameters: Annotated[
        UnloadParameters, worded("'parameters' of the unload request must be an object")
    ] = Field(default_factory=UnloadParameters)


# --- shared memory --------------------------------------------------------------------------


def _count(field: str) -> WrapValidator:
    return worded(f"'{field}' of the register request must be a non-negative integer")


class SystemSharedMemoryRegisterRequest(Document):
    missing_field = "Shared memory register request has no '{field}' field"

    key: Annotated[str, worded("'key' of the register request must be a string")] = Field(
        description="The POSIX shared memory name, '/name'."
    )
    offset: Annotated[int, Field(ge=0), _count("offset")] = 0
    byte_size: Annotated[int, Field(ge=0), _count("byte_size")]


# --- inference: described here, decoded by the codec -----------------------------------------

Parameter = bool | int | float | str


class InferInputTensor(BaseModel):
    name: str
    shape: list[Annotated[int, Field(ge=0)]]
    datatype: DataType
    parameters: dict[str, Parameter] | None = Field(
        None,
        description="`binary_data_size` (its data follows the JSON header), or "
        "`shared_memory_region`, `shared_memory_offset` and `shared_memory_byte_size`.",
    )
    data: list[Any] | None = Field(
        None, description="The elements, row-major, flat or nested by the shape."
    )


class InferRequestedOutput(BaseModel):
    name: str
    parameters: dict[str, Parameter] | None = Field(
        None, description="`binary_data`, `classification`, or shared-memory parameters."
    )


class InferRequestBody(BaseModel):
    """A KServe v2 inference request. With the binary tensor data extension, this JSON is
    the first `Inference-Header-Content-Length` bytes of the body."""

    id: str | None = None
    parameters: dict[str, Parameter] | None = None
    inputs: list[InferInputTensor]
    outputs: list[InferRequestedOutput] | None = None


class ErrorBody(BaseModel):
    """Every error: `{"error": "<message>"}`."""

    error: str


# --- the generate extension: described here, decoded by generate_codec.py --------------------


class GenerateRequestBody(BaseModel):
    """A generate request: one flat object. Each key that names a model input is that
    input (a scalar or a 1-D array, shaped by the model's dims, of its datatype); any other
    key is a request parameter. An empty body is an empty object."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={"examples": [{"text_input": "hello", "parameters": {"stream": False}}]},
    )

    id: str | None = Field(None, description="The request id, echoed in every response.")
    parameters: dict[str, Any] | None = Field(
        None,
        description="More keys, mapped as the top-level ones are: inputs by name, the rest "
        "parameters (a boolean, number or string).",
    )
