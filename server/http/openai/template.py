"""Chat messages rendered into a prompt with the model's chat template.

Templates are Hugging Face's: Jinja2 source rendered as transformers'
`apply_chat_template` renders it (Triton's OpenAI front end and vLLM call it), with the
same environment, so a model's template gives the same prompt here as there:

- the variables `messages`, `tools` and `documents` (None: tools are refused, and there
  are no documents), `add_generation_prompt` (true), `bos_token` and `eos_token`;
- `raise_exception(message)`, by which a template refuses a conversation (roles out of
  order, say): the client's 400 on `messages`;
- `strftime_now(format)`, the server's local time (Granite's templates date their system
  prompt with it);
- the filter `tojson`, as `json.dumps(x, ensure_ascii=False, indent=None,
  separators=None, sort_keys=False)` with those keywords, where Jinja2's own escapes
  `<`, `>`, `&`, `'` and every non-ASCII character (tool-call templates print arguments
  with it);
- the tag `{% generation %}...{% endgeneration %}` (transformers' AssistantTracker, which
  marks the assistant's tokens for training masks), rendering what it encloses;
- `trim_blocks`, `lstrip_blocks` and the loop controls (`break`, `continue`).

Each message is a dict as transformers is given it: `role`, `content` (text parts joined
by "\\n", as vLLM and TensorRT-LLM join them), `name` when sent, an assistant's
`tool_calls` (each `function.arguments` parsed from its JSON string, as Triton and vLLM
pass it, since templates print it as an object) and a tool message's `tool_call_id`.

Templates run in Jinja2's `ImmutableSandboxedEnvironment`, since a template comes with a
model and must not reach the server's objects. A template is compiled once per source
text, so a chat costs one render, not a compile. One that does not compile is not a
failure of every chat (a 500): the model is loaded and serves /v1/completions and v2, so
a chat answers 400 with code `chat_template_invalid`, as for a model without a template,
and the compile error is logged once (see `_compiled`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ge_serve.backends.base import TextGeneration

from .errors import OpenAIError
from .schemas import ChatMessage

log = logging.getLogger(__name__)

CHAT_TEMPLATE_INVALID = "chat_template_invalid"


class _Refused(Exception):
    """The template's own `raise_exception`."""


def _raise_exception(message: str) -> NoReturn:
    raise _Refused(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
    )


class _Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: what it encloses, rendered in place.
    transformers also notes where that text falls (for training masks); a prompt has no
    use for it."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


@lru_cache(maxsize=16)
def _compiled(source: str) -> jinja2.Template | str:
    """The template, or why it does not compile (kept, so a template that does not is
    compiled, and logged, once rather than on every chat)."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_Generation, jinja2.ext.loopcontrols],
    )
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.filters["tojson"] = _tojson
    try:
        return environment.from_string(source)
    except jinja2.TemplateError as exc:
        where = f"line {exc.lineno}: " if isinstance(exc, jinja2.TemplateSyntaxError) else ""
        reason = f"{where}{exc}"
        log.warning("a model's chat template does not compile, its chats are refused: %s", reason)
        return reason


def render(generation: TextGeneration, messages: Sequence[ChatMessage]) -> str:
    """The prompt for `messages`, ending where the assistant's answer begins."""
    assert generation.chat_template is not None
    template = _compiled(generation.chat_template)
    if isinstance(template, str):
        raise OpenAIError(
            f"The model's chat template does not compile: {template}. Use /v1/completions "
            "with a prompt, or give the model a chat template that compiles",
            param="model",
            code=CHAT_TEMPLATE_INVALID,
        )
    conversation = [_message(index, message) for index, message in enumerate(messages)]
    try:
        return template.render(
            messages=conversation,
            tools=None,
            documents=None,
            bos_token=generation.bos_token,
            eos_token=generation.eos_token,
            add_generation_prompt=True,
        )
    except _Refused as exc:
        raise OpenAIError(f"The conversation was refused: {exc}", param="messages") from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError) as exc:
        raise OpenAIError(
            f"The messages do not fit the model's chat template: {exc}", param="messages"
        ) from None


def _message(index: int, message: ChatMessage) -> dict[str, Any]:
    """One message as transformers' templates are given it."""
    found: dict[str, Any] = {"role": message.role, "content": message.text()}
    if message.name:
        found["name"] = message.name
    if message.tool_calls:
        found["tool_calls"] = [
            {
                "id": call.id,
                "type": call.type,
                "function": {
                    "name": call.function.name,
                    "arguments": _arguments(
                        call.function.arguments,
                        f"messages[{index}].tool_calls[{number}].function.arguments",
                    ),
                },
            }
            for number, call in enumerate(message.tool_calls)
        ]
    if message.tool_call_id is not None:
        found["tool_call_id"] = message.tool_call_id
    return found


def _arguments(text: str, param: str) -> Any:
    """A tool call's arguments, a JSON string in OpenAI's API, as the object templates
    print (empty: no arguments)."""
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except ValueError:
        raise OpenAIError(f"Invalid value for '{param}': not JSON", param=param) from None
