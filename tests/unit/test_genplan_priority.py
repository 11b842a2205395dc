"""The engine's scheduling policies (scheduler/genplan.py): `fcfs`, arrival order, where a
preempted sequence goes back to the queue's front and the newest running one is the
victim; `priority` (vLLM's), the waiting queue by (priority, arrival) and the victim the
running sequence of the largest; and the request's `priority` sampling key."""

from __future__ import annotations

import random
from collections import deque

import pytest
from engineseqs import sequence as seq

from ge_serve.backends.llm.kvcache import BlockAllocator
from ge_serve.backends.llm.sampling import (
    SamplingError,
    sampling_params,
)
from ge_serve.backends.llm.settings import SamplingDefaults
from ge_serve.scheduler.genplan import Limits, enqueue, plan_step, rank
from ge_serve.scheduler.genseq import Sequence

DEFAULTS = SamplingDefaults(max_tokens=16, temperature=1.0, top_p=1.0, top_k=0)


def limits(priority: bool, seqs: int = 8) -> Limits:
    return Limits(block_size=4, max_num_seqs=seqs, max_num_batched_tokens=64,
                  batching="iteration", priority=priority)  # fmt: skip


def decoding(allocator: BlockAllocator, serial: int, priority: int) -> Sequence:
    """A running sequence of 8 computed tokens in 2 blocks, whose next token needs a third."""
    found = seq(serial, 8, priority, computed=8)
    found.blocks = allocator.allocate(2) or []
    found.tokens.append(1)
    return found


@pytest.mark.parametrize(
    ("priority", "order"),
    [(False, [0, 1, 2, 3]), (True, [1, 3, 0, 2])],
)
def test_the_queue_is_arrival_order_or_priority_then_arrival(
    priority: bool, order: list[int]
) -> None:
    waiting: deque[Sequence] = deque()
    enqueue(waiting, [seq(0, 3, 5), seq(1, 3, -1)], limits(priority))
    enqueue(waiting, [seq(2, 3, 5), seq(3, 3, 0)], limits(priority))
    assert [s.serial for s in waiting] == order
    running: list[Sequence] = []
    plan = plan_step(running, waiting, BlockAllocator(32), limits(priority, seqs=2))
    assert [s.serial for s in plan.admitted] == order[:2]
    assert [s.serial for s in waiting] == order[2:]


class Watched(deque[Sequence]):
    """A queue that counts inserts into its middle (each one a pass over the deque)."""

    inserts = 0

    def insert(self, i: int, x: Sequence) -> None:
        self.inserts += 1
        super().insert(i, x)


@pytest.mark.parametrize("priority", [False, True])
def test_a_burst_keeps_the_order_in_one_merge(priority: bool) -> None:
    shuffled = random.Random(7)
    serials = list(range(600))
    shuffled.shuffle(serials)
    bursts = [
        [seq(serial, 3, shuffled.randint(-3, 3)) for serial in serials[at : at + 200]]
        for at in (0, 200, 400)
    ]
    waiting = Watched()
    for burst in bursts:
        enqueue(waiting, burst, limits(priority))
    given = [s for burst in bursts for s in burst]
    # fcfs: as they came; priority: (priority, arrival), each burst merged in, not inserted.
    assert list(waiting) == (sorted(given, key=rank) if priority else given)
    assert waiting.inserts == 0


@pytest.mark.parametrize(
    ("priority", "victim", "queue"),
    # fcfs: the newest (1) goes to the queue's front; priority: the lowest-priority (0)
    # goes back by its rank, between the waiting ones of priority 0 and 9.
    [(False, 1, [1, 2, 3]), (True, 0, [2, 0, 3])],
)
def test_the_victim_is_the_newest_or_the_lowest_priority(
    priority: bool, victim: int, queue: list[int]
) -> None:
    allocator = BlockAllocator(5)
    old, new = decoding(allocator, 0, priority=5), decoding(allocator, 1, priority=0)
    # One block free: the first to ask gets it, the second preempts.
    running = [old, new]
    waiting: deque[Sequence] = deque()
    enqueue(waiting, [seq(2, 30, 0), seq(3, 30, 9)], limits(priority))
    plan = plan_step(running, waiting, allocator, limits(priority, seqs=2))
    assert [s.serial for s in plan.preempted] == [victim]
    assert [s.serial for s in plan.decode] == [1 - victim]
    assert [s.serial for s in running] == [1 - victim]
    assert [s.serial for s in waiting] == queue
    lost = plan.preempted[0]
    assert lost.computed == 0 and not lost.blocks and lost.preemptions == 1
    assert len(running[0].blocks) == 3


def test_under_priority_a_sequence_that_preempts_itself_lets_the_others_go_on() -> None:
    # The low-priority sequence, running first, is its own victim when it needs a block:
    # the higher-priority one after it still decodes (vLLM's `continue`).
    allocator = BlockAllocator(4)
    low, high = decoding(allocator, 0, priority=3), decoding(allocator, 1, priority=-1)
    running, waiting = [low, high], deque[Sequence]()
    plan = plan_step(running, waiting, allocator, limits(True))
    assert plan.preempted == [low] and plan.decode == [high] and running == [high]
    assert list(waiting) == [low]


@pytest.mark.parametrize(("given", "found"), [(b'{"priority": -7}', -7), (b'{"priority": "3"}', 3),
                                              (b"{}", 0)])  # fmt: skip
def test_priority_is_a_sampling_parameters_key(given: bytes, found: int) -> None:
    assert sampling_params(DEFAULTS, {}, given, None).priority == found


def test_a_request_parameter_priority_is_not_the_engines() -> None:
    # Triton's request priority (its levels, read by the core) never reaches the queue.
    assert sampling_params(DEFAULTS, {"priority": 2}, None, None).priority == 0


@pytest.mark.parametrize("value", [b'"high"', b"1.5", b"true", str(2**63).encode()])
def test_a_bad_priority_is_refused(value: bytes) -> None:
    with pytest.raises(SamplingError, match="priority"):
        sampling_params(DEFAULTS, {}, b'{"priority": ' + value + b"}", None)
