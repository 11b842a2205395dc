"""The inference endpoint of the HTTP front end, and the shortcut that reaches it.

`InferEndpoint` reads the body (bounded, chunk-counted, decompressed), decodes it,
runs the request and encodes the answer (compressed as the client accepts); how it runs
is given to it (`RunInfer`): through the core in the server process, or over the link to
it from a front-end worker (server/http/worker.py), so both answer and fail alike.

The endpoint is a plain ASGI application, not a starlette request-response function: the
`Request` and `Response` objects, their header classes and the body stream's async
generator cost the event loop more than the rest of the HTTP adapter on an
overhead-bound model (py-spy, `simple` at 16 clients: starlette's response alone 13 % of
the loop's time). Its answers are the same bytes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import Awaitable, Callable
from re import Pattern
from typing import Final

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ge_serve.server.errors import ErrorCode, ServerError, decoding, internal
from ge_serve.server.inference import error_texts
from ge_serve.server.inference.header_forward import HeaderForward
from ge_serve.server.inference.types import InferRequest, InferResponse
from ge_serve.server.observability.fronttrace import FrontTrace

from . import codec, compression
from .bodies import InferRequestBody
from .errors import (
    BodyKind,
    ClosingError,
    error_response,
    http_status,
    server_error_response,
    too_large,
)
from .openapi import ApiRoute, Body
from .protocol import GONE_KEY, TASK_KEY, too_many_chunks
from .rootpath import route_path
from .routing import Endpoint

# Logged under the front end's name, as before the endpoint had a module of its own.
log = logging.getLogger("ge_serve.server.http.app")

Encoded = tuple[bytes, int | None]
# Run a request and encode its response: (request, endpoint name, encode) -> encoded.
RunInfer = Callable[[InferRequest, str, Callable[[InferResponse], Encoded]], Awaitable[Encoded]]

HEADER_LENGTH = "inference-header-content-length"
# The paths of the infer routes (for a worker's pass-on, which serves them under
# --http-restricted-api).
INFER_PATH: Final = re.compile(r"/v2/models/[^/]+(?:/versions/[^/]+)?/infer")
# The least bound on a body with binary tensor data: Triton reads Content-Length as an int
# (stoi), so a larger body is refused there too.
BINARY_BODY_BOUND: Final = error_texts.INT_MAX

# The binary tensor data extension: the body is the JSON header, then the tensors' bytes.
_INFER_BODY = Body(
    InferRequestBody,
    other_content={"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    headers=(
        {
            "name": "Inference-Header-Content-Length",
            "in": "header",
            "required": False,
            "description": "The length of the JSON header; 0: the body is the raw tensor of "
            "a single-input model.",
            "schema": {"type": "integer", "minimum": 0},
        },
        {
            "name": "Content-Encoding",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "enum": ["identity", "gzip", "deflate"]},
        },
    ),
)


class InferShortcut:
    """ASGI: inference requests go straight to their endpoint, everything else to the
    FastAPI application.

    Starlette tries every route's pattern in turn (infer is one of the last) and passes
    each request through five middleware layers (server errors, telemetry, body limit,
    exceptions, an exit stack); py-spy on `simple` at 32 clients put that at ~20 % of the
    event loop's time. The shortcut matches with the infer routes' own patterns and calls
    their own (guarded) endpoint, so answers and errors are the same, on paths with or
    without --root-path's prefix (rootpath.py). Not used with --http-restricted-api, whose
    middleware must see every request."""

    def __init__(self, app: ASGIApp, routes: list[Route]) -> None:
        self.app = app
        self._routes: list[tuple[Pattern[str], ASGIApp]] = [
            (route.path_regex, route.endpoint) for route in routes
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path = route_path(scope) if scope.get("root_path") else scope["path"]
            for pattern, endpoint in self._routes:
                match = pattern.match(path)
                if match is not None:
                    scope["path_params"] = match.groupdict()
                    await endpoint(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def guard(endpoint: Endpoint) -> Endpoint:
    """Turn core errors into `{"error": ...}` bodies; never let one escape as a 500 page.

    Handlers decode request parts under `decoding(...)`, so what goes wrong there is the
    client's 400; an unexpected exception that reaches this guard is a server fault after
    decoding: a 500, logged once with its traceback.
    """

    @functools.wraps(endpoint)
    async def guarded(request: Request) -> Response:
        try:
            return await endpoint(request)
        except ServerError as exc:
            return server_error_response(exc)
        except Exception as exc:
            log.exception("unhandled error on %s", request.url.path)
            return error_response(500, internal(exc, escaped=True).message)

    return guarded


class InferEndpoint:
    """POST .../infer, an ASGI application. `traced()` says whether to pass on the
    client's `traceparent` (the server asks its tracing; a worker always does, as only the
    server knows); `forward` adds the headers it matches to the request's parameters.
    `front_marks`: whether to trace Triton's HTTP_RECV/HTTP_SEND timestamps while
    `traced()` (in the server process; a worker's link carries no trace)."""

    def __init__(
        self,
        run: RunInfer,
        max_input_size: int,
        max_chunks: int,
        traced: Callable[[], bool],
        forward: HeaderForward | None = None,
        front_marks: bool = False,
    ) -> None:
        self.run = run
        self.max_input_size = max_input_size
        self.max_chunks = max_chunks
        self.traced = traced
        self.forward = forward
        self.front_marks = front_marks

    def routes(self) -> list[Route]:
        """POST .../infer, with and without `/versions/{version}` (starlette serves an
        endpoint that is not a function as the ASGI application it is)."""
        return [
            ApiRoute(path, self, methods=["POST"], body=_INFER_BODY)
            for path in (
                "/v2/models/{model}/infer",
                "/v2/models/{model}/versions/{version}/infer",
            )
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        traced = self.traced()
        front = FrontTrace("HTTP_RECV_START") if traced and self.front_marks else None
        headers = scope_headers(scope)
        task = asyncio.current_task()
        scope[TASK_KEY] = task  # type: ignore[literal-required]
        try:
            try:
                answer = await self.infer(scope, receive, headers, traced, front)
                status, payload, extra = 200, *answer
            except asyncio.CancelledError:
                if task is None or not scope.get(GONE_KEY):
                    raise
                # The client left (TritonHttpProtocol.connection_lost): its request was
                # dropped, and there is nobody to answer.
                task.uncancel()
                return
            except ServerError as exc:
                if task is not None and scope.get(GONE_KEY):
                    # The client left while the request was being ended otherwise (the
                    # exit timeout): nobody to answer, and the disconnect's cancel is
                    # withdrawn.
                    task.uncancel()
                    return
                status, payload = http_status(exc), orjson.dumps({"error": exc.message})
                extra = [_JSON, _CLOSE] if isinstance(exc, ClosingError) else [_JSON]
            except Exception as exc:
                # A server fault after decoding (decoding's own errors are ServerErrors).
                log.exception("unhandled error on %s", scope["path"])
                message = internal(exc, escaped=True).message
                status, payload, extra = 500, orjson.dumps({"error": message}), [_JSON]
            extra.append((b"content-length", str(len(payload)).encode()))
            if front is not None:
                front.mark("HTTP_SEND_START")
            await send({"type": "http.response.start", "status": status, "headers": extra})
            await send({"type": "http.response.body", "body": payload})
            if front is not None:
                front.mark("HTTP_SEND_END")
        finally:
            if front is not None:
                front.release()  # the trace is written now, with the send marks

    async def infer(
        self,
        scope: Scope,
        receive: Receive,
        headers: dict[str, str],
        traced: bool,
        front: FrontTrace | None,
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The encoded answer to one request, and its headers but the length."""
        params = scope["path_params"]
        model, version = str(params["model"]), str(params.get("version", ""))
        header_length = None
        given_length = headers.get(HEADER_LENGTH)
        if given_length is not None:
            with decoding("inference request"):
                header_length = codec.parse_header_length(given_length)
        body = await self._read(scope, receive, headers, header_length)
        if front is not None:
            front.mark("HTTP_RECV_END")
        with decoding("inference request"):
            infer_request = codec.decode_infer_request(model, version, body, header_length)
        if self.forward is not None:
            self.forward.apply_http(infer_request, scope["headers"])
        if traced:
            infer_request.traceparent = headers.get("traceparent", "")
            infer_request.front = front
        payload, json_length = await self.run(
            infer_request,
            "HTTP end point",
            lambda response: codec.encode_infer_response(response, infer_request),
        )
        if front is not None:
            front.mark("INFER_RESPONSE_COMPLETE")
        if json_length is not None:
            extra = [_BINARY, (b"inference-header-content-length", str(json_length).encode())]
        else:
            extra = [_JSON]
        accepted = headers.get("accept-encoding")
        if accepted:
            encoding = compression.choose_encoding(accepted)
            if encoding is not None:
                if len(payload) > compression.OFF_LOOP_BYTES:
                    payload = await asyncio.to_thread(compression.encode_content, payload, encoding)
                else:
                    payload = compression.encode_content(payload, encoding)
                extra.append((b"content-encoding", encoding.encode()))
        return payload, extra

    async def read_body(self, request: Request) -> bytes:
        """The body of a request to another route (all JSON), read as the infer endpoint
        reads its own (see `_read`)."""
        return await self._read(request.scope, request.receive, scope_headers(request.scope))

    async def _read(
        self,
        scope: Scope,
        receive: Receive,
        headers: dict[str, str],
        header_length: int | None = None,
    ) -> bytes:
        """The request body (read_raw_body) within its bound (`body_bound`), decoded by
        its `Content-Encoding` within --http-max-input-size; a large one off the loop."""
        limit = self.max_input_size
        bound, kind = body_bound(headers, limit, header_length)
        body = await read_raw_body(scope, receive, headers, bound, self.max_chunks, kind)
        if kind == "binary":
            return body  # not compressed
        encoding = headers.get("content-encoding")
        if encoding and len(body) > compression.OFF_LOOP_BYTES:
            return await asyncio.to_thread(compression.decode_content, body, encoding, limit)
        return compression.decode_content(body, encoding, limit)


_JSON = (b"content-type", b"application/json")
_BINARY = (b"content-type", b"application/octet-stream")
_CLOSE = (b"connection", b"close")


# The headers the endpoint reads, by their names as the scope carries them (lower-case).
_READ: Final = {
    name.encode("latin-1"): name
    for name in (
        HEADER_LENGTH,
        "content-length",
        "content-encoding",
        "accept-encoding",
        "traceparent",
    )
}


def body_bound(
    headers: dict[str, str], limit: int, header_length: int | None
) -> tuple[int, BodyKind]:
    """How many bytes an infer request's body may have as it arrives, and what a body past
    that is (for its message); `header_length`: its Inference-Header-Content-Length.

    As in Triton (http_server.cc), --http-max-input-size (`limit`) bounds the JSON: a
    whole JSON body, a raw-binary body (header length 0), and the JSON header of a body
    with binary tensor data. The tensor data after that header is not bounded by it, so
    a large image or tensor is sent as in Triton; such a body is bounded at the larger of
    `limit` and Triton's own bound, INT_MAX (it reads Content-Length with stoi), so that
    memory stays bounded. A header past `limit` is refused at once, with Triton's words,
    unless it is past the body too (that error is the codec's). A compressed body is
    bounded by `limit` before and after decompression, as Triton bounds what it
    decompresses to.
    """
    if header_length is None or header_length < 0:  # a negative one: the codec's error
        return limit, "json"
    if header_length == 0:
        return limit, "raw"
    encoding = headers.get("content-encoding")
    if encoding and encoding.strip().lower() != compression.IDENTITY:
        return limit, "json"
    if header_length > limit:
        declared = _declared_length(headers)
        if declared is None or header_length <= declared:
            raise too_large(header_length, limit)
    return max(limit, BINARY_BODY_BOUND), "binary"


async def read_raw_body(
    scope: Scope,
    receive: Receive,
    headers: dict[str, str],
    limit: int,
    max_chunks: int,
    kind: BodyKind = "json",
) -> bytes:
    """The request body as it came, capped at `limit` bytes (`kind` words the refusal:
    body_bound), and to Triton's count of non-empty chunks when it comes chunked.

    A body over the limit is answered 400 at once, with `Connection: close`; the server
    then reads and drops the rest before it closes (lingering.py), so that a client that
    writes the whole body before it reads gets the answer rather than a reset. A client
    that goes away mid-body is one line in the log, and CANCELLED.
    """
    declared = _declared_length(headers)
    size = 0
    try:
        if declared is not None and declared > limit:
            raise too_large(declared, limit, kind, declared=True)
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(chunk)
            if size > limit:
                raise too_large(size, limit, kind)
            if chunk:
                chunks.append(chunk)
            if (chunk or not more) and too_many_chunks(scope, len(chunks), max_chunks):
                raise ClosingError(ErrorCode.INVALID_ARG, error_texts.too_many_chunks(max_chunks))
    except ClientDisconnect:
        log.info(
            "%s %s: the client went away after %d of %s body bytes",
            scope["method"],
            scope["path"],
            size,
            "?" if declared is None else declared,
        )
        raise ServerError(
            ErrorCode.CANCELLED, "the client went away before the request body ended"
        ) from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def scope_headers(scope: Scope) -> dict[str, str]:
    """The headers the endpoint reads (_READ), by (lower-case) name; of a repeated one,
    the first, as starlette's `Headers.get` answers. The others are not decoded."""
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        key = _READ.get(name)
        if key is not None and key not in headers:
            headers[key] = value.decode("latin-1")
    return headers


def _declared_length(headers: dict[str, str]) -> int | None:
    declared = headers.get("content-length")
    # ASCII only: isdigit() also takes digits int() refuses (`²`) or reads (`٢`). The
    # parser has checked the header; a server that had not could not make this raise.
    if declared is not None and declared.isascii() and declared.isdigit():
        return int(declared)
    return None
