"""A request whose data the model cannot run fails alone: the batch it was merged into is
run again request by request, so the requests batched with it get their answers."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from fake_executor import POISON, Poisoned, item, make_batcher, make_config, queued

from ge_serve.backends.base import Array, ModelRequest, SlotInfo
from ge_serve.scheduler.batch import RunAlone, execute_isolated
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = pytest.mark.timeout(30)


async def _answers(preserve_ordering: bool) -> tuple[Poisoned, list[Any]]:
    fake = Poisoned("poisoned", blocked=True)
    batcher = make_batcher(
        make_config(max_batch_size=8, preserve_ordering=preserve_ordering), [fake]
    )
    try:
        blocker = asyncio.create_task(batcher.submit(item(-1)))
        await fake.started()
        tasks = [asyncio.create_task(batcher.submit(item(v))) for v in (1, POISON, 3)]
        await queued(batcher, 3)
        fake.open()
        answers = await asyncio.gather(*tasks, return_exceptions=True)
        await blocker
        return fake, answers
    finally:
        fake.open()
        await batcher.close(5.0)


@pytest.mark.parametrize("preserve_ordering", [False, True])
async def test_only_the_request_the_model_cannot_run_fails(preserve_ordering: bool) -> None:
    fake, (first, poisoned, last) = await _answers(preserve_ordering)
    assert fake.batches == [[-1], [1, POISON, 3], [1], [POISON], [3]]
    assert isinstance(first, dict) and isinstance(last, dict)
    np.testing.assert_array_equal(first["y"], np.full((1, 4), 2.0))
    np.testing.assert_array_equal(last["y"], np.full((1, 4), 6.0))
    # Each answered by its own run, as a batch of one.
    assert first["n"].tolist() == last["n"].tolist() == [[1]]
    assert isinstance(poisoned, ServerError)
    assert poisoned.code is ErrorCode.INTERNAL
    assert poisoned.message == f"RuntimeError: cannot take {POISON}"


class ByRequest:
    """A RequestExecutor (a Python model's) that raises for the whole execution."""

    def __init__(self) -> None:
        self.slot = SlotInfo(name="by_request", device="cpu")
        self.calls = 0

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        raise AssertionError("a RequestExecutor is handed requests")

    def execute_requests(self, requests: Sequence[ModelRequest]) -> list[dict[str, Array]]:
        self.calls += 1
        raise RuntimeError("the model raised")

    def close(self) -> None:
        pass


def _items(*values: float) -> list[WorkItem]:
    return [WorkItem({"x": np.full((1, 2), v, dtype=np.float32)}, 1) for v in values]


def test_a_request_executor_that_raised_is_not_run_again() -> None:
    # It answers each request on its own already; running its requests again would run
    # the model's side effects (BLS calls, logs) twice.
    executor = ByRequest()
    with pytest.raises(RuntimeError, match="the model raised"):
        execute_isolated(executor, _items(1, 2), (), batching=True)
    assert executor.calls == 1


def test_a_lone_request_that_fails_runs_once() -> None:
    class Counting:
        def __init__(self) -> None:
            self.slot = SlotInfo(name="counting", device="cpu")
            self.runs = 0

        def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
            self.runs += 1
            raise RuntimeError("no")

        def close(self) -> None:
            pass

    executor = Counting()
    with pytest.raises(RuntimeError, match="no"):
        execute_isolated(executor, _items(1), (), batching=True)
    assert executor.runs == 1
    outcome = execute_isolated(executor, _items(1, 2), (), batching=True)
    assert isinstance(outcome, RunAlone) and executor.runs == 4
    assert [str(o) for o in outcome.outcomes] == ["no", "no"]
    # Kept without their tracebacks, whose frames would hold the batch's inputs.
    assert all(isinstance(o, Exception) and o.__traceback__ is None for o in outcome.outcomes)
