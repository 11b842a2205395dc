"""How the schedulers answer and end: preserve_ordering holds for every executed request,
errors included, under Triton's rules and under adaptive batching; an idle batcher keeps
no request it answered; closing waits the drain timeout once."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable

import pytest
from fake_executor import POISON, FakeExecutor, Poisoned, item, make_batcher, make_config

from ge_serve.scheduler.batcher import DynamicBatcher
from ge_serve.scheduler.direct import DirectScheduler
from ge_serve.scheduler.dispatch import ExecutorSlot, SlotPool
from ge_serve.server.errors import ServerError

pytestmark = pytest.mark.timeout(30)


async def _second_ends_first(adaptive: bool) -> list[str]:
    """Three requests on two slots of one ordered model. The second's execution ends
    (and fails, for POISON) while the first's still runs; the third starting on the
    second's slot shows that the second's execution is back. Returns the answer order."""
    parameters = {"adaptive_batching": "true"} if adaptive else {}
    config = make_config(max_batch_size=1, preserve_ordering=True, parameters=parameters)
    fake_a, fake_b = Poisoned("a", blocked=True), Poisoned("b", blocked=True)
    batcher = make_batcher(config, [fake_a, fake_b])
    done: list[str] = []

    def track(name: str) -> Callable[[object], None]:
        return lambda _: done.append(name)

    try:
        first = asyncio.create_task(batcher.submit(item(1)))
        first.add_done_callback(track("first"))
        assert await fake_a.started() == 1
        second = asyncio.create_task(batcher.submit(item(POISON)))
        second.add_done_callback(track("second"))
        assert await fake_b.started() == 1
        fake_b.allow()
        third = asyncio.create_task(batcher.submit(item(3)))
        third.add_done_callback(track("third"))
        assert await fake_b.started() == 1
        assert not second.done(), "the second was answered before the first"
        fake_a.open()
        fake_b.open()
        answers = await asyncio.gather(first, second, third, return_exceptions=True)
    finally:
        fake_a.open()
        fake_b.open()
        await batcher.close(5.0)
    assert isinstance(answers[0], dict) and isinstance(answers[2], dict)
    assert isinstance(answers[1], ServerError)
    assert f"cannot take {POISON}" in answers[1].message
    return done


@pytest.mark.parametrize("adaptive", [False, True], ids=["triton-rules", "adaptive"])
async def test_an_execution_error_waits_for_the_requests_ahead(adaptive: bool) -> None:
    # Triton sends every response of an executed request through the ordering,
    # errors included; only requests that never ran (timed out, cancelled) skip it.
    # Adaptive batching starts a request that finds the server empty without queueing
    # it; an ordered model must queue it, or the request behind overtakes it.
    assert await _second_ends_first(adaptive) == ["first", "second", "third"]


async def test_an_idle_batcher_keeps_no_request_it_answered() -> None:
    # The batch former sleeps between batches; the last batch's requests (their tensors,
    # perhaps shared-memory views a client has since unregistered) must not wait for the
    # next request to be let go.
    fake = FakeExecutor("a")
    batcher = make_batcher(make_config(max_batch_size=8, delay_us=1000), [fake])
    try:
        request = item(1)
        watch = weakref.ref(request.inputs["x"])
        await batcher.submit(request)
        del request
        # The slot thread lets go of its job just after it reports; give it the time.
        for _ in range(200):
            if watch() is None:
                break
            await asyncio.sleep(0.01)
        assert watch() is None
    finally:
        await batcher.close(5.0)


@pytest.mark.parametrize("batching", [False, True], ids=["direct", "dynamic"])
async def test_closing_with_a_hung_execution_waits_the_drain_timeout_once(batching: bool) -> None:
    # The drain and the slot threads' join used to wait the timeout each, and the join
    # once per slot: an unload of a model whose execute never returns took 2-3 times
    # --exit-timeout-secs.
    fakes = [FakeExecutor("a", blocked=True), FakeExecutor("b", blocked=True)]
    if batching:
        scheduler: DirectScheduler | DynamicBatcher = make_batcher(
            make_config(max_batch_size=1), fakes
        )
    else:
        scheduler = DirectScheduler(SlotPool([ExecutorSlot(f) for f in fakes]), batching=True)
    hung = [asyncio.ensure_future(scheduler.submit(item(v))) for v in (1, 2)]
    for fake in fakes:
        assert await fake.started() == 1
    started = time.monotonic()
    await scheduler.close(1.0)
    waited = time.monotonic() - started
    for fake in fakes:
        fake.open()
    await asyncio.gather(*hung, return_exceptions=True)
    assert 1.0 <= waited < 1.8, waited
