"""The dynamic batcher's turn path: a request that finds nothing queued and a slot idle.

Under Triton's rules with no delay, no preferred sizes, no priorities and no queue limits,
what is queued goes the moment a slot is idle. Such a request takes the slot at once, and
the requests that arrive in the same loop turn join its batch, as they would have joined
the batch the batch former formed a turn later. These tests pin the batches users see.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest
from fake_executor import FakeExecutor, item, make_batcher, make_config, set_policy

from ge_serve.protos import model_config_pb2
from ge_serve.scheduler import turn
from ge_serve.scheduler.batcher import DynamicBatcher
from ge_serve.scheduler.work import WorkItem

pytestmark = pytest.mark.timeout(30)


async def run_burst(
    config: model_config_pb2.ModelConfig, items: Sequence[WorkItem], executors: int = 1
) -> tuple[list[FakeExecutor], list[dict[str, np.ndarray]]]:
    """Submit `items` in one loop turn on idle slots; their results once all are answered."""
    fakes = [FakeExecutor(f"fake{i}") for i in range(executors)]
    batcher = make_batcher(config, fakes)
    try:
        tasks = [asyncio.create_task(batcher.submit(i)) for i in items]
        results = await asyncio.gather(*tasks)
        assert batcher.pending == 0
        return fakes, results
    finally:
        await batcher.close(5.0)


async def test_a_burst_on_an_idle_slot_runs_as_one_batch() -> None:
    (fake,), results = await run_burst(make_config(max_batch_size=8), [item(v) for v in (1, 2, 3)])
    assert fake.batches == [[1, 2, 3]]
    for value, result in zip((1, 2, 3), results, strict=True):
        np.testing.assert_array_equal(result["y"], np.full((1, 4), 2 * value))
        assert result["n"].tolist() == [[3]]


async def test_a_burst_never_exceeds_the_largest_batch() -> None:
    burst = [item(v, rows=r) for v, r in ((1, 3), (2, 4), (3, 2), (4, 1))]
    (fake,), _ = await run_burst(make_config(max_batch_size=8), burst)
    # The third does not fit beside the first two: it and everything after it queue.
    assert fake.batches == [[1, 1, 1, 2, 2, 2, 2], [3, 3, 4]]


async def test_a_request_of_another_shape_closes_the_batch_ahead_of_it() -> None:
    burst = [item(1), item(2), item(3, width=5), item(4)]
    (fake,), results = await run_burst(make_config(max_batch_size=8), burst)
    # As Triton's rules close a queued batch: nothing after it overtakes it.
    assert fake.batches == [[1, 2], [3], [4]]
    assert results[2]["y"].shape == (1, 5)


async def test_a_lone_request_is_timed_as_a_batch_of_one() -> None:
    lone = item(1)
    (fake,), _ = await run_burst(make_config(max_batch_size=8), [lone])
    assert fake.batches == [[1]]
    assert (lone.timings.batch_size, lone.timings.first_in_batch) == (1, True)
    assert lone.timings.queue_ns >= 0


async def test_a_request_cancelled_before_its_batch_goes_is_not_answered() -> None:
    fake = FakeExecutor("fake")
    batcher = make_batcher(make_config(max_batch_size=8), [fake])
    try:
        gone, kept = (asyncio.create_task(batcher.submit(item(v))) for v in (1, 2))
        await asyncio.sleep(0)  # both joined the batch, which has not gone yet
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert (await kept)["y"].tolist() == [[4.0] * 4]
        assert batcher.pending == 0
    finally:
        await batcher.close(5.0)


async def test_preferred_sizes_still_split_a_burst() -> None:
    config = make_config(max_batch_size=8, preferred=[2])
    (fake,), _ = await run_burst(config, [item(v) for v in (1, 2, 3)])
    assert fake.sizes == [2, 1]


async def test_a_queue_limit_still_refuses_a_burst_beyond_it() -> None:
    config = make_config(max_batch_size=8)
    set_policy(config, None, max_queue_size=1)
    fake = FakeExecutor("fake")
    batcher = make_batcher(config, [fake])
    try:
        tasks = [asyncio.create_task(batcher.submit(item(v))) for v in (1, 2)]
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert "Exceeds maximum queue size" in str(outcomes[1])
        assert fake.batches == [[1]]
    finally:
        await batcher.close(5.0)


async def test_close_waits_for_a_batch_that_has_not_gone_yet() -> None:
    fake = FakeExecutor("fake")
    batcher: DynamicBatcher = make_batcher(make_config(max_batch_size=8), [fake])
    task = asyncio.create_task(batcher.submit(item(1)))
    await asyncio.sleep(0)
    await batcher.close(5.0)
    assert (await task)["y"].tolist() == [[2.0] * 4]
    assert fake.batches == [[1]] and fake.closed


async def test_close_without_a_drain_timeout_still_runs_the_open_batch() -> None:
    fake = FakeExecutor("fake")
    batcher: DynamicBatcher = make_batcher(make_config(max_batch_size=8), [fake])
    tasks = [asyncio.create_task(batcher.submit(item(v))) for v in (1, 2)]
    await asyncio.sleep(0)  # both joined the open batch
    await batcher.close(0.0)
    results = await asyncio.gather(*tasks)
    assert [r["y"].tolist() for r in results] == [[[2.0] * 4], [[4.0] * 4]]
    # No drain timeout: close returns while the batch runs, and the slot closes its
    # executor once the run ends, after it has sent the answers (a race the test lost
    # about once in five runs when it checked at once).
    for _ in range(500):
        if fake.closed:
            break
        await asyncio.sleep(0.01)
    assert fake.batches == [[1, 2]] and fake.closed


async def over_passes(
    max_batch_size: int, values_per_pass: Sequence[Sequence[int]]
) -> tuple[list[list[float]], list[dict[str, np.ndarray]]]:
    """Each pass's requests submitted in that loop pass: the batches run, and the answers."""
    fake = FakeExecutor("fake")
    batcher = make_batcher(make_config(max_batch_size=max_batch_size), [fake])
    try:
        tasks = []
        for values in values_per_pass:
            tasks += [asyncio.create_task(batcher.submit(item(v))) for v in values]
            await asyncio.sleep(0)  # one loop pass
        results = list(await asyncio.gather(*tasks))
    finally:
        await batcher.close(5.0)
    return fake.batches, results


