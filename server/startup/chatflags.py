"""vLLM's chat template flags, read as vLLM reads them, into one recorded setting
(`Settings.chat`, a `ChatSettings`; the last value of a flag wins, as argparse's):

- `--chat-template T`: a file's path, read at start; or, where no file opens and `T`
  has a Jinja2 character (`{`, `}` or a line break), the template itself. A path that
  does not open is refused in vLLM's words. A template that does not compile is found
  at the first chat, as vLLM finds it: each chat is a 400 that says why.
- `--chat-template-content-format {auto,string,openai}` (http/openai/contentformat.py).
- `--default-chat-template-kwargs JSON`: a JSON object of template variables (any, as
  vLLM takes them: what a chat sets itself, its messages, or its tools and documents
  where it sends them, wins).
- `--trust-request-chat-template` (a switch).
- `--response-role ROLE`.
- `--reasoning-effort-map JSON`: a JSON object from vLLM's efforts to strings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..control.chat import CONTENT_FORMATS, EFFORTS, ChatSettings
from .flags import Flag, flag, given_value, switch_value

_TEMPLATE: Final = "--chat-template"
_FORMAT: Final = "--chat-template-content-format"
_KWARGS: Final = "--default-chat-template-kwargs"
_TRUST: Final = "--trust-request-chat-template"
_ROLE: Final = "--response-role"
_EFFORTS: Final = "--reasoning-effort-map"
# Where vLLM takes a --chat-template that opens no file for the template itself.
_JINJA_CHARACTERS: Final = "{}\n"


def chat_flag() -> Mapping[str, Flag]:
    return flag(
        _TEMPLATE,
        _FORMAT,
        _KWARGS,
        _TRUST,
        _ROLE,
        _EFFORTS,
        record_flag=True,
        bare=True,
        check=_read,
        metavar="VALUE",
        help="vLLM's chat flags: --chat-template (a file, or the template itself) renders "
        "every /v1 chat in place of the model's own; --chat-template-content-format "
        "auto|string|openai; --default-chat-template-kwargs (a JSON object of template "
        "variables, under each request's own); --trust-request-chat-template (a request's "
        "own `chat_template` is used, not refused); --response-role (the answers' role, "
        "default assistant); --reasoning-effort-map (a JSON object: a request's reasoning "
        "effort to the one the template knows)",
        group="OpenAI-compatible API",
    )


def _template(text: str) -> str:
    try:
        with open(text, encoding="utf-8") as file:
            source = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        if not any(character in text for character in _JINJA_CHARACTERS):
            raise ValueError(
                f"The supplied chat template ({text}) looks like a file path, but it failed "
                f"to be opened. Reason: {exc}"
            ) from None
        source = text
    return source


def _format(text: str) -> str:
    if text not in CONTENT_FORMATS:
        choices = ", ".join(CONTENT_FORMATS)
        raise ValueError(f"argument {_FORMAT}: invalid choice: '{text}' (choose from {choices})")
    return text


def _json(text: str) -> Any:
    """The JSON value `text` is; None where it is none."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _kwargs(text: str) -> dict[str, Any]:
    value = _json(text)
    if not isinstance(value, dict):
        raise ValueError(f"{_KWARGS} takes a JSON object, e.g. '{{\"enable_thinking\": false}}'")
    return value


def _effort_map(text: str) -> dict[str, str]:
    """vLLM's checks, in its words."""
    value = _json(text)
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(
            f"Error: {_EFFORTS} must be a JSON object mapping reasoning efforts to strings."
        )
    unknown = sorted(set(value) - set(EFFORTS))
    if unknown:
        raise ValueError(
            f"Error: {_EFFORTS} has unknown efforts {unknown}; keys must be one of {list(EFFORTS)}."
        )
    return value


def _read(_name: str, given: Sequence[tuple[str, str]]) -> ChatSettings:
    values: dict[str, Any] = {}
    # The last of each flag alone is read, as argparse keeps only it.
    for name, text in dict(given).items():
        if name == _TRUST:
            values["trust_request_template"] = switch_value(name, text)
        elif name == _TEMPLATE:
            values["template"] = _template(given_value(name, text))
        elif name == _FORMAT:
            values["content_format"] = _format(given_value(name, text))
        elif name == _KWARGS:
            values["default_kwargs"] = _kwargs(given_value(name, text))
        elif name == _ROLE:
            values["response_role"] = given_value(name, text)
        else:
            values["effort_map"] = _effort_map(given_value(name, text))
    return ChatSettings(**values)
