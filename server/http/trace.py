"""HTTP routes of the trace extension: `GET/POST /v2/trace/setting` and
`/v2/models/{model}/trace/setting`.

A POST names the settings it changes, each a string (the level a list of strings); null
clears a model's own setting back to the global one, and a model's POST with no settings
drops all of its own, as in Triton.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ge_serve.server.errors import decoding, invalid_arg

from . import codec
from .responses import json_response
from .routing import RouteHost


def _values(key: str, value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise invalid_arg(f"Unable to parse '{key}': expected strings")
        return value
    if isinstance(value, bool):
        raise invalid_arg(f"Unable to parse '{key}': expected a string")
    if isinstance(value, str | int):
        return [str(value)]
    raise invalid_arg(f"Unable to parse '{key}': expected a string")


def routes(front: RouteHost) -> list[Route]:
    core = front.core

    async def trace_setting(request: Request) -> Response:
        model = str(request.path_params.get("model", ""))
        # Starlette serves HEAD on every GET route; it is a GET without the body, and
        # changes nothing, whatever body it comes with.
        if request.method in ("GET", "HEAD"):
            return json_response(core.trace_settings(model))
        body = await front.read_body(request)
        with decoding("trace setting request"):
            document = codec.decode_json_object(body, "trace") if body.strip() else {}
            changes = {key: _values(key, value) for key, value in document.items()}
        return json_response(core.update_trace_settings(model, changes))

    return [
        front.route("/v2/trace/setting", trace_setting, ["GET", "POST"]),
        front.route("/v2/models/{model}/trace/setting", trace_setting, ["GET", "POST"]),
    ]
