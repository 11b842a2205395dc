"""`POST /v1/responses`, served on the chat path: the body becomes a chat request
(responses.py), rendered with the model's chat template, its tools and structured
outputs as chat's, and its answer becomes a response (responses_objects.py) or, streamed,
its events (responses_stream.py).

Tools: a named function and "required" are constrained by structured outputs, as on
chat; "auto" is parsed by --tool-call-parser where the server has one, else (as vLLM's
Responses API without a parser) the answer is text, the tools still given to the
template: the Responses API's `tool_choice` is "auto" unless set, so refusing it would
refuse every client that sends tools.

Streamed, the status waits for the model's first response, as chat's does, so a request
the model refuses at once is a plain JSON error. A client that leaves cancels the request.
`GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` are vLLM's routes, whose
store is off by default: a 404 in vLLM's words.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from . import tokenids
from .answers import Piece, Usage
from .catalog import Catalog
from .chatpath import Route, first_piece, prepare, whole
from .errors import SERVER_ERROR, OpenAIError
from .reasoning import Reasoning
from .responses import ResponsesRequest, renamed
from .responses_objects import Identity
from .responses_stream import Events
from .text import request_id
from .textstream import SSE_HEADERS
from .tokenids import Thoughts
from .tools import ToolStream, ToolUse

log = logging.getLogger(__name__)


ROUTE = Route("Responses API", "max_output_tokens", "input", renamed, details=True)


async def create(catalog: Catalog, request: Request, body: ResponsesRequest) -> Response:
    chat = body.chat()
    stream = bool(body.stream)
    has_format = body.text is not None and body.text.format is not None
    route = replace(ROUTE, include_reasoning=body.include_reasoning)
    identity = Identity(body, request_id(request, body.request_id))
    planned = await prepare(
        catalog, request, chat, route, model=body.model, limit=body.max_output_tokens,
        stream=stream, output_field="text" if has_format else "structured_outputs",
        priority=chat.priority, answer_id=identity.id,
    )  # fmt: skip
    # The answer echoes the model that serves it, named or not.
    body = identity.body = body.model_copy(update={"model": planned.name})
    if body.logprobs_asked():
        identity.top_logprobs = body.top_logprobs or 0
        identity.as_ids = catalog.tools.tokens_as_ids
    if not stream:
        text, reason, usage, entries = await whole(catalog, request, planned)
        status = "incomplete" if reason == "length" else "completed"
        output = identity.output(text, reason, planned.tools, entries, planned.thinking)
        answer = identity.response(status, output, usage)
        return Response(orjson.dumps(answer), media_type="application/json")
    first, rest = await first_piece(catalog, request, planned)
    thoughts = tokenids.thoughts(planned.tags)
    events = _events(Events(identity), planned.tools, first, rest, planned.thinking, thoughts)
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


async def _events(
    events: Events,
    tools: ToolUse | None,
    first: Piece | None,
    rest: AsyncGenerator[Piece, None],
    thinking: Reasoning | None = None,
    thoughts_count: Thoughts | None = None,
) -> AsyncIterator[bytes]:
    usage = Usage(thoughts=thoughts_count)
    reason: str | None = None
    parse: ToolStream | None = tools.stream() if tools is not None else None
    thoughts = thinking.stream() if thinking is not None else None
    # Log probabilities of tokens without text (the EOS) go with the next text.
    held: list[dict[str, dict[str, object]]] = []
    for event in events.opening():
        yield event
    async with contextlib.aclosing(rest):
        try:
            piece = first
            while piece is not None:
                usage.add(piece)
                reason = piece.finish_reason or reason
                held += piece.logprobs or ()
                parts = [{"content": piece.text}] if thoughts is None else thoughts.feed(piece.text)
                for event in _parts(events, parts, parse, held):
                    yield event
                if parse is not None and parse.truncated:
                    reason = "length"  # past --max-tool-call-parse-bytes, as chat
                    break
                if parse is not None:
                    held = []  # tool calls carry no logprobs
                piece = await anext(rest, None)
            if thoughts is not None:
                for event in _parts(events, thoughts.finish(), parse, []):
                    yield event
            if parse is not None and not parse.truncated:
                for delta in parse.finish():
                    for event in events.tool_delta(delta):
                        yield event
        except OpenAIError as exc:
            yield events.error(renamed(exc))
            return
        except Exception as exc:
            log.exception("the stream of %s failed", events.identity.id)
            yield events.error(OpenAIError(f"internal error: {exc}", status=500, kind=SERVER_ERROR))
            return
    if held and events.open == "message":
        events.logprobs += events.identity.logprobs(held) or []
    for event in events.closing(reason or "stop", usage):
        yield event


def _parts(
    events: Events,
    parts: list[dict[str, str]],
    parse: ToolStream | None,
    held: list[dict[str, dict[str, object]]],
) -> list[bytes]:
    """The events of a piece's thoughts and content (the content read for tool calls)."""
    found: list[bytes] = []
    for part in parts:
        if "reasoning" in part:
            found += events.reasoning(part["reasoning"])
        elif parse is not None:
            for delta in parse.feed(part["content"]):
                found += events.tool_delta(delta)
        elif part["content"]:
            found += events.content(part["content"], held)
            held.clear()  # the logprobs held so far go with the first text
    return found
