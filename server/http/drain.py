"""Refusing requests while the server stops (see server/control/stopping.py).

The refusal ends the connection without reading the request's body; the lingering close
(lingering.py) reads and drops what the client still sends, so that it gets the 503
rather than a reset.
"""

from __future__ import annotations

import logging
from typing import Final

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from ..control.stopping import DrainGate
from ..errors import shutting_down
from .openai.errors import SERVER_ERROR, OpenAIError, is_anthropic_path, is_openai_path
from .rootpath import route_path

log = logging.getLogger(__name__)

CLOSE: Final = (b"connection", b"close")


class RefuseWhileDraining:
    """ASGI: once the gate closes, every request (on a connection opened before the
    listener closed) is answered 503 "Server is shutting down" with `Connection: close`,
    so its client retries it elsewhere and does not send another on this connection (in
    OpenAI's error object on /v1)."""

    def __init__(self, app: ASGIApp, gate: DrainGate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.gate.is_open or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.gate.refused()
        message = shutting_down().message
        path = route_path(scope)
        if is_openai_path(path):
            refusal = OpenAIError(message, status=503, kind=SERVER_ERROR)
            found = refusal.anthropic_body() if is_anthropic_path(path) else refusal.body()
            body = orjson.dumps(found)
        else:
            body = orjson.dumps({"error": message})
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    CLOSE,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
