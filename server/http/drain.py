"""Answering a request without reading its body, and refusing requests while the server
stops (see server/drain.py).

When a server answers before it has read the whole body and then closes the connection,
the bytes still unread make the kernel reset it; a client that writes its whole body
before it reads then never sees the answer, only the reset. So before an answer that ends
the connection (a body over --http-max-input-size, or a refusal while stopping) the rest of
the body is read and thrown away, bounded in bytes and time so a client cannot make the
server read without end; past the bound the connection closes anyway.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from ..drain import DrainGate
from ..errors import shutting_down

log = logging.getLogger(__name__)

# At most this much of a body is read and thrown away, within this long.
DISCARD_MAX_BYTES: Final = 64 * 1024 * 1024
DISCARD_TIMEOUT_S: Final = 5.0

CLOSE: Final = (b"connection", b"close")


def expects_continue(scope: Scope) -> bool:
    """The client waits for `100 Continue` before it sends the body: none will come."""
    return any(
        name == b"expect" and value.lower() == b"100-continue"
        for name, value in scope.get("headers", ())
    )


async def discard_body(receive: Receive, budget: int = DISCARD_MAX_BYTES) -> bool:
    """Read the rest of a request body and drop it: True when it ended within `budget`
    bytes and `DISCARD_TIMEOUT_S`, False when it did not or the client went away."""
    dropped = 0
    try:
        async with asyncio.timeout(DISCARD_TIMEOUT_S):
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return False
                dropped += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return True
                if dropped > budget:
                    return False
    except TimeoutError:
        return False


class RefuseWhileDraining:
    """ASGI: once the gate closes, every request (on a connection opened before the
    listener closed) is answered 503 "Server is shutting down" with `Connection: close`,
    so its client retries it elsewhere and does not send another on this connection."""

    def __init__(self, app: ASGIApp, gate: DrainGate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.gate.is_open or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.gate.refused()
        if not expects_continue(scope):
            await discard_body(receive)
        body = orjson.dumps({"error": shutting_down().message})
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
