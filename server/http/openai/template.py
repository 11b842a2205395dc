"""Chat messages rendered into a prompt with the model's chat template.

Templates follow Hugging Face's convention: Jinja2 source that sees `messages` (dicts
with `role` and `content`), `bos_token`, `eos_token` and `add_generation_prompt`, and may
call `raise_exception(message)` to refuse a conversation (e.g. roles out of order), which
is the client's 400 here. They run in Jinja2's `ImmutableSandboxedEnvironment`, since a
template comes with a model and must not reach the server's objects. A compiled template
is kept per source text, so a chat costs one render, not a compile.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ge_serve.backends.base import TextGeneration

from .errors import OpenAIError
from .schemas import ChatMessage


class _Refused(Exception):
    """The template's own `raise_exception`."""


def _raise_exception(message: str) -> NoReturn:
    raise _Refused(message)


@lru_cache(maxsize=16)
def _compiled(source: str) -> jinja2.Template:
    # As Hugging Face renders them (transformers' apply_chat_template).
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.globals["raise_exception"] = _raise_exception
    return environment.from_string(source)


def render(generation: TextGeneration, messages: Sequence[ChatMessage]) -> str:
    """The prompt for `messages`, ending where the assistant's answer begins."""
    assert generation.chat_template is not None
    try:
        template = _compiled(generation.chat_template)
    except jinja2.TemplateError as exc:
        raise OpenAIError(
            f"The model's chat template does not compile: {exc}", status=500, kind="server_error"
        ) from None
    conversation: list[dict[str, Any]] = [
        {"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
        for m in messages
    ]
    try:
        return template.render(
            messages=conversation,
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
