"""Triton's test hooks TRITONSERVER_DELAY_SCHEDULER and TRITONSERVER_BACKLOG_DELAY_SCHEDULER
in the sequence batcher: no batch forms until enough requests are queued, once.

As in Triton's sequence_batch_scheduler.cc: under `direct`, the count is of the requests
queued in the sequence slots of every instance of the model (the backlog not included),
and once it is reached every instance is let go; a backlog count, when set, must be met
too, by the requests in the backlog. Under `oldest`, each instance's own dynamic batcher
honours the delay: an instance waits until that many of its sequences have a request
ready, and the backlog count does not apply.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

from .sequence_config import Strategy
from .sequence_slots import ActiveSequence, Instance


class DelayHold:
    def __init__(
        self, strategy: Strategy, instances: Sequence[Instance], count: int, backlog_count: int
    ) -> None:
        self._direct = strategy is Strategy.DIRECT
        self._instances = instances
        self._backlog_count = max(backlog_count, 0) if self._direct else 0
        for instance in instances:
            instance.hold = max(count, 0)
        # Read on every request the batcher takes: kept, not counted each time.
        self.active = count > 0 and bool(instances)

    def holds(self, instance: Instance, backlog: collections.deque[ActiveSequence]) -> bool:
        """Whether `instance` must not form a batch yet; the hold ends for good once met."""
        if not instance.hold:
            return False
        if not self._direct:
            ready = [s.sequence for s in instance.slots if s.sequence is not None]
            if sum(bool(s.queue) and not s.running for s in ready) < instance.hold:
                return True
            instance.hold = 0
            self.active = any(each.hold for each in self._instances)
            return False
        queued = sum(
            len(slot.sequence.queue)
            for each in self._instances
            for slot in each.slots
            if slot.sequence is not None
        )
        if queued < instance.hold:
            return True
        if self._backlog_count and sum(len(s.queue) for s in backlog) < self._backlog_count:
            return True
        for each in self._instances:
            each.hold = 0
        self.active = False
        return False
