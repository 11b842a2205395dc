"""More than one open request for ModelInfer calls, so that grpc core can hand the event
loop every call that has arrived at once, rather than one per loop wakeup.

grpc.aio's server keeps one request for new calls open per registered method, and one
for every other method together: when a call arrives, core completes that request, the
poller thread wakes the loop, the serving loop starts the call and only then asks core for
the next one. Concurrent clients' calls therefore start one loop wakeup apart, and each
ModelInfer reaches the scheduler alone, with nothing to batch with. Its serving loop also
waits on every open request with `asyncio.wait` and wraps each request in a task of its
own, once per call.

`CallIntake` keeps `depth` more requests open for ModelInfer, each in a coroutine that
starts the calls it is handed through grpc.aio's own call path (interceptors,
cancellation, error handling, the call's release), and then asks again. Calls that
arrive together start together, and the scheduler can batch them. Unlike grpc.aio's
loop it counts no calls against `maximum_concurrent_rpcs` (ge-serve sets no such limit),
and it hands every call the one method's handler, whatever call details an interceptor
passes on.

This reaches into grpc.aio's private layer (`AioServer._request_registered_call`,
`cygrpc._handle_rpc`, `cygrpc._schedule_rpc_coro`), whose shape changes between grpcio
releases. `attach` checks that shape first; where it differs the server logs why and
serves with grpc.aio's own single request, correct and slower. A test fails when the
installed grpcio lacks it, so that the fall-back is never silent in CI.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Sequence
from typing import Any, Final

import grpc
import grpc.aio
from grpc._cython import cygrpc

log = logging.getLogger(__name__)

# Open requests per server. More than the clients that call at once gains nothing: each
# costs core one small call record while it waits.
DEPTH: Final = 16
# How long `close` waits for the requests that core fails as its server stops.
CLOSE_WAIT_S: Final = 1.0

# The private functions' parameters, as grpc.aio's serving loop calls them.
_HANDLE_RPC: Final = (
    "method_name",
    "method_resolver",
    "interceptors",
    "rpc_state",
    "loop",
    "concurrency_exceeded",
)
_SCHEDULE_RPC: Final = ("rpc_coro", "rpc_state", "loop", "method_name")


def missing_internals() -> str | None:
    """Why the installed grpcio cannot take calls this way, or None when it can."""
    if not hasattr(cygrpc.AioServer, "_request_registered_call"):
        return "AioServer has no _request_registered_call"
    for name, expected in (("_handle_rpc", _HANDLE_RPC), ("_schedule_rpc_coro", _SCHEDULE_RPC)):
        function = getattr(cygrpc, name, None)
        if function is None:
            return f"cygrpc has no {name}"
        try:
            parameters = tuple(inspect.signature(function).parameters)
        except (TypeError, ValueError):
            return f"cygrpc.{name} has no signature"
        if parameters != expected:
            return f"cygrpc.{name} takes {parameters}, not {expected}"
    if not hasattr(cygrpc, "_RequestCallError"):
        return "cygrpc has no _RequestCallError"
    return None


class _OneMethod:
    """The method resolver grpc.aio's `_handle_rpc` asks: these requests only ever receive
    calls of the one registered method."""

    __slots__ = ("_handler",)

    def __init__(self, handler: grpc.RpcMethodHandler) -> None:
        self._handler = handler

    def resolve_handler(self, handler_call_details: Any) -> grpc.RpcMethodHandler:
        return self._handler


class CallIntake:
    """`depth` open requests for one unary method's calls on a grpc.aio server.

    `register` before the server starts, `attach` after; `close` after the server stopped.
    """

    def __init__(
        self,
        server: grpc.aio.Server,
        service: str,
        method: str,
        handler: grpc.RpcMethodHandler,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        depth: int = DEPTH,
    ) -> None:
        self._server: grpc.aio.Server | None = server
        self._service = service
        self._method_name = method
        self._path = f"/{service}/{method}"
        self._handler = handler
        self._interceptors = tuple(interceptors)
        self._depth = depth
        self._takers: list[asyncio.Task[None]] = []
        self._registered = False
        # Calls these requests were handed (grpc.aio's own request takes the others).
        self.taken = 0
        # grpc.aio's loop keeps its call tasks alive the same way: the loop holds only a
        # weak reference to a task.
        self._calls: set[asyncio.Task[None]] = set()

    @property
    def open_requests(self) -> int:
        """How many takers are waiting on core for a call."""
        return sum(1 for task in self._takers if not task.done())

    def register(self) -> None:
        """Make the method a registered one, which grpc core matches to its own requests;
        grpc.aio's loop keeps one of those open too."""
        assert self._server is not None, "register before the server starts"
        self._server.add_registered_method_handlers(
            self._service, {self._method_name: self._handler}
        )
        self._registered = True

    def registered_elsewhere(self) -> None:
        """The method was registered with the same handler by other code (the generated
        `add_..._to_server` registers every method)."""
        self._registered = True

    def attach(self) -> bool:
        """Open the requests, on the running loop; False (and a log line) where the
        installed grpcio cannot."""
        why = missing_internals()
        core = getattr(self._server, "_server", None)
        if why is None and not isinstance(core, cygrpc.AioServer):
            why = "grpc.aio.Server holds no AioServer"
        if why is None and not self._registered:
            why = f"{self._path} was not registered before the server started"
        if why is not None:
            log.warning(
                "gRPC %s calls start one per loop wakeup, as grpc.aio's own; grpcio %s: %s",
                self._method_name,
                grpc.__version__,
                why,
            )
            return False
        loop = asyncio.get_running_loop()
        self._takers = [
            loop.create_task(self._take(core, loop), name=f"grpc-intake-{self._method_name}")
            for _ in range(self._depth)
        ]
        return True

    async def close(self) -> None:
        """After the server stopped: core has failed the open requests, so the takers end;
        any still waiting after CLOSE_WAIT_S are cancelled."""
        takers, self._takers = self._takers, []
        if takers:
            _, waiting = await asyncio.wait(takers, timeout=CLOSE_WAIT_S)
            for task in waiting:
                task.cancel()
            for task in waiting:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # Let the stopped server go: grpc releases its poller thread once it is collected.
        self._server = None

    async def _take(self, core: Any, loop: asyncio.AbstractEventLoop) -> None:
        path = self._path.encode()
        resolver = _OneMethod(self._handler)
        while core.is_running():
            try:
                state = await core._request_registered_call(path)
            except cygrpc._RequestCallError:
                # Core fails the open requests as its server shuts down; while it still
                # runs, ask again, as grpc.aio's loop does.
                continue
            except Exception:
                # Anything else is persistent (asking again would spin); grpc.aio's own
                # request still takes calls.
                log.exception("gRPC %s: a call request failed", self._method_name)
                return
            self.taken += 1
            try:
                coro = cygrpc._handle_rpc(
                    self._path, resolver, self._interceptors, state, loop, False
                )
                call = loop.create_task(cygrpc._schedule_rpc_coro(coro, state, loop, self._path))
            except Exception:
                # The call core handed over is dropped (its client sees it end when the
                # server releases it); the taker goes on taking calls.
                log.exception("gRPC %s: a call could not be started", self._method_name)
                continue
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)
