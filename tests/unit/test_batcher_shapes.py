"""A request of another shape closes the batch pending ahead of it, under Triton's rules.

Ported from the four `*_different_shape` cases of Triton's qa/L0_batcher/batcher_test.py
(a model with variable-size inputs, preferred sizes [2, 6] and a long queue delay): the
pending batch goes as soon as a request arrives that cannot join it, and the newcomer
waits out the delay in the next batch. With priority levels the batch is formed in
priority order, so a newcomer of a higher level heads it and goes at once, while one of
a lower level closes the batch of the request ahead. The adaptive controller, which
looks past other shapes, never holds either for the delay at low load.

The delay here is a minute, far beyond the test's timeout: a request that is answered
was answered by the rule, not by the delay.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import numpy as np
import pytest
from fake_executor import FakeExecutor, item, make_batcher, make_config, queued

from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.batcher import DynamicBatcher
from ge_serve.scheduler.work import WorkItem

pytestmark = pytest.mark.timeout(30)

MINUTE_US = 60_000_000
# Triton's input_size 16 and 8: two shapes that cannot batch together.
WIDE, NARROW = 16, 8
# Long enough for any answer the rule sends; far shorter than the delay.
ANSWER_S = 10.0


def triton_config(priority_levels: int = 0, adaptive: bool = False) -> model_config_pb2.ModelConfig:
    return make_config(
        max_batch_size=8,
        preferred=[2, 6],
        delay_us=MINUTE_US,
        priority_levels=priority_levels,
        default_level=priority_levels and 1,
        parameters={"adaptive_batching": "true" if adaptive else "false"},
    )


@asynccontextmanager
async def running(
    config: model_config_pb2.ModelConfig, delay_count: int = 0
) -> AsyncIterator[tuple[DynamicBatcher, FakeExecutor]]:
    fake = FakeExecutor("fake")
    batcher = make_batcher(config, [fake], delay_count=delay_count)
    try:
        yield batcher, fake
    finally:
        await batcher.close(0.0)


def submit(batcher: DynamicBatcher, work: WorkItem) -> asyncio.Task[dict[str, np.ndarray]]:
    return asyncio.create_task(batcher.submit(work))


async def answered(*tasks: asyncio.Task[dict[str, np.ndarray]]) -> None:
    await asyncio.wait_for(asyncio.gather(*tasks), ANSWER_S)


async def still_waiting(tasks: Sequence[asyncio.Task[dict[str, np.ndarray]]]) -> None:
    """The requests hold for the delay: not answered now, and cancelled to end the test."""
    for _ in range(50):
        await asyncio.sleep(0)
    assert not any(task.done() for task in tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_multi_batch_different_shape() -> None:
    async with running(triton_config()) as (batcher, fake):
        first = submit(batcher, item(1, width=WIDE))
        await queued(batcher, 1)  # pending, waiting out the delay for a preferred size
        second = submit(batcher, item(2, width=NARROW))
        await answered(first)
        assert fake.shapes == [(1, WIDE)]
        await still_waiting([second])


async def test_multi_batch_not_preferred_different_shape() -> None:
    async with running(triton_config()) as (batcher, fake):
        pending = [
            submit(batcher, item(1, width=WIDE)),
            submit(batcher, item(2, rows=3, width=WIDE)),
        ]
        await queued(batcher, 2)  # 4 samples: between the preferred sizes, so it waits
        third = submit(batcher, item(3, width=NARROW))
        await answered(*pending)
        assert fake.batches == [[1, 2, 2, 2]]
        await still_waiting([third])


async def test_multi_batch_preferred_different_shape() -> None:
    async with running(triton_config()) as (batcher, fake):
        pending = [
            submit(batcher, item(1, width=WIDE)),
            submit(batcher, item(2, rows=3, width=WIDE)),
        ]
        await queued(batcher, 2)
        third = submit(batcher, item(3, width=NARROW))
        await answered(*pending)
        fourth = submit(batcher, item(4, rows=5, width=NARROW))
        await answered(third, fourth)  # 1 + 5: a preferred size, so no delay either
        assert fake.sizes == [4, 6]
        assert fake.shapes[1] == (6, NARROW)


async def test_multi_batch_delayed_preferred_different_shape() -> None:
    # TRITONSERVER_DELAY_SCHEDULER=4: all four are queued before the first batch forms.
    async with running(triton_config(), delay_count=4) as (batcher, fake):
        tasks = [
            submit(batcher, item(1, width=WIDE)),
            submit(batcher, item(2, rows=3, width=WIDE)),
            submit(batcher, item(3, width=NARROW)),
            submit(batcher, item(4, rows=5, width=NARROW)),
        ]
        await answered(*tasks)
        assert fake.sizes == [4, 6]
        assert fake.shapes == [(4, WIDE), (6, NARROW)]


async def test_a_newcomer_of_a_lower_level_closes_the_batch_ahead() -> None:
    async with running(triton_config(priority_levels=2)) as (batcher, fake):
        first = submit(batcher, item(1, width=WIDE, priority=1))
        await queued(batcher, 1)
        second = submit(batcher, item(2, width=NARROW, priority=2))
        await answered(first)
        assert fake.shapes == [(1, WIDE)]
        await still_waiting([second])


async def test_a_newcomer_of_a_higher_level_heads_the_batch_and_goes_at_once() -> None:
    # Triton forms the batch in priority order: the newcomer heads it, the request ahead
    # of it in time cannot join it, so the newcomer goes alone at once and the first
    # request keeps waiting out its own delay.
    async with running(triton_config(priority_levels=2)) as (batcher, fake):
        first = submit(batcher, item(1, width=WIDE, priority=2))
        await queued(batcher, 1)
        second = submit(batcher, item(2, width=NARROW, priority=1))
        await answered(second)
        assert fake.shapes == [(1, NARROW)]
        await still_waiting([first])


async def test_same_shape_newcomers_still_join_the_pending_batch() -> None:
    async with running(triton_config()) as (batcher, fake):
        first = submit(batcher, item(1, width=WIDE))
        await queued(batcher, 1)
        second = submit(batcher, item(2, width=WIDE))
        await answered(first, second)  # 2: a preferred size
        assert fake.shapes == [(2, WIDE)]


async def test_adaptive_batching_holds_neither_shape_for_the_delay() -> None:
    # The adaptive controller sends a request that finds the server empty at once, and
    # looks past other shapes instead of closing batches on them; either way, at low
    # load neither request waits for max_queue_delay_microseconds.
    async with running(triton_config(adaptive=True)) as (batcher, fake):
        await answered(submit(batcher, item(1, width=WIDE)))
        await answered(submit(batcher, item(2, width=NARROW)))
        assert fake.shapes == [(1, WIDE), (1, NARROW)]


async def test_adaptive_batching_looks_past_another_shape_in_the_queue() -> None:
    async with running(triton_config(adaptive=True)) as (batcher, fake):
        fake.block()
        blocker = submit(batcher, item(0, width=WIDE))
        await fake.started()
        tasks = [
            submit(batcher, item(1, width=WIDE)),
            submit(batcher, item(2, width=NARROW)),
            submit(batcher, item(3, width=WIDE)),
        ]
        await queued(batcher, 3)
        fake.open()
        await answered(blocker, *tasks)
        # The two wide requests batch across the narrow one; nothing waits the minute.
        assert fake.batches[1:] == [[1, 3], [2]]
