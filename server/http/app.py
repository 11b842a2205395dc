"""The HTTP front end: KServe v2 routes, each a thin adapter over `InferenceServer`.

Routes are plain starlette routes, without FastAPI's dependency injection, because the
infer path is hot; FastAPI is the container, so extensions can add documented routes, and
it serves the OpenAPI document (openapi.py). The control-plane endpoints still read their
bodies themselves (size cap, decompression), then check the JSON with the pydantic model
the document describes it with (bodies.py); a failed check is a 400 `{"error": ...}` in
the wording clients know, not FastAPI's 422.
"""

from __future__ import annotations

import functools
import inspect
import logging
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ge_serve.server import messages
from ge_serve.server.core import InferenceServer
from ge_serve.server.drain import DrainGate
from ge_serve.server.errors import ErrorCode, ServerError, decoding
from ge_serve.server.restrictions import RestrictedApis

from . import codec, compression, encode, generate, monitoring, openapi, sharedmemory, trace
from .bodies import (
    InferRequestBody,
    RepositoryIndexRequest,
    RepositoryLoadRequest,
    RepositoryUnloadRequest,
    decode_body,
)
from .drain import DISCARD_MAX_BYTES, RefuseWhileDraining, discard_body, expects_continue
from .errors import ClosingError, error_response, server_error_response
from .openapi import ApiRoute, Body
from .responses import json_response
from .restricted import RestrictedApiMiddleware
from .routing import Endpoint

log = logging.getLogger(__name__)

HEADER_LENGTH = "inference-header-content-length"

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

# FastAPI >= 0.165 wraps every request in OpenTelemetry checks that read the environment
# per request (about 1% of the infer path on `simple`); ge-serve exports its own metrics.
_NO_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """What the HTTP front end needs; the composition root derives it from `Settings`,
    which holds the defaults."""

    max_input_size: int
    # --http-restricted-api rules: (category, header, value)
    restricted_api: tuple[tuple[str, str, str], ...]
    # Non-empty chunks a request body may arrive in (Triton's limit).
    max_chunks: int = messages.MAX_CHUNKS


class InferShortcut:
    """ASGI: inference requests go straight to their endpoint, everything else to the
    FastAPI application.

    Starlette tries every route's pattern in turn (infer is one of the last) and passes
    each request through five middleware layers (server errors, telemetry, body limit,
    exceptions, an exit stack); py-spy on `simple` at 32 clients put that at ~20 % of the
    event loop's time. The shortcut matches with the infer routes' own patterns and calls
    their own (guarded) endpoint, so answers and errors are the same. Not used with
    --http-restricted-api, whose middleware must see every request, or behind a root
    path."""

    def __init__(self, app: ASGIApp, routes: list[Route]) -> None:
        self.app = app
        self._routes = [(route.path_regex, route.endpoint) for route in routes]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            path = scope["path"]
            for pattern, endpoint in self._routes:
                match = pattern.match(path)
                if match is not None:
                    scope["path_params"] = match.groupdict()
                    response = await endpoint(Request(scope, receive))
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _guard(endpoint: Endpoint) -> Endpoint:
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
            return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    return guarded


