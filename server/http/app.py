"""The HTTP front end: KServe v2 routes, each a thin adapter over `InferenceServer`.

Routes are plain starlette routes, without FastAPI's dependency injection, because the
infer path is hot; FastAPI is the container, so extensions can add documented routes, and
it serves the OpenAPI document (openapi.py). The control-plane endpoints still read their
bodies themselves (size cap, decompression), then check the JSON with the pydantic model
the document describes it with (bodies.py); a failed check is a 400 `{"error": ...}` in
the wording clients know, not FastAPI's 422.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

from ge_serve.server.control.chat import ChatSettings
from ge_serve.server.control.cors import CorsSettings
from ge_serve.server.control.requestlog import RequestLogging
from ge_serve.server.control.restrictions import RestrictedApis
from ge_serve.server.control.stopping import DrainGate
from ge_serve.server.control.tls import HttpTls
from ge_serve.server.control.uvicornlogs import UvicornLogs
from ge_serve.server.errors import ErrorCode, ServerError, decoding
from ge_serve.server.inference import error_texts
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.header_forward import HeaderForward
from ge_serve.server.inference.types import InferRequest, InferResponse

from . import encode, generate, monitoring, openapi, sharedmemory, trace
from .apikey import ApiKeyMiddleware, ApiKeys
from .bodies import (
    RepositoryIndexRequest,
    RepositoryLoadRequest,
    RepositoryUnloadRequest,
    decode_body,
    decode_index_request,
)
from .drain import RefuseWhileDraining
from .errors import error_response
from .infer import Encoded, InferEndpoint, InferShortcut, guard
from .marks import Marks
from .openai import routes as openai_routes
from .openai.errors import (
    KSERVE_PREFIX,
    OPENAI_PREFIX,
    OpenAIError,
    is_anthropic_path,
    is_openai_path,
)
from .openai.tools import ToolSettings
from .openapi import ApiRoute, Body
from .responses import json_response
from .restricted import RestrictedApiMiddleware
from .rootpath import route_path, with_root_path
from .routing import Endpoint

log = logging.getLogger(__name__)

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
    max_chunks: int = error_texts.MAX_CHUNKS
    # --http-header-forward-pattern; "" forwards no header.
    header_forward_pattern: str = ""
    # --tool-call-parser, --max-tool-call-parse-bytes (/v1 tool calling).
    tools: ToolSettings = field(default_factory=ToolSettings)
    # vLLM's --api-key (or VLLM_API_KEY): keys its routes need (apikey.py); never shown.
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    # vLLM's --allowed-origins and its companions (cors.py).
    cors: CorsSettings = field(default_factory=CorsSettings)
    chat: ChatSettings = field(default_factory=ChatSettings)  # vLLM's chat flags
    # vLLM's --enable-request-id-headers (requestid.py).
    request_id_headers: bool = False
    # vLLM's --enable-server-load-tracking: /load counts (openai/serverload.py).
    load_tracking: bool = False
    # vLLM's --enable-log-requests and its companions (control/requestlog.py).
    request_log: RequestLogging = field(default_factory=RequestLogging)
    # vLLM's --ssl-* flags: HTTPS on the HTTP port (control/tls.py).
    tls: HttpTls = field(default_factory=HttpTls)
    # vLLM's uvicorn log flags, which HTTP workers apply too (control/uvicornlogs.py).
    uvicorn_logs: UvicornLogs = field(default_factory=UvicornLogs)
    # vLLM's --root-path: the prefix of a path-routing proxy ("" none; rootpath.py).
    root_path: str = ""
    # Whether /openapi.json is served (vLLM's --disable-fastapi-docs turns it off).
    openapi: bool = True


class HttpFrontEnd:
    def __init__(self, core: InferenceServer, settings: HttpSettings) -> None:
        self.core = core
        self.settings = settings
        self.restrictions = RestrictedApis(settings.restricted_api)
        # Other front-end pieces (statistics, repository, logging...) add routes here.
        self.extra_routes: list[Route] = []
        # Also served by InferShortcut, in front of the route table.
        self.infer_endpoint = InferEndpoint(
            self.run_infer,
            settings.max_input_size,
            settings.max_chunks,
            lambda: core.tracing.active,
            HeaderForward.of(settings.header_forward_pattern),
            front_marks=True,
        )
        self.infer_routes = self.infer_endpoint.routes()
        # Closed when the server stops: requests are then refused (see server/control/stopping.py).
        self.gate = DrainGate()

    def route(
        self, path: str, endpoint: Endpoint, methods: list[str], body: Body | None = None
    ) -> Route:
        """A guarded route; `body` describes its POST body in the OpenAPI document."""
        return ApiRoute(path, guard(endpoint), methods=methods, body=body)

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
            # Triton's paths with a repository named: its index ignores the name, and
            # load and unload refuse it.
            self.route(
                "/v2/repository/{repository}/index",
                self.repository_index,
                ["POST"],
                Body(RepositoryIndexRequest, required=False),
            ),
            *(
                self.route(
                    f"/v2/repository/{{repository}}/models/{{model}}/{action}",
                    self.named_repository_control,
                    ["POST"],
                )
                for action in ("load", "unload")
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
            # KServe v1's liveness route, which its REST client's is_server_live() calls.
            self.route("/", self.kserve_live, ["GET"]),
            # Last: the table is tried in order when the inference shortcut is off.
            *openai_routes.routes(
                self,
                self.settings.tools,
                self.settings.chat,
                self.settings.load_tracking,
                self.settings.request_log,
            ),
        ]

    @property
    def marks(self) -> Marks:
        return Marks(self.settings.cors, self.settings.request_id_headers)

    def worker_config(self) -> dict[str, Any]:
        """What HTTP workers need of this front end: whether they pass inference on too
        (restricted APIs, whose checks must see every request), the marks they put on
        every answer themselves (marks.py), how uvicorn logs there (under the server's log
        settings), and --root-path's prefix (rootpath.py)."""
        return {
            "restricted": bool(self.restrictions),
            "marks": self.marks.to_json(),
            "uvicorn_logs": self.settings.uvicorn_logs.to_json(),
            "log": self.core.log_settings(),
            "tls": self.settings.tls.to_json(),
            "root_path": self.settings.root_path,
        }

    def build(self, marked: bool = True) -> ASGIApp:
        """The HTTP application: FastAPI, with the shortcut for inference in front, behind
        the refusal of requests while the server stops, inside CORS and request ids where
        they are on (unless `marked` is false: HTTP workers put them on, marks.py), all
        behind --root-path's prefix (rootpath.py)."""
        app: ASGIApp = self.build_fastapi()
        if not self.restrictions:
            app = InferShortcut(app, self.infer_routes)
        app = RefuseWhileDraining(app, self.gate)
        return with_root_path(self.marks.apply(app) if marked else app, self.settings.root_path)

    def build_fastapi(self) -> FastAPI:
        routes = self.routes()
        # KServe's OpenAI paths, /openai/v1/...: the same /v1 routes (so the same answers,
        # errors and limits), mounted after every other route, so that only a request no
        # route took is matched against the prefix. A rewrite of the path in front of the
        # application would look at every request, v2 inference included.
        kserve = Mount(
            KSERVE_PREFIX, routes=[r for r in routes if r.path.startswith(OPENAI_PREFIX)]
        )
        app = FastAPI(
            title="ge-serve",
            docs_url=None,
            redoc_url=None,
            openapi_url=openapi.PATH if self.settings.openapi else None,
            routes=[*routes, kserve],
            # Triton matches whole paths: `.../infer/` is a 404, not a redirect, and a
            # redirect would name whatever host the client's Host header says.
            redirect_slashes=False,
            **_NO_TELEMETRY,
        )
        if self.settings.openapi:  # built once, here: FastAPI serves the cached document
            openapi.extend(app.openapi(), app.routes)

        async def http_error(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, StarletteHTTPException)
            if exc.status_code == 404:
                message = f"Not Found: no route for {request.method} {request.url.path}"
            elif exc.status_code == 405:
                message = f"Method Not Allowed: {request.method} {request.url.path}"
            else:
                message = str(exc.detail)
            path = route_path(request.scope)
            if is_openai_path(path):
                anthropic = is_anthropic_path(path)
                return OpenAIError(message, status=exc.status_code).response(anthropic)
            return error_response(exc.status_code, message)

        app.add_exception_handler(StarletteHTTPException, http_error)
        if self.restrictions:
            app.add_middleware(RestrictedApiMiddleware, restrictions=self.restrictions)
        if self.settings.api_keys:  # outermost: a request without a key goes no further
            app.add_middleware(ApiKeyMiddleware, keys=ApiKeys(self.settings.api_keys))
        return app

    # --- handlers ------------------------------------------------------------------------

    async def run_infer(
        self, request: InferRequest, endpoint: str, encode: Callable[[InferResponse], Encoded]
    ) -> Encoded:
        return encode(await self.core.infer(request, endpoint))

    async def read_body(self, request: Request) -> bytes:
        """The request body, size-capped before and after decompression, and to Triton's
        count of non-empty chunks (see InferEndpoint.read_body)."""
        return await self.infer_endpoint.read_body(request)

    async def health_live(self, request: Request) -> Response:
        return _health("live", self.core.live())

    async def health_ready(self, request: Request) -> Response:
        return _health("ready", self.core.ready())

    async def kserve_live(self, request: Request) -> Response:
        """KServe v1's `{"status": "alive"}`; 503 once the server is not live, as vLLM's
        /health answers (KServe's own is always alive)."""
        up = self.core.live()
        body = b'{"status":"%s"}' % (b"alive" if up else b"not alive")
        return Response(body, status_code=200 if up else 503, media_type="application/json")

    async def server_metadata(self, request: Request) -> Response:
        return json_response(encode.server_metadata(self.core.metadata()))

    async def model_metadata(self, request: Request) -> Response:
        model, version = _model_path(request)
        return json_response(encode.model_metadata(self.core.model_metadata(model, version)))

    async def model_ready(self, request: Request) -> Response:
        """200, or Triton's reason (HandleModelReady, TRITONSERVER_ServerModelIsReady): the
        lookup's error for a version string it cannot read or a model or version it does
        not serve, in the words model metadata answers with; `Server not ready` while the
        server stops."""
        model, version = _model_path(request)
        self.core.model(model, version)
        if not self.core.accepting():
            raise ServerError(ErrorCode.UNAVAILABLE, "Server not ready")
        return Response(status_code=200)

    async def model_config(self, request: Request) -> Response:
        model, version = _model_path(request)
        return json_response(encode.config_to_json(self.core.model_config(model, version)))

    async def repository_index(self, request: Request) -> Response:
        body = await self.read_body(request)
        with decoding("repository index request"):
            index = decode_index_request(body)
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

    async def named_repository_control(self, request: Request) -> Response:
        raise ServerError(ErrorCode.UNSUPPORTED, error_texts.REPOSITORY_NAME_UNSUPPORTED)


def _model_path(request: Request) -> tuple[str, str]:
    params = request.path_params
    return str(params["model"]), str(params.get("version", ""))


def _health(kind: str, up: bool) -> Response:
    """Triton's status (200, else 400), with the Open Inference Protocol's body
    (`{"live": true}`, `{"ready": true}`), which KServe's REST client reads; Triton sends
    none, and tritonclient reads only the status."""
    body = b'{"%s":%s}' % (kind.encode(), b"true" if up else b"false")
    return Response(body, status_code=200 if up else 400, media_type="application/json")
