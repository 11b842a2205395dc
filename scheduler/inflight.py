"""The requests a scheduler has accepted and not yet answered, and the gate that closes it.

The direct and the ensemble scheduler hold no queue of their own: a request is in flight
from `submit` until it returns. `InFlight` counts those, refuses new ones once the
scheduler closes (SchedulerClosed, UNAVAILABLE to the client), and lets `close` wait for
the ones in flight within the drain timeout. The dynamic batcher keeps its own count, as
its batches outlive the calls that queued them.
"""

from __future__ import annotations

import asyncio
import contextlib

from ge_serve.server.errors import SchedulerClosed


class InFlight:
    def __init__(self) -> None:
        self.pending = 0
        self.closing = False
        self._drained = asyncio.Event()
        self._drained.set()

    # admit/leave rather than a @contextmanager: a generator-based context manager costs
    # several µs per request on the hot path, more than the count itself.
    def admit(self) -> None:
        """One request admitted; refused once closing. Pair with `leave` in a finally."""
        if self.closing:
            raise SchedulerClosed()
        self.pending += 1
        self._drained.clear()

    def leave(self) -> None:
        """The admitted request has been answered."""
        self.pending -= 1
        if self.pending == 0:
            self._drained.set()

    async def close(self, drain_timeout_s: float) -> None:
        """Refuse new requests; wait until those in flight are answered, or the timeout."""
        self.closing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained.wait(), drain_timeout_s)
