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
from typing import TypeVar

import msgspec

from ge_serve.link.frames import LinkClosed
from ge_serve.link.loop import LoopLink
from ge_serve.link.messages import Message, Ready, Region

from ..errors import ErrorCode, FailureReason, ServerError
from ..inference.types import InferRequest, InferResponse
from .codec import request_to_wire, response_from_wire
from .messages import INLINE_MAX, TO_WORKER, Answer, Cancel, Done, Failed, Infer, Stop

log = logging.getLogger(__name__)

T = TypeVar("T")


def _unavailable() -> ServerError:
    return ServerError(ErrorCode.UNAVAILABLE, "the server process is not reachable")


class RemoteCore:
    def __init__(self, sock: socket.socket, label: str, stop: Callable[[], None]) -> None:
        """`stop` begins the worker's stop: called when the server says `Stop`, and when
        the link ends (the server is gone); it may be called twice."""
        self.link = LoopLink(sock, TO_WORKER, label, self._received, self._closed, INLINE_MAX)
        self._stop = stop
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Answer]] = {}
        self._regions: dict[int, list[Region]] = {}

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
        # Only outputs placed in the server's arena (not inline) are held there for us.
        held = any(isinstance(t.data, tuple) for t in answer.response.outputs)
        try:
            return encode(response_from_wire(link, answer.response))
        finally:
            if held and not link.closed:
                link.send(Done(request_id))

    async def _call(self, message: Infer, regions: list[Region]) -> Answer:
        """Send the request and wait for its answer; `regions` hold the request's data
        until the server has answered."""
        link = self.link
        request_id = message.id
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
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
        try:
            return await future
        except asyncio.CancelledError:
            if not link.closed:
                # The server answers it as cancelled; its inputs stay until then.
                link.send(Cancel(request_id))
            raise

    def _received(self, message: Message) -> None:
        if isinstance(message, Stop):
            self._stop()
            return
        if not isinstance(message, Answer | Failed):
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
        self._stop()
