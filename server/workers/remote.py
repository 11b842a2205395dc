"""A front-end worker's way into the server's core: `infer` over the process link.

The worker's front end calls `RemoteCore.infer` where the server's calls
`InferenceServer.infer`; the request runs in the server process (pool.py) and its
response or its ServerError comes back the same. A request whose caller goes away is
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

import msgspec

from ge_serve.link.frames import LinkClosed
from ge_serve.link.loop import LoopLink
from ge_serve.link.messages import Message, Ready, Region

from ..errors import ErrorCode, FailureReason, ServerError
from ..inference.types import InferRequest, InferResponse
from .codec import request_to_wire, response_from_wire
from .messages import (
    INLINE_MAX,
    TO_WORKER,
    Answer,
    Cancel,
    Done,
    Failed,
    Forward,
    Forwarded,
    Headers,
    Infer,
    Part,
    Start,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
# What a streamed HTTP answer's start and chunks go to, as they come.
OnPart = Callable[[Start | Part], None]


def _unavailable() -> ServerError:
    return ServerError(ErrorCode.UNAVAILABLE, "the server process is not reachable")


class RemoteCore:
    def __init__(self, sock: socket.socket, label: str, on_closed: Callable[[], None]) -> None:
        self.link = LoopLink(sock, TO_WORKER, label, self._received, self._closed, INLINE_MAX)
        self._on_closed = on_closed
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._regions: dict[int, list[Region]] = {}
        self._parts: dict[int, OnPart] = {}

    def ready(self, failure: str | None = None) -> None:
        """Tell the server this worker listens (or why it cannot): its health signal."""
        self.link.send(Ready(failure))

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
            link.free(regions)
            raise _unavailable() from None
        request_id = next(self._ids)
        answer = await self._call(Infer(request_id, endpoint, wire), regions)
        try:
            return encode(response_from_wire(link, answer.response))
        finally:
            if not link.closed:
                link.send(Done(request_id))

    async def forward(
        self, scope: dict[str, Any], headers: Headers, body: bytes, on_part: OnPart
    ) -> tuple[int, Headers, bytes]:
        """An HTTP request the server's own application answers (its ASGI scope as
        builtins, and its whole body): (status, headers, body). A streamed answer's
        `Start` and `Part`s go to `on_part` as they come; what is returned then holds the
        rest of the body."""
        link = self.link
        regions: list[Region] = []
        placed = link.place(memoryview(body), regions)
        request_id = next(self._ids)
        answer = await self._call(Forward(request_id, scope, headers, placed), regions, on_part)
        try:
            return answer.status, answer.headers, bytes(link.view(answer.body))
        finally:
            if not link.closed:
                link.send(Done(request_id))

    async def _call(
        self, message: Infer | Forward, regions: list[Region], on_part: OnPart | None = None
    ) -> Any:
        """Send the request and wait for its answer; `regions` hold the request's data
        until the server has answered; `on_part` gets what comes before."""
        link = self.link
        request_id = message.id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            link.send(message)
        except LinkClosed:
            link.free(regions)
            raise _unavailable() from None
        except (msgspec.EncodeError, OverflowError, TypeError) as exc:
            link.free(regions)
            text = f"the request cannot be passed on: {exc}"
            raise ServerError(ErrorCode.INVALID_ARG, text) from None
        self._waiting[request_id] = future
        self._regions[request_id] = regions
        if on_part is not None:
            self._parts[request_id] = on_part
        try:
            return await future
        except asyncio.CancelledError:
            if not link.closed:
                # The server answers it as cancelled; its inputs stay until then.
                link.send(Cancel(request_id))
            raise
        finally:
            self._parts.pop(request_id, None)

    def _received(self, message: Message) -> None:
        if isinstance(message, Start | Part):
            on_part = self._parts.get(message.id)
            if on_part is not None:
                on_part(message)
            return
        if not isinstance(message, Answer | Forwarded | Failed):
            log.error("the server sent an unexpected message %r", type(message).__name__)
            return
        regions = self._regions.pop(message.id, None)
        if regions:
            self.link.free(regions)  # the server has let go of the inputs
        future = self._waiting.pop(message.id, None)
        if isinstance(message, Failed):
            if future is not None and not future.done():
                reason = None if message.reason is None else FailureReason(message.reason)
                future.set_exception(ServerError(ErrorCode(message.code), message.message, reason))
        elif future is None or future.done():
            self.link.send(Done(message.id))  # nobody waits for it any more
        else:
            future.set_result(message)

    def _closed(self) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(_unavailable())
        self._waiting.clear()
        self._on_closed()
