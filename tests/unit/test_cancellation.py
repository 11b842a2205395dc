"""A caller's cancellation of its request (a BLS ResponseIterator.cancel()), as Triton's
request cancellation: the request is marked, a queued one is refused CANCELLED, a running
one goes on."""

from __future__ import annotations

import asyncio

import numpy as np

from ge_serve.backends.base import RequestContext
from ge_serve.scheduler.work import Array, WorkItem
from ge_serve.server.errors import ErrorCode
from ge_serve.server.inference.cancellation import Cancellation
from ge_serve.server.inference.cutoff import Responses
from ge_serve.server.inference.request_level import ResponseQueue


def held_request(queue_ns: int) -> tuple[Responses, asyncio.Future[dict[str, Array]]]:
    loop = asyncio.get_running_loop()
    held = Responses(ResponseQueue(loop))
    held.item = WorkItem({"IN": np.zeros(1)}, 1, context=RequestContext())
    held.item.timings.queue_ns = queue_ns
    execution: asyncio.Future[dict[str, Array]] = loop.create_future()
    held.submitted = execution
    return held, execution


async def test_a_queued_request_is_refused_cancelled() -> None:
    held, execution = held_request(queue_ns=0)
    cancellation = Cancellation()
    cancellation.bind(held, queues=True)
    cancellation.cancel()
    assert execution.cancelled()
    assert held.item is not None and held.item.context is not None
    assert held.item.context.cancelled
    outputs, error, final, _ = await held.sink.get()
    assert outputs is None and final
    assert error is not None and error.code is ErrorCode.CANCELLED


async def test_a_running_request_is_marked_and_goes_on() -> None:
    held, execution = held_request(queue_ns=1500)
    cancellation = Cancellation()
    cancellation.bind(held, queues=True)
    cancellation.cancel()
    assert not execution.done()
    assert held.item is not None and held.item.context is not None
    assert held.item.context.cancelled
    held.sink.send({"OUT": np.ones(1)}, None, True)
    outputs, error, final, _ = await held.sink.get()
    assert outputs is not None and error is None and final
    execution.cancel()


async def test_a_cancel_before_the_request_reached_the_core_holds() -> None:
    held, execution = held_request(queue_ns=1500)
    cancellation = Cancellation()
    cancellation.cancel()
    assert held.item is not None and held.item.context is not None
    assert not held.item.context.cancelled
    cancellation.bind(held, queues=True)
    assert held.item.context.cancelled and not execution.done()
    execution.cancel()


async def test_a_request_of_a_scheduler_without_a_queue_is_only_marked() -> None:
    # An ensemble or a generation runs its request at once and sets no queue time: a
    # cancel marks it and its responses go on.
    held, execution = held_request(queue_ns=0)
    cancellation = Cancellation()
    cancellation.bind(held, queues=False)
    cancellation.cancel()
    assert held.item is not None and held.item.context is not None
    assert held.item.context.cancelled and not execution.done()
    execution.cancel()
