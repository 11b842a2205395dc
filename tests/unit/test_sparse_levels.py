"""Priority levels are sparse: a queue exists only for the levels in use.

`priority_levels: 18446744073709551615` with `default_priority_level: 4294967296` (a
config Triton loads) must cost no more than two levels, and serve any level in range.
"""

from __future__ import annotations

import asyncio

import pytest
from fake_executor import FakeExecutor, item, make_batcher, make_config, queued, set_policy

from ge_serve.server.errors import ServerError

pytestmark = pytest.mark.timeout(30)

UINT64_MAX = 2**64 - 1


async def test_huge_priority_levels_serve_any_level_in_priority_order() -> None:
    config = make_config(max_batch_size=1, priority_levels=UINT64_MAX, default_level=2**32)
    fake = FakeExecutor("fake", blocked=True)
    batcher = make_batcher(config, [fake])
    try:
        blocker = asyncio.create_task(batcher.submit(item(0)))
        await fake.started()
        # Queued lowest priority first; they run highest first (level 1 is the highest).
        values = {UINT64_MAX: 1.0, 2**32: 2.0, 1: 3.0, 0: 4.0}
        tasks = [
            asyncio.create_task(batcher.submit(item(v, priority=p))) for p, v in values.items()
        ]
        await queued(batcher, 4)
        # Only the default level and the levels in use exist.
        assert batcher.queue_depths() == {1: 1, 2**32: 2, UINT64_MAX: 1}
        fake.open()
        await asyncio.gather(blocker, *tasks)
        assert fake.batches == [[0.0], [3.0], [2.0], [4.0], [1.0]]
        # Emptied levels the config does not name are dropped again.
        assert batcher.queue_depths() == {2**32: 0}
    finally:
        fake.open()
        await batcher.close(5.0)


async def test_a_named_level_keeps_its_policy_and_an_unnamed_one_gets_the_default() -> None:
    config = make_config(max_batch_size=1, priority_levels=UINT64_MAX, default_level=2**32)
    set_policy(config, 5, max_queue_size=1)
    set_policy(config, None, max_queue_size=2)
    fake = FakeExecutor("fake", blocked=True)
    batcher = make_batcher(config, [fake])
    try:
        blocker = asyncio.create_task(batcher.submit(item(0)))
        await fake.started()
        held = [asyncio.create_task(batcher.submit(item(1, priority=5)))]
        held += [asyncio.create_task(batcher.submit(item(2, priority=9))) for _ in range(2)]
        await queued(batcher, 3)
        for priority in (5, 9):
            with pytest.raises(ServerError, match="Exceeds maximum queue size"):
                await batcher.submit(item(3, priority=priority))
        fake.open()
        await asyncio.gather(blocker, *held)
    finally:
        fake.open()
        await batcher.close(5.0)


async def test_a_level_that_empties_and_fills_again_is_reused_not_opened_anew() -> None:
    # Each request arriving at an empty named level once opened a second queue for it
    # while the first stayed in the order: every later batch walked them all, so the
    # scheduler's cost per request grew with the number of requests served.
    config = make_config(max_batch_size=1, priority_levels=3, default_level=2)
    fake = FakeExecutor("fake")
    batcher = make_batcher(config, [fake])
    try:
        for value in range(50):
            await batcher.submit(item(float(value), priority=1 + value % 3))
        queue = batcher._queue
        # The named (default) level, once; the others were dropped as they emptied.
        assert queue._numbers == [2]
        assert len(queue._order) == 1
        assert batcher.queue_depths() == {2: 0}
    finally:
        await batcher.close(5.0)
