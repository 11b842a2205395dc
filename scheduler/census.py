"""Who can still join a batch: per batching key, the samples in the server and the clients
seen, for the adaptive controller.

A batch holds requests of one key (one shape, or one shape bucket: former.py), so waiting
can grow it only by requests of that key. The arrival model (arrivals.py) counts every
client, whatever it sends: with 32 clients of 32 lengths and exact shapes, it sees
clients outside to wait for while none of them can join the batch forming. So the
batcher also counts, per key, the samples in the server (queued or executing) and their
peak, and the controller waits only for the key's clients outside: the peak less those
in the server (`ShapeCensus.outside`), never more than the arrival model's count.

The peak is the count of the key's clients (under closed-loop load every client of a key
is in the server at some point). It forgets a client gone for good slowly and in steps:
each batch of the key that leaves takes `PEAK_FORGET` off it, unless as many were in the
server as it counted, and it counts to the nearest whole client. A key with no departure
yet says nothing (-1): its clients are not known, and any client outside may send it.

Keys are kept while any of their samples are in the server; past `MAX_KEYS`, a key whose
samples all left is dropped, peak and all (its next batch then goes as Triton's rules
would send it, until it has left once again).
"""

from __future__ import annotations

from collections.abc import Hashable

# Taken off a key's peak by each of its batches that leaves with fewer of its samples in
# the server than the peak counts: a client gone for good is forgotten after a few of
# its key's batches (1 of 4 in three), one merely outside when a batch leaves is not.
PEAK_FORGET = 0.25
# Keys with nothing in the server kept at most (their peaks): distinct shapes are
# unbounded (every image size, every sequence length), the memory must not be.
MAX_KEYS = 1024


class ShapeCensus:
    """Samples in the server and the peak of them, per batching key. Loop-only."""

    __slots__ = ("_came", "_held", "_peak")

    def __init__(self) -> None:
        self._held: dict[Hashable, int] = {}
        # Samples of each key that ever arrived (kept while any are in the server): how
        # many joined since a decision, without going through the queue.
        self._came: dict[Hashable, int] = {}
        # Only keys that have left at least once (before that, their clients are unknown).
        self._peak: dict[Hashable, float] = {}

    def arrived(self, key: Hashable, size: int) -> None:
        held = self._held.get(key, 0) + size
        self._held[key] = held
        self._came[key] = self._came.get(key, 0) + size
        peak = self._peak.get(key)
        if peak is not None and held > peak:
            self._peak[key] = held

    def left(self, key: Hashable, size: int) -> None:
        """`size` samples of `key` left, as one batch (or one request dropped)."""
        before = self._held.get(key, 0)
        held = max(before - size, 0)
        # Moved to the end: the peaks stay ordered from the longest unused key.
        peak = self._peak.pop(key, 0.0)
        self._peak[key] = max(peak - PEAK_FORGET, float(before))
        if held:
            self._held[key] = held
            return
        self._held.pop(key, None)
        self._came.pop(key, None)
        if len(self._peak) > MAX_KEYS:
            self._forget_one()

    def _forget_one(self) -> None:
        """Drops the peak of the key longest without a departure that has nothing in the
        server (keys in use stay known)."""
        for key in self._peak:
            if key not in self._held:
                del self._peak[key]
                return

    def outside(self, key: Hashable) -> int:
        """Samples of `key` that may still arrive: its clients outside the server, or -1
        while they are unknown (nothing of the key has left yet)."""
        peak = self._peak.get(key)
        if peak is None:
            return -1
        return max(int(peak + 0.5) - self._held.get(key, 0), 0)

    def came(self, key: Hashable) -> int:
        """Samples of `key` that arrived since it last had nothing in the server."""
        return self._came.get(key, 0)
