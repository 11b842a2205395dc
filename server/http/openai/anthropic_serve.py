"""`POST /v1/messages` and `POST /v1/messages/count_tokens`, served on the chat path: the
body becomes a chat request (anthropic.py), rendered with the model's chat template, its
tools, thoughts and stop strings as chat's, and its answer becomes Anthropic's message or,
streamed, its events (anthropic_stream.py).

The message, as vLLM 0.34's messages_full_converter shapes it: {id "msg_...", type
"message", role "assistant", model, content, stop_reason, stop_sequence, usage
{input_tokens, output_tokens}} (with --enable-prompt-tokens-details, vLLM's
`cache_read_input_tokens` too: the prompt's cached tokens, out of `input_tokens`);
content is a `thinking` block {thinking, signature} where --reasoning-parser splits
thoughts, a `text` block, then `tool_use` blocks {id, name, input}; an empty answer is
one empty text block (streamed, no block: vLLM's answers differ so too). stop_reason is
vLLM's: "max_tokens" where the limit cut the answer, "tool_use" where it has calls,
"stop_sequence" (with the string in stop_sequence) where a stop string ended it, else
"end_turn".

Tools: "auto" without --tool-call-parser answers text, the tools still given to the
template, as /v1/responses (clients such as Claude Code send tools with every request).
A client that leaves cancels the request. count_tokens renders the conversation as the
chat route renders it and counts its tokens with the model's tokenizer (the `llm`
backend's): {input_tokens}.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .anthropic import CountTokensRequest, MessagesRequest, renamed
from .anthropic_stream import Events, calls_complete, stop_reason, tool_input, usage_json
from .catalog import Catalog
from .chatpath import Route, first_piece, prepare, whole
from .prompts import THREADED
from .reasoning import Reasoning
from .schemas import ChatCompletionRequest
from .text import chat_prompt, request_id
from .textstream import SSE_HEADERS
from .tokenize import tokenizer_of
from .toolparse import Call
from .tools import ToolUse, template_tools

API = "Messages API"


ROUTE = Route(API, "max_tokens", "messages", renamed)


async def create(
    catalog: Catalog, request: Request, body: MessagesRequest, chat: ChatCompletionRequest
) -> Response:
    """The answer to `body`, whose chat request is `chat` (body.chat(), converted off
    the loop for a large body, routes.py)."""
    stream = bool(body.stream)
    # vLLM's Messages request has no `priority`: only the header sets it, as chat's does.
    identity = "msg_" + (request_id(request, None) or uuid.uuid4().hex)
    planned = await prepare(
        catalog, request, chat, ROUTE, model=body.model, limit=body.max_tokens,
        stream=stream, output_field="output_config", answer_id=identity,
    )  # fmt: skip
    if not stream:
        text, reason, usage, _ = await whole(catalog, request, planned)
        content, arguments = _content(text, planned.tools, planned.thinking)
        complete = calls_complete(arguments)
        stop, sequence = stop_reason(reason, usage.stop_reason, bool(arguments), complete)
        answer = {
            "id": identity,
            "type": "message",
            "role": "assistant",
            "model": planned.name,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": sequence,
            "usage": usage_json(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens),
        }
        return Response(orjson.dumps(answer), media_type="application/json")
    first, rest = await first_piece(catalog, request, planned)
    events = Events(identity, planned.name, planned.tools, planned.thinking)
    return StreamingResponse(
        events.run(first, rest), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def count_tokens(
    catalog: Catalog, body: CountTokensRequest, chat: ChatCompletionRequest
) -> dict[str, Any]:
    """The rendered prompt's count of tokens, as the chat route's prompt would count
    (`chat`: body.chat())."""
    name, _ = catalog.generator(body.model, API)
    generation, tokenizer = tokenizer_of(catalog, name)
    generation = catalog.chat_generation(name, catalog.model(name), chat.chat_template)
    prompt = await chat_prompt(
        catalog, generation, chat, template_tools(chat.tools, chat.tool_choice, catalog.tools)
    )
    # Chat's prompt is tokenized without special tokens added (the template writes them).
    if len(prompt) > THREADED:
        tokens = await asyncio.to_thread(tokenizer.encode, prompt, False)
    else:
        tokens = tokenizer.encode(prompt, False)
    return {"input_tokens": len(tokens)}


def _content(
    text: str, tools: ToolUse | None, thinking: Reasoning | None
) -> tuple[list[dict[str, Any]], list[str]]:
    """A whole answer's content blocks, and its calls' arguments as the model wrote them."""
    blocks: list[dict[str, Any]] = []
    after: str | None = text
    if thinking is not None:
        thoughts, after = thinking.split(text)
        if thoughts:
            blocks.append({"type": "thinking", "thinking": thoughts, "signature": uuid.uuid4().hex})
    calls: list[Call] = []
    if after is not None and tools is not None:
        found, calls = tools.message(after)
        after = found
    if after:
        blocks.append({"type": "text", "text": after})
    for found_call in calls:
        function = found_call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": found_call["id"],
                "name": function["name"],
                "input": tool_input(function["arguments"]),
            }
        )
    # Anthropic's shape of an empty answer: one empty text block (vLLM's).
    arguments = [found_call["function"]["arguments"] for found_call in calls]
    return blocks or [{"type": "text", "text": ""}], arguments
