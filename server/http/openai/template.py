"""Chat messages rendered into a prompt with the model's chat template.

Templates are Hugging Face's: Jinja2 source rendered as transformers'
`apply_chat_template` renders it (Triton's OpenAI front end and vLLM call it), with the
same environment, so a model's template gives the same prompt here as there:

- the variables `messages`, `tools` (the request's, tools.py; None where none), `documents` and
  `add_generation_prompt` (the request's, as vLLM passes them), `bos_token` and
  `eos_token`, and the request's `chat_template_kwargs` (vLLM's: any variables the
  template reads, `enable_thinking` say; `bos_token` too, as transformers lets them
  override it);
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
pass it, since templates print it as an object), an assistant's earlier thoughts as
`reasoning` and `reasoning_content` (vLLM's, for interleaved thinking) and a tool
message's `tool_call_id`.

A message's content is a string (text parts joined), or OpenAI's text parts where the
template walks them (`--chat-template-content-format`, contentformat.py). OpenAI's
`developer` role reaches a template that does not name it as `system`, the system
messages merged into one first message where needed, as vLLM gives them.

`continue_final_message` (vLLM's, from transformers) leaves the last message open: the
prompt ends where that message's text ends, so the model continues it. The text is marked
at both ends, rendered, and the prompt is what precedes the first mark and the text
between the marks (stripped where the template strips what a message ends with, so an
empty message keeps the template's separator before it); a template that does not print
the message as sent cannot be continued, a 400.

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
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser

from ge_serve.backends.base import TextGeneration
from ge_serve.server.control.chat import ChatSettings

from .contentformat import ContentFormat, walks_parts
from .errors import OpenAIError
from .messages import ChatMessage
from .sandbox import Refused, compiled, environment
from .schemas import ChatCompletionRequest
from .templateproc import Rendered, render_own

log = logging.getLogger(__name__)

CHAT_TEMPLATE_INVALID = "chat_template_invalid"
# A template walks every message in Python (seconds for a million): conversations of more
# messages than this are rendered off the event loop's thread.
RENDERED_ON_THE_LOOP = 64
# Where the message to continue ends; the space tells whether the template strips it.
_MARK = "GE_SERVE_CONTINUE_FINAL_MESSAGE "
# Where it begins: what a trimming template prints before an empty message is kept.
_START = "GE_SERVE_FINAL_MESSAGE_BEGINS"


@lru_cache(maxsize=16)
def _compiled(source: str) -> jinja2.Template | str:
    """The template, or why it does not compile (kept, so a template that does not is
    compiled once rather than on every chat)."""
    try:
        return compiled(source)
    except MemoryError as exc:  # what Jinja2's constant folding made: the template's
        return f"{type(exc).__name__}: {exc}"


@lru_cache(maxsize=16)
def _warn(reason: str) -> None:
    """Once per reason: a model's or the server's template is the operator's to mend."""
    log.warning("a chat template does not compile, its chats are refused: %s", reason)


def content_form(setting: str, source: str) -> ContentFormat:
    """The form `source` is given messages' content in under
    --chat-template-content-format's `setting` (contentformat.py)."""
    if setting in ("string", "openai"):
        return "openai" if setting == "openai" else "string"
    return _detected(source)


@lru_cache(maxsize=32)
def _detected(source: str) -> ContentFormat:
    try:
        return "openai" if walks_parts(environment().parse(source)) else "string"
    except (jinja2.TemplateError, RecursionError):
        # Its chats are refused when it is compiled anyway (a request's own nested
        # thousands deep is the parser's RecursionError, its compile's too).
        return "string"


def variables(body: ChatCompletionRequest, chat: ChatSettings | None = None) -> dict[str, Any]:
    """What the template gets besides the messages, as vLLM gives it: the request's
    `chat_template_kwargs` over --default-chat-template-kwargs, `documents`, and
    `reasoning_effort` (which sets `enable_thinking` too, where the request's kwargs do
    not: over the defaults', as vLLM's)."""
    given = body.chat_template_kwargs or {}
    found = (chat or ChatSettings()).variables(given)
    # The renderer's options, checked equal to the request's own: not variables.
    found.pop("add_generation_prompt", None)
    found.pop("continue_final_message", None)
    if body.documents is not None:  # else the defaults' (or none)
        found["documents"] = body.documents
    effort = (chat or ChatSettings()).effort(body.reasoning_effort)
    if effort is not None:
        found["reasoning_effort"] = effort
        if "enable_thinking" not in given:
            found["enable_thinking"] = effort != "none"
    return found


