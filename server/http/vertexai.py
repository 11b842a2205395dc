"""Triton's Vertex AI endpoint (vertex_ai_server.cc), on its own port
(`--allow-vertex-ai`, `--vertex-ai-port`, default `AIP_HTTP_PORT` or 8080).

- `AIP_HEALTH_ROUTE`: the server's readiness.
- `AIP_PREDICT_ROUTE`: an inference request to the default model
  (`--vertex-ai-default-model`, else the repository's one ready model); with
  `X-Vertex-Ai-Triton-Redirect: <KServe v2 path>`, a POST that stands for that request
  instead: metrics, statistics, model readiness, metadata, config and inference, server
  health and metadata, shared memory status and the repository index. Redirects that
  would change something (shared memory registration, model load and unload) are a 403.

Both routes are regular expressions matched against the whole path, as in Triton.
Anything else is a 400. Each request is the KServe v2 request it stands for, answered by
the HTTP front end's own application (cloud.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ErrorCode, ServerError
from ..inference.core import InferenceServer
from .cloud import forward_infer, readdressed, respond

MIME: Final = "application/vnd.vertex-ai-triton.binary+json;json-header-size="
REDIRECT: Final = "x-vertex-ai-triton-redirect"

# Triton's HTTP paths (http_server.cc), as the redirect header names them.
_MODEL: Final = re.compile(
    r"/v2/models/([^/]+)(?:/versions/([0-9]+))?"
    r"(?:/(infer|generate|generate_stream|ready|config|stats|trace/setting))?"
)
_SERVER: Final = re.compile(r"/v2(?:/health/(live|ready))?")
_SHARED_MEMORY: Final = re.compile(
    r"/v2/(?:system|cuda)sharedmemory(?:/region/([^/]+))?/(status|register|unregister)"
)
_CONTROL: Final = re.compile(r"/v2/repository(?:/([^/]+))?/(index|models/([^/]+)/(load|unload))")


def routes(environ: Mapping[str, str]) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(predict, health) routes from the environment, or Triton's startup error."""
    predict = environ.get("AIP_PREDICT_ROUTE", "")
    health = environ.get("AIP_HEALTH_ROUTE", "")
    if not predict:
        # Triton's text names the variable API_PREDICT_ROUTE.
        raise ServerError(
            ErrorCode.INVALID_ARG, "API_PREDICT_ROUTE is not defined for Vertex AI endpoint"
        )
    if not health:
        raise ServerError(
            ErrorCode.INVALID_ARG, "AIP_HEALTH_ROUTE is not defined for Vertex AI endpoint"
        )
    try:
        return re.compile(predict), re.compile(health)
    except re.error as exc:
        raise ServerError(ErrorCode.INVALID_ARG, f"invalid Vertex AI route: {exc}") from None


async def default_model(core: InferenceServer, name: str) -> str:
    """The model the predict route infers, checked as Triton checks it at startup."""
    ready = [entry.name for entry in await core.repository_index(ready_only=True)]
    if not name:
        if len(ready) != 1:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                "Expect the model repository contains only a single model if default model "
                "is not specified",
            )
        return ready[0]
    if name not in ready:
        raise ServerError(ErrorCode.INVALID_ARG, f"Expect the default model '{name}' is loaded")
    return name


class VertexAiEndpoint:
    """ASGI: the Vertex AI routes, onto `inner` (the HTTP front end's application);
    `metrics` serves the metrics redirect."""

    def __init__(
        self,
        inner: ASGIApp,
        metrics: ASGIApp | None,
        model: str,
        predict: re.Pattern[str],
        health: re.Pattern[str],
    ) -> None:
        self.inner = inner
        self.metrics = metrics
        self.model = model
        self.predict = predict
        self.health = health

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if self.health.fullmatch(path):
            if method != "GET":
                await respond(send, 405, "Method Not Allowed")
                return
            await self.inner(readdressed(scope, "/v2/health/ready", "GET"), receive, send)
            return
        if self.predict.fullmatch(path):
            redirect = next((v for k, v in scope["headers"] if k == REDIRECT.encode()), None)
            if redirect is None:
                await self.infer(scope, receive, send, f"/v2/models/{self.model}/infer")
            elif method != "POST":
                await respond(send, 405, "Method Not Allowed")
            else:
                await self.redirect(scope, receive, send, "/" + redirect.decode("latin-1"))
            return
        await respond(send, 400, f"Bad Request: no Vertex AI route for {method} {path}")

    async def infer(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        await forward_infer(self.inner, scope, receive, send, path, MIME)

    async def redirect(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        """The request `path` names, as Triton's redirect serves it."""
        if path == "/metrics":
            if self.metrics is None:
                await respond(send, 400, "metrics are not enabled (--allow-metrics=false)")
            else:
                await self.metrics(readdressed(scope, "/metrics", "GET"), receive, send)
            return
        if path == "/v2/models/stats":
            await self.inner(readdressed(scope, path, "GET"), receive, send)
            return
        match = _MODEL.fullmatch(path)
        if match is not None:
            kind = match.group(3) or ""
            if kind == "infer":
                await self.infer(scope, receive, send, path)
                return
            if kind in ("", "ready", "config", "stats"):
                await self.inner(readdressed(scope, path, "GET"), receive, send)
                return
        if _SERVER.fullmatch(path) is not None:
            await self.inner(readdressed(scope, path, "GET"), receive, send)
            return
        match = _SHARED_MEMORY.fullmatch(path)
        if match is not None:
            if match.group(2) == "status":
                await self.inner(readdressed(scope, path, "GET"), receive, send)
            else:
                await respond(send, 403, f"Forbidden: '{path}' is not served by redirect")
            return
        match = _CONTROL.fullmatch(path)
        if match is not None:
            if match.group(2) == "index":
                await self.inner(readdressed(scope, path, "POST"), receive, send)
            else:
                await respond(send, 403, f"Forbidden: '{path}' is not served by redirect")
            return
        await respond(send, 400, f"Bad Request: no Vertex AI redirect to {path}")
