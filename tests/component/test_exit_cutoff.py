"""What a stopping server does at its exit timeout, in process: `end_running` answers every
request still in the core with UNAVAILABLE, however it got there (a model's own request,
an ensemble step in its request's task, steps in tasks of their own), and refuses the
ones after it. The front ends' side is tests/e2e/test_shutdown_cutoff.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ensemblecore import explicit_core, ones, request
from ensemblerepo import write_pipelines
from polling import poll

from ge_serve.scheduler.base import Scheduler
from ge_serve.scheduler.work import Array, WorkItem
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.core import InferenceServer

pytestmark = pytest.mark.timeout(60)

CUT_OFF = "Server is shutting down: the request did not finish within the exit timeout"


class Endless:
    """A step model's scheduler whose requests never end on their own: an execution
    longer than any exit timeout."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.waiting = 0
        self.cancelled = 0

    @property
    def pending(self) -> int:
        return self.waiting

    async def submit(self, item: WorkItem) -> dict[str, Array]:
        self.waiting += 1
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("unreachable")

    async def close(self, drain_timeout_s: float) -> None:
        await self.inner.close(drain_timeout_s)


@pytest.fixture
async def core(tmp_path: Path) -> AsyncIterator[InferenceServer]:
    write_pipelines(tmp_path)
    async with explicit_core(tmp_path) as served:
        await served.load_model("chain")
        await served.load_model("diamond")
        yield served


async def outcome(core: InferenceServer, model: str) -> tuple[ServerError, int]:
    """The error the request ends with, and whether its task is still being cancelled
    afterwards (it must not be: it goes on to answer its client)."""
    name = "INPUT0" if model == "add1" else "IN"
    with pytest.raises(ServerError) as caught:
        await core.infer(request(model, ones(), name))
    task = asyncio.current_task()
    assert task is not None
    return caught.value, task.cancelling()


async def test_requests_still_running_are_answered_unavailable(core: InferenceServer) -> None:
    add1 = core.model("add1")
    endless = Endless(add1.scheduler)
    add1.scheduler = endless
    # add1 itself; `chain` runs its one ready step in its own task; `diamond` runs add1
    # and add10 at once, each in a task of its own.
    running = [asyncio.create_task(outcome(core, m)) for m in ("add1", "chain", "diamond")]
    await asyncio.to_thread(poll, lambda: endless.waiting == 3, 10, "three requests in add1")

    assert core.end_running() >= 3
    errors = await asyncio.gather(*running)
    for error, cancelling in errors:
        assert error.code is ErrorCode.UNAVAILABLE
        # An ensemble's step may fail first, and the ensemble names itself in front.
        assert error.message.endswith(CUT_OFF)
        assert cancelling == 0
    # The scheduler saw each leave as it sees a client that goes away.
    assert endless.cancelled == 3

    with pytest.raises(ServerError) as refused:
        await core.infer(request("add10", ones(), "INPUT0"))
    assert (refused.value.code, refused.value.message) == (
        ErrorCode.UNAVAILABLE,
        "Server is shutting down",
    )
    assert core.end_running() == 0