def render_request(
    generation: TextGeneration,
    body: ChatCompletionRequest,
    tools: list[dict[str, Any]] | None = None,
    chat: ChatSettings | None = None,
) -> str:
    """The prompt for a chat request, with its template controls and `tools` (as sent),
    under the server's chat settings `chat`."""
    return render(
        generation,
        body.messages,
        add_generation_prompt=body.add_generation_prompt,
        continue_final=body.continue_final_message,
        extra=variables(body, chat),
        tools=tools,
        content_format=chat.content_format if chat is not None else "auto",
        own=bool(body.chat_template),
        # The client's own variables are what a template most likely trips over.
        blame="chat_template_kwargs" if body.chat_template_kwargs else "messages",
    )


def render(
    generation: TextGeneration,
    messages: Sequence[ChatMessage],
    *,
    add_generation_prompt: bool = True,
    continue_final: bool = False,
    extra: dict[str, Any] | None = None,
    blame: str = "messages",
    tools: list[dict[str, Any]] | None = None,
    content_format: str = "auto",
    own: bool = False,
) -> str:
    """The prompt for `messages`: ending where the assistant's answer begins, or with
    `continue_final`, where the last message ends. `extra`: more variables; `blame`: the
    field a template's failure is the client's 400 on; `content_format`: how
    messages' content is given (`content_form`); `own`: the template is the request's."""
    source = generation.chat_template
    assert source is not None
    # A request's own compiles in its process too: Jinja2 runs filters as it compiles.
    template = None if own else _compiled(source)
    if isinstance(template, str):
        _warn(template)
        raise OpenAIError(
            f"The chat template does not compile: {template}. Use /v1/completions with a "
            "prompt, or give the model a chat template that compiles",
            param="model",
            code=CHAT_TEMPLATE_INVALID,
        )
    parts = content_form(content_format, source) == "openai"
    conversation = [_message(index, message, parts) for index, message in enumerate(messages)]
    if not _names_developer(source):
        conversation = _as_system(conversation, parts)
    final = ""
    if continue_final:
        final = _mark_final(conversation[-1])
    context: dict[str, Any] = {
        "bos_token": generation.bos_token,
        "eos_token": generation.eos_token,
        "documents": None,
        **(extra or {}),
        "messages": conversation,
        # The request's, else the defaults' (--default-chat-template-kwargs), as vLLM's.
        "tools": tools if tools is not None else (extra or {}).get("tools"),
        "add_generation_prompt": add_generation_prompt,
    }
    if template is None:
        rendered = _rendered_own(source, context)
        return _opened(rendered, final) if continue_final else rendered
    try:
        rendered = template.render(context)
    except Refused as exc:
        raise OpenAIError(f"The conversation was refused: {exc}", param="messages") from None
    except Exception as exc:
        # Whatever a template raises on what a client sent (a ZeroDivisionError, the
        # sandbox's OverflowError for a range too big...) is the client's 400, never a 500.
        raise OpenAIError(
            f"The {blame} do not fit the model's chat template: {type(exc).__name__}: {exc}",
            param=blame,
        ) from None
    return _opened(rendered, final) if continue_final else rendered


def _rendered_own(source: str, context: dict[str, Any]) -> str:
    """A request's own template, rendered in a process of its own (templateproc.py), its
    failures the client's 400s as a model's template's are."""
    reply = render_own(source, context)
    if isinstance(reply, Rendered):
        return reply.text
    if reply.kind == "compile":
        raise OpenAIError(
            f"The request's chat template does not compile: {reply.message}",
            param="chat_template",
            code=CHAT_TEMPLATE_INVALID,
        )
    if reply.kind == "refused":
        raise OpenAIError(f"The conversation was refused: {reply.message}", param="messages")
    # Anything else went wrong in the client's own code: its template is to blame.
    raise OpenAIError(f"The request's chat template failed: {reply.message}", param="chat_template")


