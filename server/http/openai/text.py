"""`POST /v1/chat/completions` and `POST /v1/completions`.

Both check the body, find the generative model, build its prompt (chat renders the
messages with the model's chat template; a model without one is a 400 that points to
/v1/completions) and run it through the core.

Not streamed, the answer waits for the model's last response; a client that leaves
before then cancels the request. Streamed, the status waits for the model's first
response, so that a request the model refuses at once (a prompt longer than its context)
is a plain JSON error with its status; after that the answer is `text/event-stream`, one
`data:` chunk per text delta, a last chunk with the finish reason, the usage chunk when
asked for, then `data: [DONE]`. An error after the stream has begun is one event,
`data: {"error": {...}}`, and the stream ends there, without `[DONE]`. A client that
goes away cancels the request, before its first token as after.

With `n` > 1 (choices.py), the n generations run together: not streamed, one answer with
n choices; streamed, each choice's chunks as they come, with its index, each choice's
closing chunk when it ends, and the usage chunk once, after all. A completions request
with a list of prompts (prompts.py) runs each prompt n times the same way, all together:
prompt p's choice i is index p * n + i, as vLLM's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ge_serve.backends.base import TextGeneration
from ge_serve.server.inference.model import ModelVersion
from ge_serve.server.inference.types import InferRequest

from ..disconnects import until_disconnect
from . import reasoning, structured, tokenids
from .catalog import Catalog, text_generation
from .choices import Item, all_of, merged, one, seeded
from .errors import CONTEXT_LENGTH_EXCEEDED, SERVER_ERROR, OpenAIError
from .generation import (
    Array,
    Params,
    Piece,
    Usage,
    after_thoughts,
    build_request,
    collect,
    ids_array,
    ids_input,
    pieces,
    takes_constraints,
)
from .logprobs import Entry, Logprobs, echoed
from .objects import DONE, Answer, sse
from .prompts import IDS_INLINE, THREADED, Prompt, check_fit, echo_texts
from .reasoning import ReasoningStream
from .schemas import ChatCompletionRequest, CompletionRequest, Sampling
from .template import render_request, variables
from .tools import ToolStream, plan, template_tools

log = logging.getLogger(__name__)

SSE_HEADERS = {"cache-control": "no-cache"}
# Conversations longer than this are rendered off the event loop's thread.
RENDERED_ON_THE_LOOP = 64


async def chat_completion(
    catalog: Catalog, request: Request, body: ChatCompletionRequest
) -> Response:
    model = catalog.generative(body.model)
    generation = text_generation(model)
    if generation is None or generation.chat_template is None:
        raise no_chat_template(body.model)
    check_limit(body.token_limit(), generation.max_model_len)
    chosen, parallel = body.chosen_tool(), body.parallel_tool_calls
    constrained = takes_constraints(model.inputs)
    tool_use = plan(chosen, catalog.tools, constrained, body.model, parallel)
    prompt = await chat_prompt(generation, body, template_tools(body.tools))
    answer = _identity(request, body, chat=True, role=body.answer_role(), echo=body.echoed())
    answer.tools = tool_use
    count = body.logprob_count()
    as_ids = bool(body.return_tokens_as_token_ids)
    answer.logprobs = None if count is None else Logprobs(True, count, as_ids)
    if catalog.tools.reasoning_parser:
        field = _constrained(body, chosen)
        answer.reasoning = reasoning.plan(
            catalog.tools.reasoning_parser, body.include_reasoning, variables(body), prompt, field
        )
        if field is not None and answer.reasoning is not None and answer.reasoning.after:
            after_thoughts(model, field)
        if answer.reasoning is not None and not answer.reasoning.include:
            answer.logprobs = None  # vLLM's: hidden thoughts hide the tokens' logprobs too
        answer.tags = tokenids.tags(model, answer.reasoning)
    ids = await tokenids.prompt_ids(model, body.return_token_ids, [prompt])
    return await _answer(catalog, request, model, body, [prompt], answer, ids=ids)


async def completion(catalog: Catalog, request: Request, body: CompletionRequest) -> Response:
    model = catalog.generative(body.model)
    generation = text_generation(model)
    if generation is not None:
        check_limit(body.token_limit(), generation.max_model_len)
    prompts = body.prompts()
    if not isinstance(prompts[0], str):
        ids_input(model)  # its refusal before echo's need of a tokenizer
        if generation is not None:
            check_fit(prompts, generation.max_model_len)
    echoes = await echo_texts(model, prompts) if body.echo else None
    answer = _identity(request, body, chat=False, echo=echoes[0] if echoes else "")
    answer.echo_only = body.echo_only()
    as_ids = bool(body.return_tokens_as_token_ids)
    answer.logprobs = None if body.logprobs is None else Logprobs(False, body.logprobs, as_ids)
    firsts = None
    if echoes and as_ids and answer.logprobs is not None:
        firsts = [await _first_id(generation, p) for p in prompts]
        answer.echo_id = firsts[0]
    ids = await tokenids.prompt_ids(model, body.return_token_ids, prompts)
    return await _answer(catalog, request, model, body, prompts, answer, echoes, firsts, ids)


async def _as_sent(model: ModelVersion, prompts: list[Prompt]) -> list[str | Array]:
    """Each prompt as its requests carry it: a text, or its ids as one array in the dtype
    of the model's `input_ids`, shared by the prompt's n requests (many ids: converted on
    a worker thread)."""
    if all(isinstance(prompt, str) for prompt in prompts):
        return prompts  # type: ignore[return-value]

    def converted() -> list[str | Array]:
        return [p if isinstance(p, str) else ids_array(model, p) for p in prompts]

    if sum(len(p) for p in prompts if isinstance(p, list)) > IDS_INLINE:
        return await asyncio.to_thread(converted)
    return converted()


async def _first_id(generation: TextGeneration | None, prompt: Prompt) -> int | None:
    """The prompt's first token id (vLLM's `token_id:<id>` of the echo's first token):
    a text's by the model's tokenizer, as the model tokenizes it; None without one."""
    if not isinstance(prompt, str):
        return prompt[0]
    tokenizer = None if generation is None else generation.tokenizer
    if tokenizer is None:
        return None
    if len(prompt) > THREADED:
        ids = await asyncio.to_thread(tokenizer.encode, prompt)
    else:
        ids = tokenizer.encode(prompt)
    return ids[0] if ids else None


async def chat_prompt(
    generation: TextGeneration,
    body: ChatCompletionRequest,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The chat's prompt (template.render_request, for a model with a chat template),
    rendered off the loop when long."""
    if len(body.messages) > RENDERED_ON_THE_LOOP:
        # A template walks every message in Python: seconds for a million of them.
        return await asyncio.to_thread(render_request, generation, body, tools)
    return render_request(generation, body, tools)


