"""Triton's rate limiter: instances run only while their resources are free, and pools
waiting for resources are served by executions x priority."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest
from google.protobuf import text_format

from ge_serve.backends.base import SlotInfo
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.dispatch import ExecutorSlot, SlotPool
from ge_serve.scheduler.ratelimit import RateLimiter, SlotNeeds, needs_of, resource_limit
from ge_serve.server.errors import ErrorCode, ServerError


class Idle:
    def __init__(self, name: str, device_id: int = 0) -> None:
        self.slot = SlotInfo(name=name, device="cpu", device_id=device_id)

    def execute(self, inputs: object) -> dict[str, object]:
        return {}

    def close(self) -> None:
        pass


def needs(count: int, priority: int = 1, name: str = "r1") -> SlotNeeds:
    return SlotNeeds((((name, -1), count),), priority)


def pool(limiter: RateLimiter, *slot_needs: SlotNeeds | None) -> SlotPool:
    slots = [ExecutorSlot(Idle(f"s{i}")) for i in range(len(slot_needs))]  # type: ignore[arg-type]
    return SlotPool(slots, limiter, list(slot_needs))


def test_resource_flag_format() -> None:
    assert resource_limit("R1:4") == ("r1", 4, -1)
    assert resource_limit("R1:4:1") == ("r1", 4, 1)
    for bad in ("R1", "R1:x", ":4", "R1:1:2:3"):
        with pytest.raises(ValueError, match="--rate-limit-resource option format is"):
            resource_limit(bad)


def test_needs_follow_the_instance_groups() -> None:
    config = text_format.Parse(
        """
        instance_group [
          { count: 2 rate_limiter { resources [ { name: "R1" count: 3 },
                                                { name: "G" global: true count: 1 } ]
                                    priority: 2 } },
          { count: 1 }
        ]""",
        model_config_pb2.ModelConfig(),
    )
    found = needs_of(config, [0, 1, 0])
    assert found[0] == SlotNeeds(((("r1", 0), 3), (("g", -1), 1)), 2)
    assert found[1] == SlotNeeds(((("r1", 1), 3), (("g", -1), 1)), 2)
    assert found[2] is None


async def test_an_instance_waits_until_its_resources_come_back() -> None:
    limiter = RateLimiter([("r1", 2, -1)])
    first = pool(limiter, needs(2))
    second = pool(limiter, needs(1))
    held = await first.acquire()
    assert limiter.free("r1") == 0
    waiting = asyncio.ensure_future(second.acquire())
    await asyncio.sleep(0)
    assert not waiting.done(), "its slot is idle, but R1 is taken"
    first.release(held)
    slot = await asyncio.wait_for(waiting, 5)
    assert limiter.free("r1") == 1
    second.release(slot)
    assert limiter.free("r1") == 2
    first.close()
    second.close()


async def test_without_a_limit_the_largest_need_is_the_supply() -> None:
    limiter = RateLimiter()
    big = pool(limiter, needs(3))
    small = pool(limiter, needs(1))
    assert limiter.free("r1") == 3
    slot = await small.acquire()
    assert big.try_acquire() is None, "3 needed, 2 free"
    small.release(slot)
    assert big.try_acquire() is not None
    big.close()
    small.close()


async def test_waiting_pools_are_served_by_priority() -> None:
    limiter = RateLimiter([("r1", 1, -1)])
    holder = pool(limiter, needs(1))
    low = pool(limiter, needs(1, priority=3))
    high = pool(limiter, needs(1, priority=1))
    held = await holder.acquire()
    order: list[str] = []

    async def take(which: SlotPool, label: str) -> None:
        slot = await which.acquire()
        order.append(label)
        which.release(slot)

    low_task = asyncio.ensure_future(take(low, "low"))
    await asyncio.sleep(0)
    high_task = asyncio.ensure_future(take(high, "high"))
    await asyncio.sleep(0)
    holder.release(held)
    await asyncio.wait_for(asyncio.gather(low_task, high_task), 5)
    assert order == ["high", "low"], "priority 1 before 3, though it asked later"
    for each in (holder, low, high):
        each.close()


@pytest.mark.parametrize("instances", [1, 2])
async def test_priority_weights_turns_and_starves_no_one(instances: int) -> None:
    """Triton's weighting (model_configuration.md, Priority; core rate_limiter.cc ranks
    instances by executions x priority): under steady demand for one resource, instances
    of priority 2 get half the turns of those of priority 1, not none."""
    limiter = RateLimiter([("r1", 1, -1)])
    first = pool(limiter, *[needs(1, priority=1)] * instances)
    second = pool(limiter, *[needs(1, priority=2)] * instances)
    turns = {"first": 0, "second": 0}
    stop = asyncio.Event()

    async def client(which: SlotPool, label: str) -> None:
        while not stop.is_set():
            slot = await which.acquire()
            turns[label] += 1
            if sum(turns.values()) == 90:
                stop.set()
            await asyncio.sleep(0)  # executing, while the other clients queue
            which.release(slot)

    clients = [client(first, "first") for _ in range(3)]
    clients += [client(second, "second") for _ in range(3)]
    await asyncio.wait_for(asyncio.gather(*clients), 10)
    assert 25 <= turns["second"] <= 35, turns  # a third of the turns, about
    for each in (first, second):
        each.close()


async def test_a_pool_without_a_limiter_is_unchanged() -> None:
    plain = SlotPool([ExecutorSlot(Idle("only"))])  # type: ignore[arg-type]
    slot = await plain.acquire()
    assert plain.try_acquire() is None
    plain.release(slot)
    assert plain.try_acquire() is slot
    plain.close()


async def test_a_model_that_needs_no_resources_is_not_kept_waiting() -> None:
    # Under --rate-limit, a model with no rate_limiter releases nothing: it must not be
    # put on the limiter's waiting list, which would keep it (and its executors) after
    # its unload until another model gave resources back.
    limiter = RateLimiter()
    free_pool = pool(limiter, None)
    held = await free_pool.acquire()
    waiting = asyncio.ensure_future(free_pool.acquire())
    await asyncio.sleep(0)
    free_pool.release(held)
    free_pool.release(await waiting)
    kept = weakref.ref(free_pool)
    free_pool.close()
    del free_pool, held, waiting
    gc.collect()
    assert kept() is None


@pytest.mark.parametrize(
    ("limits", "need", "message"),
    [
        ([("r1", 1, -1)], needs(2), 'Resource count for "r1" is limited to 1 which will'),
        ([("r1", 0, -1)], needs(1), "limited to 0 which will prevent scheduling"),
        # A limit for another device leaves none on this one.
        ([("r1", 10, 10)], SlotNeeds(((("r1", 0), 1),)), "limited to 0"),
        # Once any limit is given, a resource that none names is unavailable.
        ([("other", 4, -1)], needs(1), 'Resource count for "r1" is limited to 0'),
    ],
)
def test_an_instance_that_could_never_run_is_refused(
    limits: list[tuple[str, int, int]], need: SlotNeeds, message: str
) -> None:
    limiter = RateLimiter(limits)
    with pytest.raises(ServerError) as info:
        limiter.check([None, need])
    assert info.value.code is ErrorCode.INVALID_ARG and message in info.value.message


def test_limits_that_cover_every_instance_pass() -> None:
    RateLimiter().check([needs(100)])
    RateLimiter([("r1", 2, -1)]).check([needs(2), None])
    RateLimiter([("r1", 3, 0)]).check([SlotNeeds(((("r1", 0), 3),))])
    RateLimiter([("g", 5, 1)]).check([SlotNeeds(((("g", -1), 5),))])


CONFLICT = (
    'Resource "r2" is present as both global and device-specific resource in the model '
    "configuration."
)


def on_device(count: int, name: str = "r2", device: int = 0) -> SlotNeeds:
    return SlotNeeds((((name, device), count),))


@pytest.mark.parametrize(
    "limits", [[], [("r1", 4, -1), ("r2", 4, -1)]], ids=["no limits", "limits"]
)
def test_a_resource_both_global_and_per_device_is_refused(
    limits: list[tuple[str, int, int]],
) -> None:
    # Across models (qa L0_rate_limiter Case4): the loaded one uses it globally.
    limiter = RateLimiter(limits)
    loaded = pool(limiter, needs(2, name="r2"))
    with pytest.raises(ServerError) as info:
        limiter.check([on_device(2)])
    assert info.value.code is ErrorCode.INVALID_ARG and info.value.message == CONFLICT
    # Within one model's instances, with nothing loaded that uses it.
    with pytest.raises(ServerError, match="present as both global and device-specific"):
        RateLimiter(limits).check([on_device(1), None, needs(1, name="r2")])
    # Other names, and the same use on other devices, are fine.
    limiter.check([on_device(2, name="r1"), needs(1, name="r2")])
    RateLimiter(limits).check([on_device(1), on_device(1, device=1)])
    loaded.close()


def test_an_unloaded_models_use_of_a_resource_no_longer_binds() -> None:
    limiter = RateLimiter()
    loaded = pool(limiter, needs(2, name="r2"), needs(2, name="r2"))
    with pytest.raises(ServerError, match="present as both global and device-specific"):
        limiter.check([on_device(2)])
    loaded.close()
    loaded.close()  # closed twice: counted once
    limiter.check([on_device(2)])
    pool(limiter, on_device(2)).close()
    limiter.check([needs(2, name="r2")])
