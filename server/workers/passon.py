"""The server's side of an HTTP request a worker passed on whole: the HTTP front end's own
application answers it, as if it had come to this process.

A streamed answer (generate_stream's events) goes back chunk by chunk as `Start` and
`Part`; any other answer as one `Forwarded` with its body placed on the link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ge_serve.link.frames import LinkClosed
from ge_serve.link.loop import LoopLink
from ge_serve.link.messages import Region

from ..errors import ErrorCode
from .messages import Failed, Forward, Forwarded, Part, Start

log = logging.getLogger(__name__)

# An ASGI application, as the HTTP front end builds it.
AsgiApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[MutableMapping[str, Any]]],
     Callable[[MutableMapping[str, Any]], Awaitable[None]]],
    Awaitable[None],
]  # fmt: skip


async def answer_passed_on(
    app: AsgiApp, link: LoopLink, request: Forward, held: dict[int, list[Region]]
) -> None:
    """Answer `request` with `app`; the answer's regions go into `held` until the worker
    is done with them."""
    request_id = request.id
    body = bytes(link.view(request.body))
    status = 500
    headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []
    answered = asyncio.Event()
    delivered = False
    streamed = False

    async def receive() -> MutableMapping[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await answered.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status, headers, streamed
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
        elif message["type"] == "http.response.body":
            chunk = bytes(message.get("body", b""))
            if not message.get("more_body", False):
                chunks.append(chunk)
                return
            if not streamed:
                streamed = True
                link.send(Start(request_id, status, headers))
            if chunk:
                link.send(Part(request_id, chunk))

    try:
        scope = dict(request.scope)
        for key in ("server", "client"):  # ASGI's address pairs are tuples
            if isinstance(scope.get(key), list):
                scope[key] = tuple(scope[key])
        scope["headers"] = request.headers
        scope["asgi"] = {"version": "3.0", "spec_version": "2.3"}
        scope["state"] = {}
        try:
            await app(scope, receive, send)
        finally:
            answered.set()
        regions: list[Region] = []
        content = link.place(memoryview(b"".join(chunks)), regions)
        held[request_id] = regions
        link.send(Forwarded(request_id, status, headers, content))
    except Exception as exc:
        if isinstance(exc, LinkClosed):
            return
        log.exception("a passed-on HTTP request failed")
        with contextlib.suppress(LinkClosed):
            link.send(Failed(request_id, ErrorCode.INTERNAL.value, f"internal error: {exc!r}"))
    except asyncio.CancelledError:
        with contextlib.suppress(LinkClosed):
            if not link.closed:
                link.send(Failed(request_id, ErrorCode.CANCELLED.value, "cancelled"))