def _mark_final(message: dict[str, Any]) -> str:
    """Mark where the message to continue begins and ends, and give its text: of its last
    text part where content is given as parts (transformers continues after that one)."""
    content = message["content"]
    if isinstance(content, str):
        message["content"] = _START + content + _MARK
        return content
    if not content:
        content.append({"type": "text", "text": ""})
    last = content[-1]
    text: str = last["text"]
    content[-1] = {**last, "text": _START + text + _MARK}
    return text


def _names_developer(source: str) -> bool:
    """Whether the template knows OpenAI's `developer` role (vLLM's test)."""
    return '"developer"' in source or "'developer'" in source


def _as_system(conversation: list[dict[str, Any]], parts: bool) -> list[dict[str, Any]]:
    """A template that does not know the `developer` role (OpenAI's name for system
    instructions, which its SDKs send for newer models) is given them as `system`, all
    system messages merged into a first one where they are several or not first (many
    templates take one system message, first), as vLLM does; `parts`: the merged text as
    one part, where content is given as parts (vLLM gives a string, which such a template
    walks character by character, losing the instructions)."""
    if not any(message["role"] == "developer" for message in conversation):
        return conversation
    system: list[str] = []
    rest: list[dict[str, Any]] = []
    merge = False
    for index, message in enumerate(conversation):
        if message["role"] not in ("system", "developer"):
            rest.append(message)
            continue
        merge = merge or index > 0 or bool(system)
        given = message["content"]
        text = given if isinstance(given, str) else "\n".join(p["text"] for p in given)
        if text:
            system.append(text)
    if not merge:
        return [{**conversation[0], "role": "system"}, *conversation[1:]]
    merged = "\n\n".join(system)
    content: str | list[dict[str, Any]] = [{"type": "text", "text": merged}] if parts else merged
    return [{"role": "system", "content": content}, *rest]


def _opened(rendered: str, final: str) -> str:
    """`rendered` cut where the last message's text ends (marked with `_MARK`)."""
    mark = _MARK.strip()
    at = rendered.rfind(mark)
    start = rendered.rfind(_START, 0, max(at, 0))
    if at < 0 or start < 0 or final.strip() not in rendered:
        raise OpenAIError(
            "continue_final_message is set but the final message does not appear in the "
            "chat after applying the chat template: the model's template does not print "
            "the last message as it was sent, so it cannot be continued",
            param="continue_final_message",
        )
    # A template that strips what a message ends with: so does the prompt, as transformers.
    trims = not rendered.startswith(_MARK, at)
    # The text between the marks only: an empty message keeps what precedes it.
    text = rendered[start + len(_START) : at]
    return rendered[:start] + (text.strip() if trims else text)


def _message(index: int, message: ChatMessage, parts: bool) -> dict[str, Any]:
    """One message as transformers' templates are given it; `parts`: its content as
    OpenAI's text parts (a tool's result stays a string, as vLLM gives it)."""
    content: str | list[dict[str, Any]] = message.text()
    if parts and message.role != "tool":
        content = _parts(message)
    found: dict[str, Any] = {"role": message.role, "content": content}
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
    thoughts = message.thoughts() if message.role == "assistant" else None
    if thoughts is not None:
        # vLLM gives the template both names (Qwen3's reads `reasoning_content`).
        found["reasoning"] = found["reasoning_content"] = thoughts
    return found


def _parts(message: ChatMessage) -> list[dict[str, Any]]:
    if message.content is None:
        return []
    if isinstance(message.content, str):
        return [{"type": "text", "text": message.content}]
    return [{"type": "text", "text": part.text or ""} for part in message.content]


def _arguments(text: str, param: str) -> Any:
    """A tool call's arguments, a JSON string in OpenAI's API, as the object templates
    print (empty: no arguments)."""
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # nested deeper than the parser recurses
        raise OpenAIError(f"Invalid value for '{param}': not JSON", param=param) from None
