"""A front-end worker's way into the server's core: `infer` over the worker link.

The worker's front end calls `RemoteCore.infer` where the server's calls
`InferenceServer.infer`; the request runs in the server process (server/workers.py) and
its response or its ServerError comes back the same. A request whose caller goes away is
cancelled in the server too. The request's tensors stay in this process's arena until the
server has answered, since the server reads them in place; the response's, in the server's
arena, until the front end has encoded the response.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Callable
from typing import Any, TypeVar

from ge_serve.backends.memfd import Region

from .errors import ErrorCode, FailureReason, ServerError
from .inference.types import InferRequest, InferResponse
from .link import Link, LinkClosed, Message
from .linkcodec import request_to_wire, response_from_wire

log = logging.getLogger(__name__)

T = TypeVar("T")


def _unavailable() -> ServerError:
    return ServerError(ErrorCode.UNAVAILABLE, "the server process is not reachable")


class RemoteCore:
    def __init__(self, sock: socket.socket, label: str, on_closed: Callable[[], None]) -> None:
        self.link = Link(sock, label, self._received, self._closed)
        self._on_closed = on_closed
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._regions: dict[int, list[Region]] = {}
        self._parts: dict[int, Callable[[Message], None]] = {}

    def ready(self, failure: str | None = None) -> None:
        """Tell the server this worker listens (or why it cannot)."""
        if failure is None:
            self.link.send("ready")
        else:
            self.link.send("failed", failure)

    async def infer(
        self, request: InferRequest, endpoint: str, encode: Callable[[InferResponse], T]
    ) -> T:
        """Run the request in the server and return `encode(response)`: the response's
        arrays are views of the server's memory, valid only until `encode` returns."""
        link = self.link
        regions: list[Region] = []
        try:
            wire = request_to_wire(link, request, regions)
        except LinkClosed:
            link.release(regions)
            raise _unavailable() from None
        request_id, answer = await self._call(("infer", endpoint, wire), regions)
        try:
            return encode(response_from_wire(link, answer))
        finally:
            if not link.closed:
                link.send("done", request_id)

    async def forward(
        self, scope: dict[str, Any], body: bytes, on_part: Callable[[Message], None]
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """An HTTP request the server's own application answers (its ASGI scope as
        builtins, and its whole body): (status, headers, body). A streamed answer's start,
        ("start", id, status, headers), and its chunks, ("part", id, bytes), go to
        `on_part` as they come; what is returned then holds the rest of the body."""
        link = self.link
        regions: list[Region] = []
        placed = link.place(memoryview(body), regions)
        request_id, answer = await self._call(("asgi", scope, placed), regions, on_part)
        try:
            status, headers, content = answer
            return (
                int(status),
                [(bytes(k), bytes(v)) for k, v in headers],
                bytes(link.view(content)),
            )
        finally:
            if not link.closed:
                link.send("done", request_id)

    async def _call(
        self,
        message: tuple[Any, ...],
        regions: list[Region],
        on_part: Callable[[Message], None] | None = None,
    ) -> tuple[int, Any]:
        """Send (kind, request id, *fields) and wait for its answer; `regions` hold the
        request's data until the server has answered; `on_part` gets what comes before."""
        link = self.link
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            link.send(message[0], request_id, *message[1:])
        except LinkClosed:
            link.release(regions)
            raise _unavailable() from None
        self._waiting[request_id] = future
        self._regions[request_id] = regions
        if on_part is not None:
            self._parts[request_id] = on_part
        try:
            return request_id, await future
        except asyncio.CancelledError:
            if not link.closed:
                # The server answers it as cancelled; its inputs stay until then.
                link.send("cancel", request_id)
            raise
        finally:
            self._parts.pop(request_id, None)

    def _received(self, message: Message) -> None:
        kind, request_id = message[0], message[1]
        if kind in ("start", "part"):
            on_part = self._parts.get(request_id)
            if on_part is not None:
                on_part(message)
            return
        regions = self._regions.pop(request_id, None)
        if regions:
            self.link.release(regions)  # the server has let go of the inputs
        future = self._waiting.pop(request_id, None)
        if kind == "ok":
            if future is None or future.done():
                self.link.send("done", request_id)  # nobody waits for it any more
            else:
                future.set_result(message[2])
        elif kind == "err":
            if future is not None and not future.done():
                code, text, reason = message[2], message[3], message[4]
                future.set_exception(
                    ServerError(
                        ErrorCode(code), text, None if reason is None else FailureReason(reason)
                    )
                )
        else:
            log.error("the server sent an unknown message %r", kind)

    def _closed(self) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(_unavailable())
        self._waiting.clear()
        self._on_closed()
