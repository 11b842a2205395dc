"""The streamed answer of `POST /v1/chat/completions` and `POST /v1/completions`
(text.py builds the requests and the answers' identity): `text/event-stream`, one `data:`
chunk per model response with text or tokens, each choice's closing chunk, the usage
chunk when asked for, then `data: [DONE]`.

The status waits for the model's first response, so that a request the model refuses at
once is a plain JSON error; an error after the stream has begun is one `data: {"error"}`
event that ends it without `[DONE]`. With --sse-keep-alive-interval N, the status waits N
seconds at most, and an idle stream sends `: keep-alive` (keepalive.py). With `n` > 1
or a list of prompts, each choice's chunks come as they come, with its index (prompt p's
choice i is p * n + i). With --reasoning-parser or tools, a choice's text is read by its
parsers (reasoning.py, tools.py) and its chunks are their deltas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ge_serve.server.inference.types import InferRequest

from ..disconnects import until_disconnect
from . import tokenids
from .answers import Params, Piece, Usage, cached_total, pieces
from .catalog import Catalog
from .choices import Item, merged, one
from .errors import SERVER_ERROR, OpenAIError
from .keepalive import kept_alive
from .logprobs import Entry, echoed
from .objects import DONE, Answer, sse
from .reasoning import ReasoningStream
from .tools import ToolStream

log = logging.getLogger(__name__)

SSE_HEADERS = {"cache-control": "no-cache"}


async def stream(
    catalog: Catalog,
    request: Request,
    requests: list[InferRequest],
    params: Params,
    answers: list[Answer],
    n: int,
) -> Response:
    streams = [pieces(catalog.core, r, params) for r in requests]
    rest = one(streams[0]) if len(streams) == 1 else merged(streams)
    interval = catalog.tools.sse_keep_alive
    if interval > 0:
        return await _kept_alive(request, answers, n, rest, interval)
    try:
        # A client that leaves while the request waits for its first token cancels it too.
        first = await until_disconnect(request, anext(rest, None))
    except BaseException:
        await rest.aclose()
        raise
    return StreamingResponse(
        _events(answers, n, first, rest),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


async def _kept_alive(
    request: Request,
    answers: list[Answer],
    n: int,
    rest: AsyncGenerator[Item, None],
    interval: float,
) -> Response:
    """The stream with --sse-keep-alive-interval: the status waits for the first response
    `interval` seconds at most (a refusal within them is still a plain JSON error); then
    the headers and a keep-alive go out, and the stream goes on when the response comes
    (a refusal then is the stream's error event)."""
    waiting = asyncio.ensure_future(anext(rest, None))
    try:
        await until_disconnect(request, asyncio.wait((waiting,), timeout=interval))
        started = waiting.done()
        first = waiting.result() if started else None
    except BaseException:
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await waiting
        await rest.aclose()
        raise
    events = _events(answers, n, first, rest) if started else _later(answers, n, waiting, rest)
    return StreamingResponse(
        kept_alive(events, interval, idle=not started),
        media_type="text/event-stream",
        headers=SSE_HEADERS,
    )


async def _later(
    answers: list[Answer],
    n: int,
    waiting: asyncio.Future[Item | None],
    rest: AsyncGenerator[Item, None],
) -> AsyncGenerator[bytes, None]:
    """`_events` of a stream that began before its first response."""
    async with contextlib.aclosing(rest):
        try:
            first = await waiting
        except Exception as exc:
            yield _failure(answers[0], exc)
            return
        async with contextlib.aclosing(_events(answers, n, first, rest)) as events:
            async for event in events:
                yield event


@dataclass(slots=True)
class _Choice:
    """One choice of a stream: its answer (index, offsets), usage, and what it holds."""

    answer: Answer
    echo: str
    # Log probabilities of tokens whose response had no text (the EOS) go with the
    # next chunk, the closing one at the latest, as vLLM's closing chunk has its last's.
    held: list[Entry] | None
    usage: Usage = field(default_factory=Usage)
    reason: str | None = None
    # Tool calling (tools.py): the choice's text read as tool calls.
    tools: ToolStream | None = None
    # Its finish reason has been sent: by the model's last response, at the stream's
    # end, or `cut` short once a parse went past --max-tool-call-parse-bytes.
    ended: bool = False
    cut: bool = False
    # --reasoning-parser (reasoning.py): the thoughts apart, before the tools read the rest.
    reasoning: ReasoningStream | None = None


async def _events(
    answers: list[Answer], n: int, first: Item | None, rest: AsyncGenerator[Item, None]
) -> AsyncGenerator[bytes, None]:
    """The chunks of `answers` (one per sequence: prompt p's choice i is p * n + i)."""
    answer = answers[0]
    logprobs = bool(answer.logprobs)
    # vLLM's completions send the echoed prompt with each choice's first piece of text; a
    # chunk's continuous usage is its own choice's, as vLLM's.
    choices = [
        _Choice(a, "" if a.chat else a.echo, [] if logprobs else None, _usage(a)) for a in answers
    ]
    if answer.tools is not None:
        for choice in choices:
            choice.tools = answer.tools.stream()
    if answer.reasoning is not None:
        for choice in choices:
            choice.reasoning = answer.reasoning.stream()
    running = len(choices)
    async with contextlib.aclosing(rest):
        # vLLM's chat opens each choice with the role, then each with the echoed message,
        # on chunks of their own that count the prompt and nothing generated yet.
        if answer.chat:
            prompt_tokens = first[1].prompt_tokens if first and first[1] else None
            opening = Usage(prompt_tokens or 0, thoughts=tokenids.thoughts(answer.tags))
            opening.cached_tokens = first[1].cached_tokens if first and first[1] else None
            for choice in choices:
                yield choice.answer.chunk("", first=True, usage=opening)
            for choice in choices if answer.echo else ():
                yield choice.answer.chunk(answer.echo, usage=opening)
        try:
            item = first
            while item is not None:
                choice = choices[item[0]]
                piece = item[1]
                if answer.log is not None and piece is not None:
                    answer.log.piece(item[0], piece.text, piece.finish_reason)
                if piece is None:
                    running -= not choice.cut
                    if choice.echo and not choice.ended:  # no response at all
                        yield choice.answer.chunk(choice.echo, usage=choice.usage)
                    for chunk in () if choice.ended else _closing(choice):
                        yield chunk
                elif choice.ended:
                    if not choice.cut:  # a response after the last (counts, say)
                        choice.usage.add(piece)
                else:
                    for chunk in _delta(choice, piece, answer.echo_only):
                        yield chunk
                    running -= choice.cut  # cut short just now
                if not running:
                    break  # all ended; one cut short (tools' limit) is cancelled so
                item = await anext(rest, None)
        except Exception as exc:
            yield _failure(answer, exc)
            return
    if answer.log is not None:
        answer.log.complete()
    if answer.include_usage:
        # vLLM's: each prompt counted once, every choice's generated tokens summed.
        total = Usage(sum(choice.usage.prompt_tokens for choice in choices[::n]))
        total.completion_tokens = sum(choice.usage.completion_tokens for choice in choices)
        total.thoughts = tokenids.summed([choice.usage.thoughts for choice in choices])
        total.cached_tokens = cached_total([choice.usage for choice in choices[::n]])
        yield answer.usage_chunk(total)
    yield DONE


def _failure(answer: Answer, exc: Exception) -> bytes:
    """The error event that ends a stream that failed after it began."""
    if not isinstance(exc, OpenAIError):
        log.exception("the stream of %s failed", answer.id)
        exc = OpenAIError(f"internal error: {exc}", status=500, kind=SERVER_ERROR)
    return sse(exc.body())


def _usage(answer: Answer) -> Usage:
    """A streamed choice's usage: its ids where chunks carry them, its thoughts' count."""
    ids: list[int] | None = [] if answer.token_ids else None
    return Usage(token_ids=ids, thoughts=tokenids.thoughts(answer.tags))


def _delta(choice: _Choice, piece: Piece, echo_only: bool) -> list[bytes]:
    """The chunks of a choice's piece: its text (after the echo, unless only the echo is
    shown), with the log probabilities held so far; none where it has neither text nor
    tokens (a piece of tokens whose text is held back is a chunk of "", as vLLM's). With
    tools, the deltas its text makes (tools.py), and the closing chunk where the parse
    went past its limit (Triton's: finish_reason "length", the model cancelled). The
    model's last response (it has the finish reason) closes the choice with its own
    text, as vLLM's last chunk carries the last token's text and the finish reason."""
    choice.usage.add(piece)
    choice.reason = piece.finish_reason or choice.reason
    last = piece.finish_reason is not None
    if choice.held is not None:
        if choice.echo and piece.prompt_logprobs is not None:  # vLLM's: on the echo's chunk
            first = choice.answer.echo_id, choice.answer.echo_first
            choice.held += echoed(choice.echo, piece.prompt_logprobs, *first)
        choice.held += () if echo_only else piece.logprobs or ()
    if choice.reasoning is not None:
        deltas = _read(choice, choice.reasoning.feed(piece.text))
        if choice.tools is not None and choice.tools.truncated:
            return _cut(choice)
        if last:
            return _closing(choice, deltas)
        return _parsed(choice, deltas)
    if choice.tools is not None:
        deltas = choice.tools.feed(piece.text)
        if choice.tools.truncated:
            return _cut(choice)
        if last:
            return _closing(choice, deltas)
        return _parsed(choice, deltas)
    text = choice.echo + ("" if echo_only else piece.text)
    choice.echo = "" if text else choice.echo
    if last:
        return _closing(choice, text=text)
    if not text and not piece.completion_tokens:
        return []  # vLLM's: a chunk for every output with tokens, its text held or not
    chunk = choice.answer.chunk(text, usage=choice.usage, entries=choice.held)
    choice.held = [] if choice.held is not None else None
    return [chunk]


def _parsed(choice: _Choice, deltas: list[dict[str, Any]]) -> list[bytes]:
    """The chunks of a piece's parsed deltas, its logprobs on the first; where its text
    is held, an empty delta with them (or its ids), as vLLM sends a chunk for every
    output where logprobs or `return_token_ids` are asked (and none where neither is)."""
    if not deltas and (choice.held or choice.answer.unsent_ids(choice.usage)):
        deltas = [{}]
    chunks = []
    for d in deltas:
        chunks.append(choice.answer.chunk(None, usage=choice.usage, entries=choice.held, delta=d))
        choice.held = [] if choice.held is not None else None
    return chunks


def _cut(choice: _Choice) -> list[bytes]:
    """The tools' parse went past its limit: the choice ends "length" here."""
    choice.reason, choice.cut = "length", True
    return _closing(choice)


def _read(choice: _Choice, parts: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The deltas of a choice's reasoning parts: the content's read by its tools."""
    if choice.tools is None:
        return list(parts)
    deltas: list[dict[str, Any]] = []
    for part in parts:
        if "content" in part:
            deltas += choice.tools.feed(part["content"])
        else:
            deltas.append(part)
    return deltas


def _closing(
    choice: _Choice, deltas: list[dict[str, Any]] | None = None, text: str | None = None
) -> list[bytes]:
    """A choice's last chunks: the last response's `deltas` (or `text`), what its thoughts
    and tool calls hold back, the last with the finish reason (and vLLM's `stop_reason`)
    and the log probabilities held (an empty delta, or text "", where nothing is left)."""
    reason, pending = choice.reason or "stop", list(deltas or ())
    if choice.reasoning is not None:
        pending += _read(choice, choice.reasoning.finish())
    if choice.tools is not None:
        pending += choice.tools.finish()
        if choice.answer.tools is not None:
            reason = choice.answer.tools.finish_reason(reason, choice.tools.calls)
    choice.ended = True
    answer, usage = choice.answer, choice.usage
    ending = pending.pop() if pending else None
    chunks = [answer.chunk(None, usage=usage, delta=d) for d in pending]
    if text is None and not answer.chat:
        text = ""
    closing = answer.chunk(
        text,
        finish_reason=reason,
        usage=usage,
        entries=choice.held if text else choice.held or None,
        delta=ending,
        stop_reason=usage.stop_reason,
    )
    return [*chunks, closing]
