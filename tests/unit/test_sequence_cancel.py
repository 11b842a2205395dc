"""Cancelling a queued request of a sequence cancels the sequence, as in Triton's
sequence batcher: the requests it has queued come back CANCELLED (counted as CANCELED),
none of them runs, its slot goes to the backlog, and its ID must START again."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest
from seqharness import Accumulator, batcher, config, req, send, turns, value

from ge_serve.scheduler.sequence import SequenceBatcher
from ge_serve.server.errors import ErrorCode, FailureReason, ServerError

pytestmark = pytest.mark.timeout(30)

STRATEGIES = ["direct {}", "oldest { max_candidate_sequences: 1 }"]


async def cancelled(future: Awaitable[object]) -> None:
    with pytest.raises(ServerError) as info:
        await asyncio.wait_for(future, 10)
    assert info.value.code is ErrorCode.CANCELLED
    assert info.value.reason is FailureReason.CANCELED  # nv_inference_request_failure


async def refused_without_start(b: SequenceBatcher, seq: int) -> None:
    with pytest.raises(ServerError) as info:
        await b.submit(req(1, seq))
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "must specify the START flag" in info.value.message


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_cancelling_a_queued_request_cancels_its_sequence(strategy: str) -> None:
    model = Accumulator(blocked=True)
    b = batcher(config(strategy, mbs=1), model)
    try:
        first = send(b, req(1, 1, start=True))
        assert await model.started() == 1
        queued = [send(b, req(2, 1)), send(b, req(3, 1))]
        backlog = send(b, req(100, 2, start=True))  # the only slot is sequence 1's
        await turns()
        queued[0].cancel()
        await turns()
        model.open()
        assert await value(first) == 1  # it was running: it finishes
        assert queued[0].cancelled()
        await cancelled(queued[1])
        # The slot is released: the backlogged sequence runs in it.
        assert await value(backlog) == 100
        # Sequence 1 has ended.
        await refused_without_start(b, 1)
    finally:
        model.open()
        await b.close(5.0)
    assert [batch["CORRID"] for batch in model.batches] == [[1], [2]]


async def test_requests_before_the_cancelled_one_still_run() -> None:
    model = Accumulator(blocked=True)
    b = batcher(config(mbs=1), model)
    try:
        first = send(b, req(1, 1, start=True))
        assert await model.started() == 1
        queued = [send(b, req(2, 1)), send(b, req(3, 1)), send(b, req(4, 1))]
        await turns()
        queued[1].cancel()
        await turns()
        model.open()
        assert (await value(first), await value(queued[0])) == (1, 3)
        await cancelled(queued[2])
        await refused_without_start(b, 1)
    finally:
        model.open()
        await b.close(5.0)
    assert [batch["INPUT"] for batch in model.batches] == [[1], [2]]


async def test_cancelling_a_backlogged_request_cancels_its_sequence() -> None:
    model = Accumulator(blocked=True)
    b = batcher(config(mbs=1), model)
    try:
        running = send(b, req(1, 7, start=True))
        assert await model.started() == 1
        backlogged = [send(b, req(5, 8, start=True)), send(b, req(6, 8))]
        after = send(b, req(50, 9, start=True))
        await turns()
        backlogged[0].cancel()
        await turns()
        ending = send(b, req(2, 7, end=True))
        model.open()
        assert (await value(running), await value(ending)) == (1, 3)
        assert backlogged[0].cancelled()
        await cancelled(backlogged[1])
        # The freed slot goes to the next backlogged sequence instead.
        assert await value(after) == 50
        await refused_without_start(b, 8)
    finally:
        model.open()
        await b.close(5.0)
    assert [batch["CORRID"] for batch in model.batches] == [[7], [7], [9]]


async def test_two_cancelled_sequences_hand_their_slots_to_two_backlogged_ones() -> None:
    # Both slots' sequences have a cancelled request next when the instance goes idle:
    # releasing the first slot binds and runs a backlogged sequence, and the second
    # release must free only the slot of the sequence it ended, not the one now in it.
    model = Accumulator(blocked=True)
    b = batcher(config(mbs=2), model)
    try:
        first = send(b, req(1, 1, start=True))
        assert await model.started() == 1
        heads = [send(b, req(2, 1)), send(b, req(10, 2, start=True))]
        backlog = [send(b, req(30, 3, start=True)), send(b, req(40, 4, start=True))]
        await turns()
        for head in heads:
            head.cancel()
        await turns()
        model.open()
        assert await value(first) == 1
        assert (await value(backlog[0]), await value(backlog[1])) == (30, 40)
        # Both keep their slots: their next requests run.
        more = [send(b, req(5, 3, end=True)), send(b, req(6, 4, end=True))]
        assert (await value(more[0]), await value(more[1])) == (35, 46)
    finally:
        model.open()
        await b.close(5.0)
