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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ge_serve.backends.base import TextGeneration
from ge_serve.server.inference.model import ModelVersion
from ge_serve.server.inference.types import InferRequest

from ..disconnects import until_disconnect
from .catalog import Catalog, text_generation
from .errors import CONTEXT_LENGTH_EXCEEDED, SERVER_ERROR, OpenAIError
from .generation import Params, Piece, Usage, build_request, collect, pieces
from .logprobs import Entry, Logprobs
from .objects import DONE, Answer, sse
from .schemas import ChatCompletionRequest, CompletionRequest, Sampling
from .template import render_request

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
    _check_limit(body.token_limit(), generation.max_model_len)
    prompt = await chat_prompt(generation, body)
    answer = _identity(request, body, chat=True, role=body.answer_role(), echo=body.echoed())
    count = body.logprob_count()
    as_ids = bool(body.return_tokens_as_token_ids)
    answer.logprobs = None if count is None else Logprobs(True, count, as_ids)
    return await _answer(catalog, request, model, body, prompt, answer)


async def completion(catalog: Catalog, request: Request, body: CompletionRequest) -> Response:
    model = catalog.generative(body.model)
    generation = text_generation(model)
    if generation is not None:
        _check_limit(body.token_limit(), generation.max_model_len)
    prompt = body.text()
    answer = _identity(request, body, chat=False, echo=prompt if body.echo else "")
    answer.echo_only = body.echo_only()
    as_ids = bool(body.return_tokens_as_token_ids)
    answer.logprobs = None if body.logprobs is None else Logprobs(False, body.logprobs, as_ids)
    return await _answer(catalog, request, model, body, prompt, answer)


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


def _check_limit(limit: int | None, max_model_len: int) -> None:
    """The client's `max_tokens` (a default it did not set is the model's to refuse)."""
    if limit is not None and max_model_len > 0 and limit >= max_model_len:
        raise OpenAIError(
            f"max_tokens is too large: {limit}. This model's context is {max_model_len} "
            "tokens, prompt included",
            param="max_tokens",
            code=CONTEXT_LENGTH_EXCEEDED,
        )


async def _answer(
    catalog: Catalog,
    request: Request,
    model: ModelVersion,
    body: Sampling,
    prompt: str,
    answer: Answer,
) -> Response:
    stream = bool(body.stream)
    infer_request, sent = build_request(
        model, prompt, stream, body.sampling(), body.default_max_tokens
    )
    params = Params("messages" if answer.chat else "prompt", sent)
    if not stream:
        text, reason, usage, entries = await until_disconnect(
            request, collect(catalog.core, infer_request, params)
        )
        return Response(
            orjson.dumps(answer.whole(text, reason, usage, entries)),
            media_type="application/json",
        )
    return await _stream(catalog, request, infer_request, params, answer)


async def _stream(
    catalog: Catalog,
    request: Request,
    infer_request: InferRequest,
    params: Params,
    answer: Answer,
) -> Response:
    rest = pieces(catalog.core, infer_request, params)
    try:
        # A client that leaves while the request waits for its first token cancels it too.
        first = await until_disconnect(request, anext(rest, None))
    except BaseException:
        await rest.aclose()
        raise
    return StreamingResponse(
        _events(answer, first, rest), media_type="text/event-stream", headers=SSE_HEADERS
    )


async def _events(
    answer: Answer, first: Piece | None, rest: AsyncGenerator[Piece, None]
) -> AsyncIterator[bytes]:
    usage = Usage()
    reason: str | None = None
    async with contextlib.aclosing(rest):
        # vLLM's chat opens with the role, then the echoed message, on chunks of their own
        # that count the prompt and nothing generated yet; its completions send the
        # echoed prompt with the first piece of text, on one chunk that counts it.
        echo = answer.echo
        if answer.chat:
            opening = Usage(first.prompt_tokens or 0) if first else usage
            yield answer.chunk("", first=True, usage=opening)
            if echo:
                yield answer.chunk(echo, usage=opening)
            echo = ""
        # Log probabilities of tokens whose response had no text (the EOS) go with the
        # next chunk, the closing one at the latest, as vLLM's closing chunk has its last's.
        held: list[Entry] | None = [] if answer.logprobs else None
        try:
            piece = first
            while piece is not None:
                usage.add(piece)
                reason = piece.finish_reason or reason
                text = echo + ("" if answer.echo_only else piece.text)
                if held is not None:
                    held += piece.logprobs or ()
                if text:
                    yield answer.chunk(text, usage=usage, entries=held)
                    echo = ""
                    held = [] if held is not None else None
                piece = await anext(rest, None)
            if echo:  # the model answered with no response at all
                yield answer.chunk(echo, usage=usage)
        except OpenAIError as exc:
            yield sse(exc.body())
            return
        except Exception as exc:
            log.exception("the stream of %s failed", answer.id)
            yield sse(OpenAIError(f"internal error: {exc}", status=500, kind=SERVER_ERROR).body())
            return
    yield answer.chunk(
        None if answer.chat else "",
        finish_reason=reason or "stop",
        usage=usage,
        entries=held or None,
    )
    if answer.include_usage:
        yield answer.usage_chunk(usage)
    yield DONE