def _constrained(body: ChatCompletionRequest, chosen: Any) -> str | None:
    """The field whose structured outputs constrain the answer, if one does."""
    if structured.KEY not in body.sampling():
        return None
    if chosen == "required" or isinstance(chosen, dict):
        return "tool_choice"
    return "response_format" if body.response_format is not None else "structured_outputs"


def no_chat_template(name: str) -> OpenAIError:
    return OpenAIError(
        f"The model '{name}' has no chat template: use /v1/completions with a "
        "prompt, or give the model one (the llm backend's `chat_template` parameter, "
        "or `chat_template_source` for another backend's model)",
        param="model",
        code="chat_template_missing",
    )


def _identity(
    request: Request, body: Sampling, *, chat: bool, role: str = "assistant", echo: str = ""
) -> Answer:
    stream = bool(body.stream)
    return Answer(
        body.model,
        chat,
        include_usage=stream and body.include_usage(),
        continuous_usage=stream and body.continuous_usage(),
        role=role,
        echo=echo,
        id=request_id(request, body.request_id),
    )


def request_id(request: Request, given: str | None) -> str:
    """vLLM's: the `X-Request-Id` header (a gateway's trace id), else the body's
    `request_id`; empty where neither is given (the answer gets a fresh one)."""
    return request.headers.get("x-request-id") or given or ""


def check_limit(limit: int | None, max_model_len: int, param: str = "max_tokens") -> None:
    """The client's token limit, `param` (a default it did not set is the model's to
    refuse)."""
    if limit is not None and max_model_len > 0 and limit >= max_model_len:
        raise OpenAIError(
            f"{param} is too large: {limit}. This model's context is {max_model_len} "
            "tokens, prompt included",
            param=param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )


