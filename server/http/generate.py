"""Triton's generate extension: `POST /v2/models/{m}[/versions/{v}]/generate` and
`/generate_stream`, for any model, decoupled or not.

Both endpoints take the same flat JSON object and answer with the same flat JSON objects
(generate_codec.py maps them). The request runs through `InferenceServer.infer_responses`,
the path gRPC's ModelStreamInfer takes, so a decoupled model's responses come out as the
model sends them, and statistics, cancellation and the model's own scheduler are those of
every other request.

- `/generate` answers with exactly one JSON object. Like Triton, it serves a decoupled
  model too, as long as the model sends exactly one response; zero or several are
  refused with Triton's message (Triton sends it with the 200 of a reply it has already
  started; here the answer waits for the outcome, so the status says it: 400, and a
  second response ends the request at once rather than after the model is done).
- `/generate_stream` answers with Server-Sent Events (`text/event-stream`), one `data:`
  event per response; a model that is not decoupled gives one. The status is decided by
  the first outcome: a request that fails before it runs (unknown model, a bad or missing
  input) is an `application/json` error with its status, as on every endpoint; a model
  whose first answer is an error gives that status with the error as its first event (as
  Triton does, the stream goes on with the model's later responses). Once the stream has
  begun, its status is 200, and an error is an event of its own, `data: {"error": "..."}`;
  a decoupled model's error response is followed by its later responses, as on Triton,
  while an error of the request as a whole (a failed execution) ends the stream.

On both, a client that goes away cancels the request, before its first response as
after (a model that asks `is_cancelled()` learns it, a generative model stops).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from ..errors import ErrorCode, FailureReason, ServerError, decoding, internal
from ..inference.types import InferRequest, InferResponse
from .bodies import GenerateRequestBody
from .disconnects import CLIENT_GONE, ClientGone, until_disconnect
from .errors import http_status
from .generate_codec import (
    EXACTLY_ONE,
    SSE_CONTENT_TYPE,
    decode_generate_request,
    encode_generate_response,
    error_json,
    sse_event,
)
from .openapi import Body
from .routing import RouteHost

log = logging.getLogger(__name__)

_BODY = Body(GenerateRequestBody, required=False)


def routes(front: RouteHost, max_input_size: int) -> list[Route]:
    """The generate routes; `max_input_size` bounds the tensors a request expands to."""
    core = front.core

    async def decode(request: Request) -> InferRequest:
        params = request.path_params
        model, version = str(params["model"]), str(params.get("version", ""))
        body = await front.read_body(request)
        inputs = core.model_metadata(model, version).inputs
        with decoding("generate request"):
            return decode_generate_request(model, version, body, inputs, max_input_size)

    async def generate(request: Request) -> Response:
        infer_request = await decode(request)
        try:
            found = await until_disconnect(request, _only(core.infer_responses(infer_request)))
        except ClientGone:
            return Response(status_code=CLIENT_GONE)
        return Response(encode_generate_response(found), media_type="application/json")

    async def generate_stream(request: Request) -> Response:
        infer_request = await decode(request)
        responses = core.infer_responses(infer_request, errors_inline=True)
        status, first = 200, b""
        try:
            # Until the first response, nothing is sent that would tell a client gone away.
            response = await until_disconnect(request, anext(responses, None))
        except ClientGone:
            await responses.aclose()
            return Response(status_code=CLIENT_GONE)
        except ServerError as exc:
            if exc.reason is not FailureReason.BACKEND:
                raise
            # The model's own answer was the error: Triton streams it, with its status.
            status, first = http_status(exc), _error_event(exc)
        except BaseException:
            await responses.aclose()
            raise
        else:
            if response is not None:
                status, first = _status_and_event(response)
        return StreamingResponse(
            _events(first, responses), status_code=status, media_type=SSE_CONTENT_TYPE
        )

    return [
        *front.versioned("/generate", generate, ["POST"], _BODY),
        *front.versioned("/generate_stream", generate_stream, ["POST"], _BODY),
    ]


async def _only(responses: AsyncGenerator[InferResponse, None]) -> InferResponse:
    """The one response `/generate` answers with; none, or a second, is Triton's error."""
    found: InferResponse | None = None
    async with contextlib.aclosing(responses):
        async for response in responses:
            if found is not None:
                raise ServerError(ErrorCode.INVALID_ARG, EXACTLY_ONE)
            found = response
    if found is None:
        raise ServerError(ErrorCode.INVALID_ARG, EXACTLY_ONE)
    return found


async def _events(first: bytes, rest: AsyncGenerator[InferResponse, None]) -> AsyncIterator[bytes]:
    """The stream's events after its status is sent: the first, then one per response,
    until the model's final flag or an error of the request as a whole. Closing this (the
    client went away) closes `rest`, which cancels the request."""
    async with contextlib.aclosing(rest):
        if first:
            yield first
        try:
            async for response in rest:
                yield _event(response)
        except ServerError as exc:
            yield _error_event(exc)
        except Exception as exc:
            log.exception("generate_stream: the request failed")
            yield sse_event(error_json(internal(exc, escaped=True).message))


def _event(response: InferResponse) -> bytes:
    return _status_and_event(response)[1]


def _status_and_event(response: InferResponse) -> tuple[int, bytes]:
    """A response's event, and the status it would give as the first: a model's error
    response, or one that JSON cannot carry, is an error event with the error's status."""
    error = response.error
    if error is None:
        try:
            return 200, sse_event(encode_generate_response(response))
        except ServerError as exc:
            error = exc
    return http_status(error), _error_event(error)


def _error_event(exc: ServerError) -> bytes:
    return sse_event(error_json(exc.message))