async def test_requests_of_the_passes_that_follow_join_the_batch() -> None:
    # As gRPC calls reach the batcher under load: a pass or two apart.
    batches, results = await over_passes(8, [[1], [2, 3], [4]])
    assert batches == [[1, 2, 3, 4]]
    assert [r["y"].tolist() for r in results] == [[[2.0 * v] * 4] for v in (1, 2, 3, 4)]


async def test_the_batch_goes_after_the_first_pass_that_brings_nothing() -> None:
    batches, _ = await over_passes(8, [[1], [], [2]])
    assert batches == [[1], [2]]


async def test_a_stream_of_arrivals_holds_the_batch_at_most_max_passes() -> None:
    batches, _ = await over_passes(16, [[v] for v in range(1, 11)])
    assert batches[0] == list(range(1, turn.MAX_PASSES + 1))
    assert sorted(v for batch in batches for v in batch) == list(range(1, 11))


async def test_a_full_batch_goes_without_waiting_for_another_pass() -> None:
    fake = FakeExecutor("fake")
    batcher = make_batcher(make_config(max_batch_size=2), [fake])
    try:
        tasks = [asyncio.create_task(batcher.submit(item(v))) for v in (1, 2)]
        await asyncio.sleep(0)  # both join the turn
        await asyncio.sleep(0)  # its first check: full, so it goes
        turns = batcher._turns
        assert turns is not None and turns._open is None
        await asyncio.gather(*tasks)
        assert fake.batches == [[1, 2]]
    finally:
        await batcher.close(5.0)


async def test_close_sends_a_waiting_turn_at_once() -> None:
    fake = FakeExecutor("fake")
    batcher = make_batcher(make_config(max_batch_size=8), [fake])
    task = asyncio.create_task(batcher.submit(item(1)))
    await asyncio.sleep(0)  # the turn is open and would wait another pass
    closing = asyncio.create_task(batcher.close(0.0))
    await asyncio.sleep(0)
    turns = batcher._turns
    assert turns is not None and turns._open is None
    await closing
    assert (await task)["y"].tolist() == [[2.0] * 4]
