"""The batch of the loop passes a request opens: the dynamic batcher's path for a server
with nothing queued.

Under Triton's rules with no `max_queue_delay_microseconds`, no preferred sizes, no
priorities, no queue policy and no `preserve_ordering`, whatever is queued goes the
moment a slot is idle, in arrival order, up to the largest batch, and a request of
another shape closes the batch ahead of it. The batch former (former.py) gets there a
loop pass after the first request: its task wakes, takes the slot, describes the queue
to the decider and takes the batch off it. For a request that finds nothing queued and a
slot idle the result is known in advance, so the batcher takes the slot at once and
opens a `Turn`; the requests that arrive while it is open join it while they fit, and
none of them is queued.

The turn's batch goes at the end of the first whole loop pass, its I/O included, that
brought it no request; at the end of the pass in which it filled up or a request could
not join; and after MAX_PASSES passes at the latest. A loop pass runs the callbacks that
were ready when it began, then polls the sockets, and what that poll wakes runs in the
next pass: so the requests a pass's I/O brings are known two checks after the turn
opened, not one. Under load concurrent requests reach the batcher a pass or two apart (a
gRPC call is started in one pass and reads its message in a later one), and a batch
sent at the end of the first pass would have split them. A lone request pays one more
pass, a poll that does not wait.

A request that cannot join (too large, another shape) closes the turn and queues, so
that no later request overtakes it. A turn's requests count as pending from the start;
a batcher that closes sends an open turn's batch at once (`flush`) and waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from .dispatch import ExecutorSlot, SlotPool
from .policy import BatchPolicy, QueuePolicy
from .queue import Entry, EntryState

Launch = Callable[[ExecutorSlot, list[Entry]], None]

# The most loop passes a turn's batch waits, while each brings another request: enough for
# the calls of one burst of concurrent clients to meet, few enough that no request waits
# long behind a stream of arrivals.
MAX_PASSES: Final = 4


class Turns:
    """One batcher's open turn, if any: opened on an idle slot, joined by the requests of
    the loop passes that follow while they keep coming, handed to `launch` at its end."""

    __slots__ = ("_launch", "_max_size", "_open", "_pool")

    def __init__(self, pool: SlotPool, max_size: int, launch: Launch) -> None:
        self._pool = pool
        self._max_size = max_size
        self._launch = launch
        self._open: Turn | None = None

    def gather(self, entry: Entry, waiting: object) -> bool:
        """Take a request into this turn's batch; False: it queues as any other.
        `waiting`: something is queued, or the batcher holds batching back."""
        turn = self._open
        if turn is None:
            slot = None if waiting else self._pool.try_acquire()
            if slot is None:
                return False
            turn = self._open = Turn(slot, entry)
            asyncio.get_running_loop().call_soon(self._pass, turn)
        elif not turn.join(entry, self._max_size):
            return False
        # Bound to its slot from now on: a cancelled one runs and its result is dropped.
        entry.state = EntryState.RUNNING
        return True

    def flush(self) -> None:
        """Send the open turn's batch now: its batcher is closing, and the slots close
        after the passes the batch might still have waited."""
        if self._open is not None:
            self._send(self._open)

    def _pass(self, turn: Turn) -> None:
        """The end of a loop pass since the turn opened: its batch goes unless the pass
        brought it another request and it may still wait."""
        if turn is not self._open:
            return  # already sent by flush
        joined = len(turn.entries)
        if (
            joined == turn.seen
            or turn.closed
            or turn.samples >= self._max_size
            or turn.passes >= MAX_PASSES
        ):
            self._send(turn)
            return
        turn.seen = joined
        turn.passes += 1
        asyncio.get_running_loop().call_soon(self._pass, turn)

    def _send(self, turn: Turn) -> None:
        self._open = None
        self._launch(turn.slot, turn.entries)


def gathering(policy: BatchPolicy, pool: SlotPool, launch: Launch) -> Turns | None:
    """The turn path of a batcher under Triton's rules, when no rule makes a request wait."""
    if pool.rate_limited or not no_rule_waits(policy):
        return None
    return Turns(pool, policy.max_size, launch)


class Turn:
    """The batch gathering the requests of the passes it is open for, on the slot it
    holds."""

    __slots__ = ("closed", "entries", "key", "passes", "samples", "seen", "slot")

    def __init__(self, slot: ExecutorSlot, entry: Entry) -> None:
        self.slot = slot
        self.entries = [entry]
        self.samples = entry.size
        # Its shape key, computed when a second request asks to join (None until then).
        self.key: object = None
        # Set once a request could not join: the ones after it queue behind it.
        self.closed = False
        # Requests it had at the last check (none before the first: the opening pass's
        # I/O is not known yet), and the checks so far.
        self.seen = 0
        self.passes = 1

    def join(self, entry: Entry, max_size: int) -> bool:
        """Add a request of the same turn; False when it cannot join (too large, another
        shape), which closes the turn: the requests after it queue behind it."""
        if self.closed or self.samples + entry.size > max_size:
            self.closed = True
            return False
        if self.key is None:
            self.key = self.entries[0].item.shape_key()
        if entry.item.shape_key() != self.key:
            self.closed = True
            return False
        self.entries.append(entry)
        self.samples += entry.size
        return True


def no_rule_waits(policy: BatchPolicy) -> bool:
    """Whether Triton's rules send whatever is queued the moment a slot is idle, in
    queue order, and no queue limit or timeout can touch a request that waits one turn."""
    if policy.max_queue_delay_us or policy.preferred_sizes or policy.preserve_ordering:
        return False
    if policy.priority_levels:
        return False
    queue_policies = (*policy.levels.values(), policy.default_policy)
    return all(q == QueuePolicy() for q in queue_policies)
