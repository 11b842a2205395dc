"""The dynamic batcher through its public submit() only, gated by a fake executor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
from fake_executor import Array, FakeExecutor, item, make_batcher, make_config, queued, set_policy

from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.batcher import DynamicBatcher
from ge_serve.scheduler.direct import DirectScheduler
from ge_serve.scheduler.dispatch import ExecutorSlot, SlotPool
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = pytest.mark.timeout(30)


@asynccontextmanager
async def running(
    config: model_config_pb2.ModelConfig,
    executors: int = 1,
    gears: Sequence[int] = (),
    delay_count: int = 0,
) -> AsyncIterator[tuple[DynamicBatcher, list[FakeExecutor]]]:
    fakes = [FakeExecutor(f"fake{i}", blocked=True) for i in range(executors)]
    batcher = make_batcher(config, fakes, gears, delay_count)
    try:
        yield batcher, fakes
    finally:
        for fake in fakes:
            fake.open()
        await batcher.close(5.0)


async def occupy(
    batcher: DynamicBatcher, fake: FakeExecutor, rows: int = 1
) -> asyncio.Task[object]:
    """Start one request and hold it on the slot, so that the next ones queue up."""
    task = asyncio.create_task(batcher.submit(item(-1, rows=rows)))
    await fake.started()
    return task


def submit_all(
    batcher: DynamicBatcher, items: Sequence[object]
) -> list[asyncio.Task[dict[str, np.ndarray]]]:
    return [asyncio.create_task(batcher.submit(i)) for i in items]  # type: ignore[arg-type]


async def test_requests_queued_behind_a_busy_slot_run_as_one_batch() -> None:
    async with running(make_config(max_batch_size=8)) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        tasks = submit_all(batcher, [item(v) for v in (1, 2, 3, 4)])
        await queued(batcher, 4)
        fake.open()
        results = await asyncio.gather(*tasks)
        await blocker
        assert fake.batches == [[-1], [1, 2, 3, 4]]
        for value, result in zip((1, 2, 3, 4), results, strict=True):
            np.testing.assert_array_equal(result["y"], np.full((1, 4), 2 * value))
            assert result["n"].tolist() == [[4]]


async def test_preferred_size_goes_at_once_and_the_delay_is_honoured_before_it() -> None:
    # A one-minute delay: the batch can only leave early by reaching the preferred size.
    config = make_config(max_batch_size=8, preferred=[4], delay_us=60_000_000)
    async with running(config) as (batcher, (fake,)):
        fake.open()
        first = submit_all(batcher, [item(v) for v in (1, 2, 3)])
        await queued(batcher, 3)
        last = submit_all(batcher, [item(4)])
        await asyncio.gather(*first, *last)
        assert fake.sizes == [4]


async def test_preferred_sizes_split_a_long_queue() -> None:
    async with running(make_config(max_batch_size=8, preferred=[2])) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        tasks = submit_all(batcher, [item(v) for v in range(1, 6)])
        await queued(batcher, 5)
        fake.open()
        await asyncio.gather(blocker, *tasks)
        # Triton's rule: a preferred size goes as soon as it is reached; the rest waits
        # for the delay (0 here), so the odd one out goes alone.
        assert fake.sizes == [1, 2, 2, 1]
        assert fake.batches[1:] == [[1, 2], [3, 4], [5]]


async def test_delay_expiry_sends_a_partial_batch() -> None:
    config = make_config(max_batch_size=8, delay_us=1000)
    async with running(config) as (batcher, (fake,)):
        fake.open()
        results = await asyncio.gather(*submit_all(batcher, [item(1), item(2)]))
        # Neither the maximum nor a preferred size was reached: only the delay sent it.
        assert fake.sizes == [2]
        assert [r["n"].tolist() for r in results] == [[[2]], [[2]]]


async def test_max_batch_size_sends_at_once_and_is_never_exceeded() -> None:
    config = make_config(max_batch_size=4, delay_us=60_000_000)
    async with running(config) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake, rows=4)  # full: it goes without the delay
        tasks = submit_all(batcher, [item(v, rows=r) for v, r in ((1, 2), (2, 1), (3, 2))])
        await queued(batcher, 3)
        fake.open()
        await blocker
        await asyncio.gather(*tasks[:2])
        # The third (2 rows) did not fit beside the first two (3 rows) in a batch of 4; it
        # now waits for the long delay, so it is cancelled rather than awaited.
        tasks[2].cancel()
        with pytest.raises(asyncio.CancelledError):
            await tasks[2]
        assert fake.shapes[1] == (3, 4)
        assert all(shape[0] <= 4 for shape in fake.shapes)


async def test_higher_priority_runs_first_and_bad_priorities_get_the_default() -> None:
    config = make_config(max_batch_size=1, priority_levels=3, default_level=3)
    async with running(config) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        values = [(30, 3), (20, 2), (31, 0), (10, 1), (32, 7)]
        tasks = submit_all(batcher, [item(v, priority=p) for v, p in values])
        await queued(batcher, 5)
        assert batcher.queue_depths() == {1: 1, 2: 1, 3: 3}
        fake.open()
        await asyncio.gather(blocker, *tasks)
        assert fake.batches[1:] == [[10], [20], [30], [31], [32]]


async def test_reject_timeout_fires_while_the_batcher_waits_for_a_slot() -> None:
    config = make_config(max_batch_size=8)
    set_policy(config, None, "REJECT", timeout_us=1000)
    async with running(config) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        # The slot stays blocked: nothing forms a batch, yet the timeout fires.
        with pytest.raises(ServerError) as info:
            await batcher.submit(item(1))
        assert info.value.code is ErrorCode.UNAVAILABLE
        assert info.value.message == "Request timeout expired"
        assert batcher.queue_depths() == {0: 0}
        fake.open()
        await blocker
        assert fake.batches == [[-1]]


async def test_delay_action_keeps_an_expired_request_behind_its_level() -> None:
    config = make_config(max_batch_size=1, priority_levels=3, default_level=3)
    set_policy(config, 1, "DELAY", timeout_us=60_000_000, allow_override=True)
    set_policy(config, 2, "REJECT", timeout_us=60_000_000, allow_override=True)
    async with running(config) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        expiring = submit_all(batcher, [item(11, priority=1, timeout_us=1000)])
        # A later deadline on a REJECT level: once it is rejected, the first has expired.
        with pytest.raises(ServerError, match="Request timeout expired"):
            await batcher.submit(item(20, priority=2, timeout_us=5000))
        fresh = submit_all(batcher, [item(12, priority=1), item(30, priority=3)])
        await queued(batcher, 3)
        fake.open()
        await asyncio.gather(blocker, *expiring, *fresh)
        # The expired request was kept (not rejected) and went behind its level's live one,
        # still ahead of the lower level.
        assert fake.batches[1:] == [[12], [11], [30]]


async def test_a_delayed_request_lets_the_preferred_batch_ahead_of_it_go_at_once() -> None:
    # Rows 2, 1, 2 queued: 2, 3, 5 is no preferred size (4, 8), and the delay is a minute.
    # When the middle one's timeout expires under DELAY it goes behind: 2 + 2 is preferred,
    # and Triton sends that batch then (qa L0_model_queue test_priority_with_policy).
    config = make_config(max_batch_size=8, preferred=[4, 8], delay_us=60_000_000)
    set_policy(config, None, "DELAY", timeout_us=60_000_000, allow_override=True)
    async with running(config) as (batcher, (fake,)):
        fake.open()
        first = submit_all(batcher, [item(1, rows=2)])
        expiring = submit_all(batcher, [item(2, timeout_us=50_000)])
        last = submit_all(batcher, [item(3, rows=2)])
        # A guard against waiting out the minute, not a measure of speed.
        await asyncio.wait_for(asyncio.gather(*first, *last), 20)
        assert fake.batches == [[1, 1, 3, 3]]  # rows, by value
        expiring[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await expiring[0]


async def test_full_queue_refuses_with_exceeds_maximum_queue_size() -> None:
    config = make_config(max_batch_size=8, priority_levels=2, default_level=2)
    set_policy(config, 1, max_queue_size=1)
    set_policy(config, None, max_queue_size=2)
    async with running(config) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        tasks = submit_all(batcher, [item(1, priority=1), item(2), item(3)])
        await queued(batcher, 3)
        for priority in (1, 2):
            with pytest.raises(ServerError) as info:
                await batcher.submit(item(9, priority=priority))
            assert info.value.code is ErrorCode.UNAVAILABLE
            assert info.value.message == "Exceeds maximum queue size"
        fake.open()
        await asyncio.gather(blocker, *tasks)
        assert sorted(fake.batches[1]) == [1, 2, 3]


async def test_timeout_override_refused_when_the_policy_does_not_allow_it() -> None:
    config = make_config(max_batch_size=1, priority_levels=2, default_level=2)
    set_policy(config, 1, "REJECT", timeout_us=60_000_000, allow_override=False)
    set_policy(config, 2, "REJECT", timeout_us=60_000_000, allow_override=True)
    async with running(config) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        kept = submit_all(batcher, [item(1, priority=1, timeout_us=1000)])
        with pytest.raises(ServerError, match="Request timeout expired"):
            await batcher.submit(item(2, priority=2, timeout_us=5000))
        fake.open()
        await asyncio.gather(blocker, *kept)
        assert fake.batches[1:] == [[1]]


async def test_timeout_override_shortens_the_default_but_never_lengthens_it() -> None:
    config = make_config(max_batch_size=8, priority_levels=2, default_level=2)
    set_policy(config, 1, "REJECT", timeout_us=60_000_000, allow_override=True)
    set_policy(config, 2, "REJECT", timeout_us=1000, allow_override=True)
    async with running(config) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        # Shorter than a one-minute default: rejected within the test's time limit.
        with pytest.raises(ServerError, match="Request timeout expired"):
            await batcher.submit(item(1, priority=1, timeout_us=1000))
        # Longer than the 1 ms default: the default still applies.
        with pytest.raises(ServerError, match="Request timeout expired"):
            await batcher.submit(item(2, priority=2, timeout_us=60_000_000))
        fake.open()
        await blocker


async def test_requests_of_different_shapes_never_merge() -> None:
    async with running(make_config(max_batch_size=8)) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        tasks = submit_all(batcher, [item(1, width=4), item(2, width=5), item(3, width=4)])
        await queued(batcher, 3)
        fake.open()
        results = await asyncio.gather(blocker, *tasks)
        # Triton's rule: the request of another shape closes the batch ahead of it.
        assert fake.batches[1:] == [[1], [2], [3]]
        assert fake.shapes[1:] == [(1, 4), (1, 5), (1, 4)]
        assert results[2]["y"].shape == (1, 5)


async def test_different_dtypes_never_merge() -> None:
    async with running(make_config(max_batch_size=8)) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        wide = item(2)
        wide.inputs["x"] = wide.inputs["x"].astype(np.float64)
        tasks = submit_all(batcher, [item(1), wide])
        await queued(batcher, 2)
        fake.open()
        await asyncio.gather(blocker, *tasks)
        assert fake.batches[1:] == [[1], [2]]


async def test_a_cancelled_request_is_dropped_before_execution() -> None:
    async with running(make_config(max_batch_size=8)) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        gone, kept = submit_all(batcher, [item(1), item(2)])
        await queued(batcher, 2)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert batcher.queue_depths() == {0: 1}
        fake.open()
        await asyncio.gather(blocker, kept)
        assert fake.batches == [[-1], [2]]
        assert batcher.pending == 0


async def test_gears_pad_up_trim_back_and_cap_the_batch() -> None:
    async with running(make_config(max_batch_size=8), gears=(2, 4)) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        tasks = submit_all(batcher, [item(v) for v in (1, 2, 3)])
        await queued(batcher, 3)
        fake.allow()
        assert await fake.started() == 4  # 3 requests padded to the gear of 4
        fake.allow()
        results = await asyncio.gather(*tasks)
        assert fake.batches[1] == [1, 2, 3, 3]  # padding repeats the last row
        for value, result in zip((1, 2, 3), results, strict=True):
            assert result["y"].tolist() == [[2 * value] * 4]
        # Submitted in one go, so the batcher sees all six when it forms the next batch.
        more = submit_all(batcher, [item(v) for v in range(10, 16)])
        fake.open()
        await asyncio.gather(blocker, *more)
        assert fake.shapes[0][0] == 2  # even a lone request runs at the smallest gear
        assert [shape[0] for shape in fake.shapes[2:]] == [4, 2]
        with pytest.raises(ServerError) as info:
            await batcher.submit(item(9, rows=6))
        assert info.value.code is ErrorCode.INVALID_ARG


async def test_preserve_ordering_releases_responses_in_arrival_order() -> None:
    config = make_config(max_batch_size=1, preserve_ordering=True)
    async with running(config, executors=2) as (batcher, (fake_a, fake_b)):
        done: list[str] = []

        def track(name: str) -> Callable[[object], None]:
            return lambda _: done.append(name)

        first = asyncio.create_task(batcher.submit(item(1)))
        first.add_done_callback(track("first"))
        assert await fake_a.started() == 1
        second = asyncio.create_task(batcher.submit(item(2)))
        second.add_done_callback(track("second"))
        assert await fake_b.started() == 1
        fake_b.allow()  # the second finishes while the first still runs
        third = asyncio.create_task(batcher.submit(item(3)))
        third.add_done_callback(track("third"))
        # The third can only start on the second's slot once its batch has completed.
        assert await fake_b.started() == 1
        assert not second.done()
        fake_a.open()
        fake_b.open()
        await asyncio.gather(first, second, third)
        assert done == ["first", "second", "third"]


async def test_several_batches_run_at_once_on_several_slots() -> None:
    async with running(make_config(max_batch_size=2), executors=2) as (batcher, fakes):
        tasks = submit_all(batcher, [item(v) for v in (1, 2, 3, 4)])
        # Both executions start while neither may finish.
        assert await fakes[0].started() == 2
        assert await fakes[1].started() == 2
        for fake in fakes:
            fake.open()
        await asyncio.gather(*tasks)


async def test_delay_scheduler_hook_holds_until_n_are_queued() -> None:
    async with running(make_config(max_batch_size=8), delay_count=3) as (batcher, (fake,)):
        fake.open()
        first = submit_all(batcher, [item(1), item(2)])
        await queued(batcher, 2)
        for _ in range(50):
            await asyncio.sleep(0)  # bare yields: a batcher not holding would take them
        assert batcher.queue_depths() == {0: 2}
        assert fake.batches == []
        last = submit_all(batcher, [item(3)])
        await asyncio.gather(*first, *last)
        assert fake.sizes == [3]


async def test_execution_errors_reach_every_request_of_the_batch() -> None:
    class Failing(FakeExecutor):
        def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
            super().execute(inputs)
            raise ValueError("boom")

    failing = Failing("failing", blocked=True)
    batcher = make_batcher(make_config(max_batch_size=8), [failing])
    try:
        tasks = submit_all(batcher, [item(1), item(2)])
        assert await failing.started() == 2
        failing.open()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            assert isinstance(outcome, ServerError)
            assert outcome.code is ErrorCode.INTERNAL
            assert outcome.message == "ValueError: boom"
        # The slot came back: the next request runs.
        await asyncio.gather(*submit_all(batcher, [item(3)]), return_exceptions=True)
        assert failing.batches[-1] == [3]
    finally:
        await batcher.close(5.0)


async def test_close_drains_then_refuses_new_work() -> None:
    async with running(make_config(max_batch_size=8)) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        tasks = submit_all(batcher, [item(1), item(2)])
        await queued(batcher, 2)
        closing = asyncio.create_task(batcher.close(10.0))
        await asyncio.sleep(0)  # a bare yield: close() starts and refuses new work
        with pytest.raises(ServerError, match="being unloaded"):
            await batcher.submit(item(3))
        fake.open()
        await asyncio.gather(blocker, *tasks)
        await closing


async def test_close_after_the_drain_timeout_answers_what_is_still_queued() -> None:
    config = make_config(max_batch_size=8)
    fake = FakeExecutor("stuck", blocked=True)
    batcher = make_batcher(config, [fake])
    blocker = await occupy(batcher, fake)
    waiting = submit_all(batcher, [item(1)])
    await queued(batcher, 1)
    await batcher.close(0.01)
    with pytest.raises(ServerError, match="unloaded"):
        await waiting[0]
    fake.open()
    await blocker


async def test_a_model_without_batch_dimension_runs_each_request_alone() -> None:
    async with running(make_config(max_batch_size=0)) as (batcher, (fake,)):
        blocker = await occupy(batcher, fake)
        tasks = submit_all(batcher, [item(1), item(2)])
        await queued(batcher, 2)
        fake.open()
        await asyncio.gather(blocker, *tasks)
        assert fake.batches == [[-1], [1], [2]]


async def test_a_failing_batch_former_answers_its_queue_and_restarts() -> None:
    from ge_serve.scheduler.adaptive import AdaptiveController, Plan
    from ge_serve.scheduler.policy import BatchPolicy

    class Broken(AdaptiveController):
        fail = False

        def plan(
            self,
            now_ns: int,
            queued: int,
            oldest_ns: int,
            level: int,
            idle_slots: int,
            head_samples: int | None = None,
            idle_since_ns: int | None = None,
            **where: Any,
        ) -> Plan:
            if Broken.fail:
                Broken.fail = False
                raise RuntimeError("controller bug")
            return super().plan(
                now_ns, queued, oldest_ns, level, idle_slots, head_samples, idle_since_ns, **where
            )

    config = make_config(max_batch_size=8, parameters={"adaptive_batching": "true"})
    policy = BatchPolicy.from_config(config)
    fake = FakeExecutor("fake", blocked=True)
    batcher = DynamicBatcher(SlotPool([ExecutorSlot(fake)]), policy, (), Broken(policy))
    try:
        # A lone request takes the idle slot in submit(); the next one queues for the former.
        running = asyncio.ensure_future(batcher.submit(item(1)))
        assert await fake.started() == 1
        Broken.fail = True
        failing = asyncio.ensure_future(batcher.submit(item(2)))
        await queued(batcher, 1)
        fake.open()  # the slot frees, the former plans, the controller fails
        assert (await running)["y"].tolist() == [[2.0] * 4]
        with pytest.raises(ServerError, match="batcher failed") as info:
            await failing
        assert info.value.code is ErrorCode.INTERNAL
        result = await batcher.submit(item(3))
        assert result["y"].tolist() == [[6.0] * 4]
    finally:
        await batcher.close(5.0)


async def test_the_default_scheduler_holds_a_slot_until_its_execution_really_ends() -> None:
    # Without dynamic batching one request is one execution. A caller that goes away
    # mid-execution gets its answer dropped, but the slot counts as busy until the
    # execution ends: the next request waits for it, and only then runs.
    fake = FakeExecutor("fake", blocked=True)
    pool = SlotPool([ExecutorSlot(fake)])
    scheduler = DirectScheduler(pool, batching=True)
    try:
        gone = asyncio.ensure_future(scheduler.submit(item(1)))
        assert await fake.started() == 1
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert pool.idle_count == 0
        nxt = asyncio.ensure_future(scheduler.submit(item(2, rows=2)))
        await asyncio.sleep(0)
        assert not nxt.done() and fake.batches == [[1]]
        fake.open()
        result = await asyncio.wait_for(nxt, 10)
        assert result["y"].tolist() == [[4.0] * 4] * 2
        assert fake.batches == [[1], [2, 2]]
        assert pool.idle_count == 1
    finally:
        await scheduler.close(5.0)


async def test_the_controller_prices_a_batch_by_its_slot_time_not_its_compute() -> None:
    # The execution computes in microseconds, but the loop is busy for 50 ms meanwhile,
    # so its results come back and free the slot only then: the slot could not be used
    # for all of that, and the controller prices the batch by it (and derives its budget
    # from it: four unbatched executions).
    config = make_config(max_batch_size=8, parameters={"adaptive_batching": "true"})
    async with running(config) as (batcher, (fake,)):
        fake.open()
        request = item(1)
        first = asyncio.ensure_future(batcher.submit(request))
        await asyncio.sleep(0)  # submit() hands the request to the idle slot
        # The loop is busy elsewhere while the execution runs and ends.
        time.sleep(0.05)  # noqa: ASYNC251 - holding the loop is the point
        assert await fake.started() == 1
        await first
        timings = request.timings
        compute = timings.compute_input_ns + timings.compute_infer_ns + timings.compute_output_ns
        assert compute < 25_000_000
        snapshot = batcher.adaptive_snapshot()
        assert snapshot is not None
        assert snapshot["cost_us"][1] >= 50_000
        assert snapshot["budgets_us"][0] >= 4 * 50_000
