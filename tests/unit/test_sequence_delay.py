"""TRITONSERVER_DELAY_SCHEDULER and TRITONSERVER_BACKLOG_DELAY_SCHEDULER hold the sequence
batcher until enough requests are queued, with Triton's counting for each strategy."""

from __future__ import annotations

import pytest
from seqharness import Accumulator, batcher, config, req, send, turns, value

from ge_serve.scheduler.factory import SchedulerOptions
from ge_serve.server.cli import parse_settings
from ge_serve.server.startup.part_settings import scheduler_options

pytestmark = pytest.mark.timeout(30)


async def test_direct_waits_for_the_delay_count_then_forms_one_batch() -> None:
    model = Accumulator()
    b = batcher(config(mbs=4), model, options=SchedulerOptions(delay_count=4))
    try:
        futures = []
        for seq in (1, 2, 3):
            futures.append(send(b, req(seq, seq, start=True)))
            await turns()
            assert model.batches == []  # held: fewer than 4 requests queued
        futures.append(send(b, req(4, 4, start=True)))
        assert [await value(f) for f in futures] == [1, 2, 3, 4]
        # Once reached, the hold is gone: a lone request runs at once.
        assert await value(send(b, req(10, 1))) == 11
    finally:
        await b.close(5.0)
    assert [batch["CORRID"] for batch in model.batches] == [[1, 2, 3, 4], [1]]


async def test_direct_counts_every_queued_request_of_every_slot() -> None:
    model = Accumulator()
    b = batcher(config(mbs=2), model, options=SchedulerOptions(delay_count=3))
    try:
        futures = [send(b, req(1, 1, start=True)), send(b, req(2, 1))]
        await turns()
        assert model.batches == []
        futures.append(send(b, req(5, 2, start=True)))
        assert [await value(f) for f in futures] == [1, 3, 5]
    finally:
        await b.close(5.0)
    assert [batch["INPUT"] for batch in model.batches] == [[1, 5], [2]]


async def test_direct_also_waits_for_the_backlog_delay_count() -> None:
    model = Accumulator()
    options = SchedulerOptions(delay_count=1, backlog_delay_count=2)
    b = batcher(config(mbs=1), model, options=options)
    try:
        bound = send(b, req(1, 1, start=True, end=True))
        backlogged = [send(b, req(5, 2, start=True))]
        await turns()
        assert model.batches == []  # 1 queued in the slots, but 1 < 2 in the backlog
        backlogged.append(send(b, req(6, 2, end=True)))
        assert await value(bound) == 1
        assert [await value(f) for f in backlogged] == [5, 11]
    finally:
        await b.close(5.0)
    assert [batch["CORRID"] for batch in model.batches] == [[1], [2], [2]]


async def test_oldest_waits_for_that_many_ready_sequences() -> None:
    model = Accumulator()
    cfg = config("oldest { max_candidate_sequences: 4 }", mbs=4)
    b = batcher(cfg, model, options=SchedulerOptions(delay_count=3, backlog_delay_count=9))
    try:
        futures = [send(b, req(1, 1, start=True)), send(b, req(2, 1))]
        futures.append(send(b, req(10, 2, start=True)))
        await turns()
        assert model.batches == []  # 3 requests, but only 2 sequences with one ready
        futures.append(send(b, req(20, 3, start=True)))  # the backlog count is direct's
        assert [await value(f) for f in futures] == [1, 3, 10, 20]
    finally:
        await b.close(5.0)
    assert [batch["CORRID"] for batch in model.batches] == [[1, 2, 3], [1]]


def test_the_server_reads_both_variables_at_startup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONSERVER_DELAY_SCHEDULER", "4")
    monkeypatch.setenv("TRITONSERVER_BACKLOG_DELAY_SCHEDULER", "2x")  # atoi, as Triton
    options = scheduler_options(parse_settings(["--model-repository", "/nonexistent"]))
    assert (options.delay_count, options.backlog_delay_count) == (4, 2)