async def _answer(
    catalog: Catalog,
    request: Request,
    model: ModelVersion,
    body: Sampling,
    prompts: list[Prompt],
    answer: Answer,
    echoes: list[str] | None = None,
    firsts: list[int | None] | None = None,
    ids: list[list[int]] | None = None,
) -> Response:
    """The answer to `prompts` (a completions list; chat's one), each generated n times:
    prompt p's choice i is sequence p * n + i (vLLM's order), each a request of its own.
    `ids`: each prompt's token ids, where `return_token_ids` asks for them."""
    if ids is not None:
        answer.token_ids, answer.prompt_ids = True, ids[0]
    stream = bool(body.stream)
    given = body.sampling()
    if answer.reasoning is not None and answer.reasoning.after is not None:
        given[structured.AFTER] = answer.reasoning.after  # the grammar after the thoughts
    n = body.n or 1
    requests: list[InferRequest] = []
    for prompt in await _as_sent(model, prompts):
        for values in seeded(given, n) if n > 1 else [given]:
            infer_request, sent = build_request(
                model, prompt, stream, values, body.default_max_tokens
            )
            requests.append(infer_request)
    reads_ids = answer.token_ids or (answer.tags is not None and answer.tags.counted)
    params = Params("messages" if answer.chat else "prompt", sent, reads_ids)
    answers = [answer]
    if len(requests) > 1:
        answers = [
            answer.choice(
                k,
                None if echoes is None else echoes[k // n],
                None if firsts is None else firsts[k // n],
                None if ids is None else ids[k // n],
            )
            for k in range(len(requests))
        ]
    if stream:
        return await _stream(catalog, request, requests, params, answers, n)
    if len(requests) == 1:
        text, reason, usage, entries = await until_disconnect(
            request, collect(catalog.core, requests[0], params, tokenids.thoughts(answer.tags))
        )
        body_json = answer.whole(text, reason, usage, entries)
    else:
        # vLLM's: each prompt counted once, the choices' generated tokens summed.
        counts = [tokenids.thoughts(answer.tags) for _ in requests]
        pairs = zip(requests, counts, strict=True)
        results = await until_disconnect(
            request, all_of([collect(catalog.core, r, params, c) for r, c in pairs])
        )
        total = Usage(sum(results[k][2].prompt_tokens for k in range(0, len(results), n)))
        total.thoughts = tokenids.summed(counts)
        choices = []
        for choice, (text, reason, usage, entries) in zip(answers, results, strict=True):
            total.completion_tokens += usage.completion_tokens
            found, stop = usage.prompt_logprobs, usage.stop_reason
            choices.append(choice.whole_choice(text, reason, entries, found, stop, usage.token_ids))
            total.prompt_logprobs = found
        body_json = answer.whole_of(choices, total)
    return Response(orjson.dumps(body_json), media_type="application/json")


async def _stream(
    catalog: Catalog,
    request: Request,
    requests: list[InferRequest],
    params: Params,
    answers: list[Answer],
    n: int,
) -> Response:
    streams = [pieces(catalog.core, r, params) for r in requests]
    rest = one(streams[0]) if len(streams) == 1 else merged(streams)
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
) -> AsyncIterator[bytes]:
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
            for choice in choices:
                yield choice.answer.chunk("", first=True, usage=opening)
            for choice in choices if answer.echo else ():
                yield choice.answer.chunk(answer.echo, usage=opening)
        try:
            item = first
            while item is not None:
                choice = choices[item[0]]
                piece = item[1]
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
        except OpenAIError as exc:
            yield sse(exc.body())
            return
        except Exception as exc:
            log.exception("the stream of %s failed", answer.id)
            yield sse(OpenAIError(f"internal error: {exc}", status=500, kind=SERVER_ERROR).body())
            return
    if answer.include_usage:
        # vLLM's: each prompt counted once, every choice's generated tokens summed.
        total = Usage(sum(choice.usage.prompt_tokens for choice in choices[::n]))
        total.completion_tokens = sum(choice.usage.completion_tokens for choice in choices)
        total.thoughts = tokenids.summed([choice.usage.thoughts for choice in choices])
        yield answer.usage_chunk(total)
    yield DONE


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
            choice.held += echoed(choice.echo, piece.prompt_logprobs, choice.answer.echo_id)
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
    is held, an empty delta with them, as vLLM sends a chunk for every output where
    logprobs are asked (and none where they are not)."""
    if not deltas and choice.held:
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
