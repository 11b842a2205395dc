"""Adaptive batching that sees the device: with several slots on a device that runs one
execution at a time, a slot's batch forms when the device is about to free, not when
the slot does, unless no request that could join it (one of its own key) can come. The
decider on synthetic measurements, then the batcher through submit()."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

import pytest
from fake_executor import FakeExecutor, item, make_config, queued

from ge_serve.scheduler.adaptive import AdaptiveController, AdaptiveDecider
from ge_serve.scheduler.batcher import DynamicBatcher
from ge_serve.scheduler.budgets import AUTO_BUDGET_MAX_NS
from ge_serve.scheduler.choice import DEVICE_LEAD, FILL_SLACK_NS
from ge_serve.scheduler.decision import BatchView, Take, WaitUntil
from ge_serve.scheduler.dispatch import Executing, ExecutorSlot, SlotPool
from ge_serve.scheduler.policy import BatchPolicy

pytestmark = pytest.mark.timeout(30)

MS = 1_000_000
# How long a batch handed over behind another waits on the device in the test that checks
# it is not priced for that wait (the rest of its slot time is a loop turn or two).
WAIT_AHEAD_S = 0.5
# Every batch, whatever its size, is measured at this: batching pays. Longer than any
# test waits for an execution to start (GATE_TIMEOUT_S): a batch held for the device goes
# only because the execution ahead ended, never because the estimate ran out.
COST_NS = 60_000 * MS


def policy(max_batch_size: int = 8) -> BatchPolicy:
    config = make_config(max_batch_size=max_batch_size, parameters={"adaptive_batching": "true"})
    return BatchPolicy.from_config(config)


def measured(batch_policy: BatchPolicy, now: int) -> AdaptiveController:
    """A controller that has measured its costs and seen 16 clients, all outside now."""
    controller = AdaptiveController(batch_policy)
    for size in (1, 2, 4, 8):
        controller.cost.record(size, COST_NS)
    for _ in range(16):
        controller.arrivals.record_arrival(now, 1, 0)
    controller.arrivals.record_departure(now, 16)
    return controller


def view(
    queued_samples: int, now: int, on_device: Sequence[Executing] = (), full: bool = False
) -> BatchView:
    """One queued request of `queued_samples` heading the batch, no other slot idle."""
    head = object()
    return BatchView(
        totals=(queued_samples,),
        oldest_ns=now,
        level=0,
        head_samples=queued_samples,
        idle_slots=0,
        idle_since_ns=now,
        full=full,
        head=head,
        on_device=tuple(on_device),
    )


def test_a_batch_waits_for_the_device_to_be_about_to_free() -> None:
    now = time.monotonic_ns()
    decider = AdaptiveDecider(measured(policy(), now))
    # Another slot's batch of 4 went to the device 1 s ago: it is expected to end at
    # 1 s + COST_NS from now. The batch forms DEVICE_LEAD of that before, or when full.
    ahead = [Executing(now - 1_000 * MS, 4)]
    expected = now - 1_000 * MS + COST_NS - int(DEVICE_LEAD * COST_NS)
    assert decider.decide(view(1, now, ahead), now) == WaitUntil(expected, 8)
    # Asked again as the device is about to free, it goes with what is queued.
    assert decider.decide(view(3, expected, ahead), expected) == Take(3)
    # A full batch goes at once.
    assert decider.decide(view(8, now, ahead, full=True), now) == Take(8)
    # Nothing on the device and another slot idle: it goes at once, as before.
    idle = view(1, now)._replace(idle_slots=1)
    assert decider.decide(idle, now) == Take(8)


def test_an_idle_slot_does_not_send_while_the_device_is_busy() -> None:
    # Without the device, another idle slot means "send now"; with the device busy, the
    # batch would only wait there, while requests that arrive meanwhile could join it.
    now = time.monotonic_ns()
    decider = AdaptiveDecider(measured(policy(), now))
    busy = view(1, now, [Executing(now, 2)])._replace(idle_slots=1)
    answer = decider.decide(busy, now)
    assert type(answer) is WaitUntil and answer.deadline_ns > now


def test_executions_queued_on_the_device_run_one_after_another() -> None:
    now = time.monotonic_ns()
    controller = measured(policy(), now)
    lead = int(DEVICE_LEAD * COST_NS)
    # The second was handed over while the first ran: it starts when the first ends.
    chained = [Executing(now, 1), Executing(now + MS, 8)]
    assert controller.form_by_ns(chained) == now + 2 * COST_NS - lead
    assert controller.form_by_ns([]) == 0
    # An execution far cheaper than the lead's floor still leaves FILL_SLACK_NS.
    cheap = AdaptiveController(policy())
    cheap.cost.record(1, 10_000)
    assert cheap.form_by_ns([Executing(now, 1)]) == now + 10_000 - FILL_SLACK_NS


def fakes_on(device: str, serial: bool, count: int) -> list[FakeExecutor]:
    return [
        FakeExecutor(f"{device}_{i}", blocked=True, device=device, serial=serial)
        for i in range(count)
    ]


def batcher_for(fakes: list[FakeExecutor]) -> DynamicBatcher:
    batch_policy = policy()
    controller = measured(batch_policy, time.monotonic_ns())
    pool = SlotPool([ExecutorSlot(fake) for fake in fakes])
    return DynamicBatcher(pool, batch_policy, (), controller)


@contextlib.asynccontextmanager
async def serving(
    fakes: list[FakeExecutor], batcher: DynamicBatcher | None = None
) -> AsyncIterator[DynamicBatcher]:
    """`batcher` (by default `batcher_for(fakes)`), its fakes opened and it closed at the
    end, whatever the test left blocked."""
    serving_batcher = batcher if batcher is not None else batcher_for(fakes)
    try:
        yield serving_batcher
    finally:
        for fake in fakes:
            fake.open()
        await serving_batcher.close(5.0)


async def first_started(fakes: list[FakeExecutor]) -> FakeExecutor:
    """The fake whose execution starts first."""
    waits = {asyncio.ensure_future(fake.started()): fake for fake in fakes}
    done, pending = await asyncio.wait(waits, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    assert done, "no execution started"
    return waits[done.pop()]


async def test_two_slots_on_one_device_batch_what_arrives_while_the_device_is_busy() -> None:
    fakes = fakes_on("npu0", serial=True, count=2)
    async with serving(fakes) as batcher:
        first = asyncio.ensure_future(batcher.submit(item(0)))
        running = await first_started(fakes)
        # Four requests arrive over longer than the controller would wait for a batch to
        # fill (its derived budget, at most AUTO_BUDGET_MAX_NS); the other slot is idle
        # all along, but the device is not: each would only wait behind the running batch.
        rest = []
        for value in (1, 2, 3, 4):
            rest.append(asyncio.ensure_future(batcher.submit(item(value))))
            await asyncio.sleep(AUTO_BUDGET_MAX_NS / 1e9 / 2)
        await queued(batcher, 4)
        assert sum(len(fake.batches) for fake in fakes) == 1
        # The running batch ends: the device frees, and the four go as one batch.
        running.open()
        await asyncio.wait_for(first, 10)
        other = next(fake for fake in fakes if fake is not running)
        assert await other.started() == 4
        other.open()
        results = await asyncio.wait_for(asyncio.gather(*rest), 10)
        assert [r["n"].tolist() for r in results] == [[[4]]] * 4
        assert running.sizes == [1] and other.sizes == [4]


async def test_with_more_slots_than_executions_the_idle_ones_wait_for_the_device() -> None:
    fakes = fakes_on("npu0", serial=True, count=3)
    async with serving(fakes) as batcher:
        first = asyncio.ensure_future(batcher.submit(item(0)))
        running = await first_started(fakes)
        rest = [asyncio.ensure_future(batcher.submit(item(v))) for v in (1, 2, 3, 4)]
        await queued(batcher, 4)
        running.open()
        await asyncio.wait_for(first, 10)
        for fake in fakes:
            fake.open()
        await asyncio.wait_for(asyncio.gather(*rest), 10)
        assert sorted(size for fake in fakes for size in fake.sizes) == [1, 4]


async def test_slots_on_devices_that_run_side_by_side_send_at_once() -> None:
    # Nothing changes where executions do not wait for each other: with a slot idle,
    # a request goes at once.
    fakes = fakes_on("cpu", serial=False, count=3)
    async with serving(fakes) as batcher:
        first = asyncio.ensure_future(batcher.submit(item(0)))
        running = await first_started(fakes)
        second = asyncio.ensure_future(batcher.submit(item(1)))
        others = [fake for fake in fakes if fake is not running]
        assert (await first_started(others)).batches == [[1.0]]
        for fake in fakes:
            fake.open()
        await asyncio.wait_for(asyncio.gather(first, second), 10)


async def test_triton_rules_on_one_device_form_a_batch_as_soon_as_a_slot_is_idle() -> None:
    # Triton's rules stay as they are: a request that finds a slot idle goes at once.
    fakes = fakes_on("npu0", serial=True, count=2)
    config = make_config(max_batch_size=8)
    batch_policy = BatchPolicy.from_config(config)
    pool = SlotPool([ExecutorSlot(fake) for fake in fakes])
    async with serving(fakes, DynamicBatcher(pool, batch_policy)) as batcher:
        first = asyncio.ensure_future(batcher.submit(item(0)))
        running = await first_started(fakes)
        second = asyncio.ensure_future(batcher.submit(item(1)))
        other = next(fake for fake in fakes if fake is not running)
        assert await other.started() == 1
        for fake in fakes:
            fake.open()
        await asyncio.wait_for(asyncio.gather(first, second), 10)


# --- who can join: only requests of the batch's own key ---------------------------------


def test_a_batch_no_one_can_join_goes_at_once_while_the_device_is_busy() -> None:
    # With exact shapes and mixed lengths, a request whose length has no client outside
    # cannot grow its batch: holding it for the device would only leave the device without
    # the next batch queued (Triton's rules close such a batch at once).
    now = time.monotonic_ns()
    decider = AdaptiveDecider(measured(policy(), now))
    ahead = [Executing(now, 4)]
    # All that is queued goes (every size costs the same here: none is cheaper per sample).
    assert decider.decide(view(1, now, ahead)._replace(joinable=0), now) == Take(1)
    # The same with another slot idle, and with no execution on the device at all.
    idle = view(2, now, ahead)._replace(joinable=0, idle_slots=1)
    assert decider.decide(idle, now) == Take(2)
    assert decider.decide(view(1, now)._replace(joinable=0), now) == Take(8)


def test_a_batch_waits_for_the_device_only_for_clients_of_its_own_key() -> None:
    now = time.monotonic_ns()
    decider = AdaptiveDecider(measured(policy(), now))
    ahead = [Executing(now - 1_000 * MS, 4)]
    expected = now - 1_000 * MS + COST_NS - int(DEVICE_LEAD * COST_NS)
    # 16 clients outside, 2 of them of the head's key: it waits until those 2 have
    # joined (3 queued), or until the device is about to free.
    assert decider.decide(view(1, now, ahead)._replace(joinable=2), now) == WaitUntil(expected, 3)
    assert decider.decide(view(3, now, ahead)._replace(joinable=0), now) == Take(3)
    # Who can join not known (no batch of the key has left yet): any client may.
    assert decider.decide(view(1, now, ahead), now) == WaitUntil(expected, 8)


def test_a_batch_no_one_can_join_does_not_pad_up_a_gear_it_barely_uses() -> None:
    # One shape, 32 clients, two slots: 22 queued while the other slot's 10 run. All who
    # could join are in, so it goes now, but as 16 (gear 16) rather than 22 padded to
    # 32: the other 6 go next, with the 10 coming back, and the split evens out.
    now = time.monotonic_ns()
    batch_policy = policy(max_batch_size=32)
    gears = (1, 2, 4, 8, 16, 32)
    controller = AdaptiveController(batch_policy, gears)
    for gear in gears:
        controller.cost.record(gear, int((4.6 + 0.6 * gear) * MS))
    decider = AdaptiveDecider(controller)
    ahead = [Executing(now, 10)]
    assert decider.decide(view(22, now, ahead)._replace(joinable=0), now) == Take(16)


async def test_mixed_lengths_on_one_device_are_not_held_for_it() -> None:
    # Two slots on one device, one client per length (exact shapes): once each length has
    # been seen to leave, a request goes to the idle slot at once, behind the execution
    # on the device, rather than waiting for the device to free.
    fakes = fakes_on("npu0", serial=True, count=2)
    async with serving(fakes) as batcher:
        short = asyncio.ensure_future(batcher.submit(item(0, width=4)))
        first = await first_started(fakes)
        other = next(fake for fake in fakes if fake is not first)
        # A request of another length while the first runs: its clients are not known
        # yet, so it is held for the device, as before.
        long = asyncio.ensure_future(batcher.submit(item(1, width=8)))
        await queued(batcher, 1)
        assert other.batches == []
        first.allow()
        await asyncio.wait_for(short, 10)
        assert await other.started() == 1  # the device freed: it goes
        # Now the short length's only client sends again (two rows) while the long one
        # holds the device: nothing can join it, so it goes at once to the idle slot.
        again = asyncio.ensure_future(batcher.submit(item(2, rows=2, width=4)))
        assert await first.started() == 2
        assert len(other.batches) == 1 and not long.done()
        # It waits on the device behind the long one; that wait is not its cost.
        await asyncio.sleep(WAIT_AHEAD_S)
        other.allow()
        await asyncio.wait_for(long, 10)
        first.allow()
        result = await asyncio.wait_for(again, 10)
        assert result["y"].shape == (2, 4)
        snapshot = batcher.adaptive_snapshot()
        assert snapshot is not None
        assert snapshot["cost_us"][2] < WAIT_AHEAD_S * 1e6
