"""How a stopping server drains its front ends: refuse new work in a way a client can retry,
finish what was taken in, and only then close the connections.

Closing at once is what turns a stop into errors that a client cannot tell from a failure.
grpc.aio's `server.stop(grace)` closes the listener and grpc core drops, as CANCELLED, every
call that has arrived but that no handler has picked up yet, and every call that reaches it
before the client reads the GOAWAY that follows (a few milliseconds on a busy host).
uvicorn's shutdown closes each idle keep-alive connection, so a request that the client
sends on one at that moment is lost with the connection (reset, or closed without an
answer). A client cannot know whether such a request ran, so it cannot safely send it again.

So each front end has a `DrainGate`. At the signal the gate closes and everything new is
refused: gRPC answers UNAVAILABLE ("Server is shutting down") while its listener stays
open; HTTP closes its listener (a refused connection is unambiguous) and answers a request
on a connection that is already open 503 with `Connection: close`. Both are retryable.
Calls already admitted run to completion (gRPC counts them here; uvicorn tracks its own).
Then the front end lingers, still refusing, until no request has been refused for
`QUIET_S`: a client that was between two requests when its last answer came has sent the
next one, been told, and gone elsewhere by then. Only then are the connections closed. The
linger is bounded by `LINGER_MAX_S` and by the exit timeout, so that a client that retries
without end cannot hold the process; such a client may still meet grpc core's CANCELLED
when the connections finally close.

What is still running when the exit timeout runs out, the core ends with UNAVAILABLE
(server/inference/cutoff.py), and the front ends answer it as any error. They wait
`ANSWER_S` more for those answers to leave before they close the connections, which
cancels whatever is left: without that, the closing front end would cancel the requests
first, and their clients would get a 500 or a cut stream rather than the error.

An open gate costs an admitted call one flag test and a counter on each side; the future
that a drain waits on exists only while it waits.
"""

from __future__ import annotations

import asyncio
import time
from typing import Final

from ..errors import shutting_down

# How long no refused request must arrive before connections close, and the longest a
# front end lingers for that.
QUIET_S: Final = 0.1
LINGER_MAX_S: Final = 1.0
# How long past the exit timeout the front ends wait for the answers of the requests the
# core ended then (an answer is written at once; this bounds a client that reads slowly).
ANSWER_S: Final = 1.0


class DrainGate:
    """Admits calls until it closes, and knows when the admitted ones have all ended and
    refusals have gone quiet."""

    def __init__(self) -> None:
        self._open = True
        self._active = 0
        self._idle: asyncio.Future[None] | None = None
        self._refused_at = 0.0

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def active(self) -> int:
        """Admitted calls that have not ended yet."""
        return self._active

    def enter(self) -> None:
        """Admit one call, to be matched by `leave()`; a ServerError (UNAVAILABLE) once
        the gate is closed."""
        if not self._open:
            self.refused()
            raise shutting_down()
        self._active += 1

    def leave(self) -> None:
        self._active -= 1
        if not self._active and self._idle is not None and not self._idle.done():
            self._idle.set_result(None)

    def refused(self) -> None:
        """Note a request refused because the gate is closed (the linger waits for quiet)."""
        self._refused_at = time.monotonic()

    def close(self) -> None:
        """Admit no further call; those already admitted go on."""
        if self._open:
            self._open = False
            self._refused_at = time.monotonic()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no admitted call is left: True, or False when `timeout_s` ran out."""
        if not self._active:
            return True
        if self._idle is None or self._idle.done():
            self._idle = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._idle), max(timeout_s, 0.0))
        except TimeoutError:
            return False
        return True

    async def linger(self, timeout_s: float) -> None:
        """Wait until `QUIET_S` has passed since the gate closed or last refused a request,
        for at most `LINGER_MAX_S` and at most `timeout_s`."""
        deadline = time.monotonic() + min(timeout_s, LINGER_MAX_S)
        while True:
            wait = min(self._refused_at + QUIET_S, deadline) - time.monotonic()
            if wait <= 0:
                return
            await asyncio.sleep(wait)
