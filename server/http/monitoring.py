"""HTTP routes for the statistics and logging extensions, and the /metrics endpoints.

The metrics port serves `MetricsApp`, a bare ASGI app: Prometheus scrapes it and nothing
else, so it needs no framework.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from ge_serve.server.control.logsettings import LogSettings
from ge_serve.server.errors import decoding

from . import codec, encode
from .errors import error_response
from .openapi import Body
from .responses import json_response
from .routing import Endpoint, RouteHost

log = logging.getLogger(__name__)

METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def routes(front: RouteHost) -> list[Route]:
    """Statistics and logging; `/v2/models/stats` must come before `/v2/models/{model}`."""
    core = front.core

    async def statistics(request: Request) -> Response:
        params = request.path_params
        stats = core.statistics(str(params.get("model", "")), str(params.get("version", "")))
        return json_response(encode.statistics(stats))

    async def logging_settings(request: Request) -> Response:
        # Starlette serves HEAD on every GET route; it is a GET without the body, and
        # changes nothing, whatever body it comes with.
        if request.method in ("GET", "HEAD"):
            return json_response(core.log_settings())
        body = await front.read_body(request)
        with decoding("log settings request"):
            changes = codec.decode_json_object(body, "log settings request")
        return json_response(core.update_log_settings(changes))

    return [
        front.route("/v2/models/stats", statistics, ["GET"]),
        *front.versioned("/stats", statistics, ["GET"]),
        front.route("/v2/logging", logging_settings, ["GET", "POST"], Body(LogSettings)),
    ]


def metrics_endpoint(render: Callable[[], bytes]) -> Endpoint:
    """/metrics on the HTTP port."""

    async def metrics(request: Request) -> Response:
        return Response(render(), media_type=METRICS_CONTENT_TYPE)

    return metrics


class MetricsApp:
    """The metrics port: `GET /metrics`, and JSON errors for anything else."""

    def __init__(self, render: Callable[[], bytes]) -> None:
        self._render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        if scope["path"] != "/metrics":
            response = error_response(404, f"Not Found: no route for {method} {scope['path']}")
        elif method not in ("GET", "HEAD"):
            response = error_response(405, f"Method Not Allowed: {method} {scope['path']}")
            response.headers["allow"] = "GET, HEAD"
        else:
            try:
                body = self._render()
            except Exception as exc:
                log.exception("rendering metrics failed")
                response = error_response(500, f"rendering metrics failed: {exc}")
                await response(scope, receive, send)
                return
            response = Response(
                b"" if method == "HEAD" else body,
                media_type=METRICS_CONTENT_TYPE,
                headers={"content-length": str(len(body))},
            )
        await response(scope, receive, send)
