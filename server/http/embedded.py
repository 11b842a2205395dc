"""uvicorn embedded in the server's own event loop, beside the other servers on it.

The composition root (server/app.py) runs the HTTP front end and the metrics endpoint
each on one of these, on the loop that also runs gRPC and the core. `front_end_config` is
how every HTTP server of ge-serve runs uvicorn, an HTTP worker's (worker.py) included.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Generator
from typing import Any

import uvicorn

from ..control.stopping import ANSWER_S, DrainGate
from .protocol import TritonHttpProtocol


def front_end_config(app: Any, grace_s: float, **address: Any) -> uvicorn.Config:
    """uvicorn's settings for an HTTP front end on a loop of ours, which waits up to
    `grace_s` for the requests in flight when it stops; `address`: host and port, where
    uvicorn logs them. uvicorn leaves logging alone: its loggers are set once per process
    (control/uvicornlogs.py), and its lines go to the server's log."""
    return uvicorn.Config(
        app,
        loop="none",
        lifespan="off",
        log_config=None,
        log_level=None,
        access_log=True,
        # uvicorn types this as int, but waits with asyncio.wait_for: a float works and
        # int() would turn --exit-timeout-secs 0.5 into "cancel at once".
        timeout_graceful_shutdown=grace_s,  # type: ignore[arg-type]
        http=TritonHttpProtocol,
        ws="none",
        # No X-Forwarded-* rewriting: nothing here uses the client address, and the
        # middleware costs every request.
        proxy_headers=False,
        # Triton's HTTP server sends neither; uvicorn would check both on every response.
        server_header=False,
        date_header=False,
        **address,
    )


class EmbeddedUvicorn(uvicorn.Server):
    """A uvicorn server that leaves signal handling to us, so several servers share a loop.

    Given a gate, it stops the way server/control/stopping.py describes: it closes its
    listener, then lingers while the front end refuses requests on the connections already
    open, and only then closes those, all within the deadline `stop()` sets.

    It is driven through `serve(sockets=...)`, uvicorn's way to embed a server in a loop
    of one's own, and stopped through `should_exit`, which uvicorn's main loop polls.
    Two of its methods are overridden, because uvicorn has no setting for either:
    `capture_signals` (see there) and `shutdown`, whose first step (close the listeners)
    must be followed by the linger before uvicorn asks the open connections to close.
    Both are public methods of `uvicorn.Server` that `serve()` calls; the e2e tests of
    stopping (tests/e2e/test_shutdown_drain.py) notice if a uvicorn release
    changes that order.
    """

    def __init__(self, config: uvicorn.Config, gate: DrainGate | None = None) -> None:
        super().__init__(config)
        self.gate = gate
        self.deadline: float | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn's serve() puts its own SIGINT and SIGTERM handlers in place for as long
        # as it runs (on the main thread) and raises the signals again when it returns.
        # Several servers share this loop, and the composition root (server/app.py) owns
        # the signals: one stop, every part in order. So none are taken here.
        yield

    def stop(self, deadline: float) -> None:
        """Begin a graceful stop: the requests in flight have until `deadline`
        (time.monotonic()), the exit timeout, and their answers ANSWER_S more."""
        self.deadline = deadline
        if self.gate is not None:
            self.gate.close()
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn's own shutdown closes the listeners, asks every connection to close and
        # waits up to timeout_graceful_shutdown. The linger goes between the first two
        # steps, so the first is done here (uvicorn doing it again is harmless: closing a
        # closed server or socket does nothing).
        if self.deadline is not None:
            if self.gate is not None:
                for server in self.servers:
                    server.close()
                for sock in sockets or []:
                    sock.close()
                await self.gate.linger(self.deadline - time.monotonic())
            # Read here by uvicorn, as it waits for the requests in flight (a float works,
            # see front_end_config). Past the deadline the core ends what still runs, and
            # the answers get ANSWER_S to leave before uvicorn cancels (stopping.py).
            left = max(self.deadline + ANSWER_S - time.monotonic(), 0.0)
            self.config.timeout_graceful_shutdown = left  # type: ignore[assignment]
        await super().shutdown(sockets)