class HttpFrontEnd:
    def __init__(self, core: InferenceServer, settings: HttpSettings) -> None:
        self.core = core
        self.settings = settings
        self.restrictions = RestrictedApis(settings.restricted_api)
        # Other front-end pieces (statistics, repository, logging...) add routes here.
        self.extra_routes: list[Route] = []
        # Also served by InferShortcut, in front of the route table.
        self.infer_routes = self.versioned("/infer", self.infer, ["POST"], _INFER_BODY)
        # Closed when the server stops: requests are then refused (see server/drain.py).
        self.gate = DrainGate()

    def route(
        self, path: str, endpoint: Endpoint, methods: list[str], body: Body | None = None
    ) -> Route:
        """A guarded route; `body` describes its POST body in the OpenAPI document."""
        return ApiRoute(path, _guard(endpoint), methods=methods, body=body)

    def versioned(
        self, suffix: str, endpoint: Endpoint, methods: list[str], body: Body | None = None
    ) -> list[Route]:
        """A model route with and without `/versions/{version}`."""
        return [
            self.route("/v2/models/{model}" + suffix, endpoint, methods, body),
            self.route("/v2/models/{model}/versions/{version}" + suffix, endpoint, methods, body),
        ]

    def routes(self) -> list[Route]:
        return [
            self.route("/v2/health/live", self.health_live, ["GET"]),
            self.route("/v2/health/ready", self.health_ready, ["GET"]),
            self.route("/v2", self.server_metadata, ["GET"]),
            self.route(
                "/v2/repository/index",
                self.repository_index,
                ["POST"],
                Body(RepositoryIndexRequest, required=False),
            ),
            self.route(
                "/v2/repository/models/{model}/load",
                self.repository_load,
                ["POST"],
                Body(RepositoryLoadRequest, required=False),
            ),
            self.route(
                "/v2/repository/models/{model}/unload",
                self.repository_unload,
                ["POST"],
                Body(RepositoryUnloadRequest, required=False),
            ),
            *monitoring.routes(self),
            *sharedmemory.routes(self),
            *trace.routes(self),
            *self.extra_routes,
            *self.versioned("/ready", self.model_ready, ["GET"]),
            *self.versioned("/config", self.model_config, ["GET"]),
            *self.infer_routes,
            *generate.routes(self, self.settings.max_input_size),
            *self.versioned("", self.model_metadata, ["GET"]),
        ]

    def build(self) -> ASGIApp:
        """The HTTP application: FastAPI, with the shortcut for inference in front, behind
        the refusal of requests while the server stops."""
        app: ASGIApp = self.build_fastapi()
        if not self.restrictions:
            app = InferShortcut(app, self.infer_routes)
        return RefuseWhileDraining(app, self.gate)

    def build_fastapi(self) -> FastAPI:
        app = FastAPI(
            title="ge-serve",
            docs_url=None,
            redoc_url=None,
            openapi_url=openapi.PATH,
            routes=list[BaseRoute](self.routes()),
            **_NO_TELEMETRY,
        )
        # Built once, here: FastAPI serves the cached document.
        openapi.extend(app.openapi(), app.routes)

        async def http_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, StarletteHTTPException)
            if exc.status_code == 404:
                message = f"Not Found: no route for {request.method} {request.url.path}"
            elif exc.status_code == 405:
                message = f"Method Not Allowed: {request.method} {request.url.path}"
            else:
                message = str(exc.detail)
            return error_response(exc.status_code, message)

        app.add_exception_handler(StarletteHTTPException, http_error)
        if self.restrictions:
            app.add_middleware(RestrictedApiMiddleware, restrictions=self.restrictions)
        return app

    # --- handlers ------------------------------------------------------------------------

    async def health_live(self, request: Request) -> Response:
        return Response(status_code=200 if self.core.live() else 400)

    async def health_ready(self, request: Request) -> Response:
        return Response(status_code=200 if self.core.ready() else 400)

    async def server_metadata(self, request: Request) -> Response:
        return json_response(encode.server_metadata(self.core.metadata()))

    async def model_metadata(self, request: Request) -> Response:
        model, version = _model_path(request)
        return json_response(encode.model_metadata(self.core.model_metadata(model, version)))

    async def model_ready(self, request: Request) -> Response:
        model, version = _model_path(request)
        return Response(status_code=200 if self.core.model_ready(model, version) else 400)

    async def model_config(self, request: Request) -> Response:
        model, version = _model_path(request)
        return json_response(encode.config_to_json(self.core.model_config(model, version)))

    async def repository_index(self, request: Request) -> Response:
        body = await self.read_body(request)
        with decoding("repository index request"):
            index = decode_body(
                RepositoryIndexRequest, body, "repository index request", optional=True
            )
        return json_response(encode.repository_index(await self.core.repository_index(index.ready)))

    async def repository_load(self, request: Request) -> Response:
        body = await self.read_body(request)
        with decoding("load request"):
            load = decode_body(RepositoryLoadRequest, body, "load request", optional=True)
        await self.core.load_model(
            str(request.path_params["model"]),
            load.parameters.config_json,
            load.parameters.files or None,
        )
        return Response(status_code=200)

    async def repository_unload(self, request: Request) -> Response:
        body = await self.read_body(request)
        with decoding("unload request"):
            unload = decode_body(RepositoryUnloadRequest, body, "unload request", optional=True)
        await self.core.unload_model(
            str(request.path_params["model"]), unload.parameters.unload_dependents
        )
        return Response(status_code=200)

    async def infer(self, request: Request) -> Response:
        model, version = _model_path(request)
        with decoding("inference request"):
            header_length = codec.parse_header_length(request.headers.get(HEADER_LENGTH))
        body = await self.read_body(request, raw=header_length == 0)
        with decoding("inference request"):
            infer_request = codec.decode_infer_request(model, version, body, header_length)
        if self.core.tracing.active:
            infer_request.traceparent = request.headers.get("traceparent", "")
        response = await self.core.infer(infer_request, "HTTP end point")
        payload, json_length = codec.encode_infer_response(response, infer_request)
        headers: dict[str, str] = {}
        if json_length is not None:
            headers["Inference-Header-Content-Length"] = str(json_length)
            media_type = "application/octet-stream"
        else:
            media_type = "application/json"
        encoding = compression.choose_encoding(request.headers.get("accept-encoding"))
        if encoding is not None:
            payload = compression.encode_content(payload, encoding)
            headers["Content-Encoding"] = encoding
        return Response(payload, media_type=media_type, headers=headers)

    async def read_body(self, request: Request, raw: bool = False) -> bytes:
        """The request body, size-capped before and after decompression (`raw`: a
        raw-binary infer body, which Triton words differently), and to Triton's count of
        non-empty chunks when it comes chunked.

        A body over the limit is read to its end and dropped (within bounds, see drain.py)
        before the 400, which then closes the connection, so that a client that writes
        the whole body before it reads gets the answer rather than a reset. A client that
        goes away mid-body is one line in the log.
        """
        limit = self.settings.max_input_size
        declared = _declared_length(request)
        size = 0
        try:
            if declared is not None and declared > limit:
                await self._drop_body(request, declared)
                raise _too_large(declared, limit, raw)
            chunks: list[bytes] = []
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    await self._drop_body(request, None if declared is None else declared - size)
                    raise _too_large(size, limit, raw)
                if chunk:
                    chunks.append(chunk)
                    if len(chunks) > self.settings.max_chunks:
                        await self._drop_body(request, None)
                        raise ClosingError(
                            ErrorCode.INVALID_ARG,
                            messages.too_many_chunks(self.settings.max_chunks),
                        )
        except ClientDisconnect:
            log.info(
                "%s %s: the client went away after %d of %s body bytes",
                request.method,
                request.url.path,
                size,
                "?" if declared is None else declared,
            )
            raise ServerError(
                ErrorCode.CANCELLED, "the client went away before the request body ended"
            ) from None
        body = b"".join(chunks)
        return compression.decode_content(body, request.headers.get("content-encoding"), limit)

    @staticmethod
    async def _drop_body(request: Request, remaining: int | None) -> None:
        """Read what is left of an oversized body and drop it, unless it is more than the
        bound (the connection then closes with it unread) or the client waits for
        `100 Continue` and so sends none."""
        if expects_continue(request.scope):
            return
        if remaining is not None and remaining > DISCARD_MAX_BYTES:
            return
        await discard_body(request.receive)


def _declared_length(request: Request) -> int | None:
    declared = request.headers.get("content-length")
    return int(declared) if declared is not None and declared.isdigit() else None


def _too_large(size: int, limit: int, raw: bool) -> ServerError:
    """Triton's words for a body past --http-max-input-size (a body still arriving is
    counted up to the first byte past the limit)."""
    if raw:
        message = messages.raw_input_too_large(size, limit).message
    else:
        message = messages.request_json_size(size, limit)
    return ClosingError(ErrorCode.INVALID_ARG, message)


def _model_path(request: Request) -> tuple[str, str]:
    params = request.path_params
    return str(params["model"]), str(params.get("version", ""))
