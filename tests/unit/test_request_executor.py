"""Whether an executor takes a batch as its requests is decided once: the backend says
`per_request` on its LoadedModel, which is checked against the executors at load, and
the scheduler asks `takes_requests`, which agrees with it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from ge_serve.backends.base import (
    Array,
    LoadedModel,
    ModelRequest,
    RequestContext,
    RequestExecutor,
    SlotInfo,
    takes_requests,
)
from ge_serve.scheduler.batch import execute_batch
from ge_serve.scheduler.work import WorkItem


class Merged:
    def __init__(self) -> None:
        self.slot = SlotInfo(name="merged", device="cpu")

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        return {"y": np.asarray(inputs["x"]) * 2}

    def close(self) -> None:
        pass


class ByRequest(Merged):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def execute_requests(self, requests: Sequence[ModelRequest]) -> list[dict[str, Array]]:
        self.seen.extend(r.context.id for r in requests)
        return [{"y": np.asarray(r.inputs["x"]) + 1} for r in requests]


def test_the_backend_says_per_request_and_its_executors_must_agree() -> None:
    assert LoadedModel(executors=[ByRequest()], per_request=True).per_request
    assert not LoadedModel(executors=[Merged()]).per_request
    with pytest.raises(TypeError, match="ByRequest is not an Executor"):
        LoadedModel(executors=[ByRequest()])
    with pytest.raises(TypeError, match="Merged is not a RequestExecutor"):
        LoadedModel(executors=[Merged()], per_request=True)


def test_takes_requests_is_the_protocol() -> None:
    assert takes_requests(ByRequest()) and isinstance(ByRequest(), RequestExecutor)
    assert not takes_requests(Merged()) and not isinstance(Merged(), RequestExecutor)


def test_the_scheduler_hands_a_request_executor_each_request() -> None:
    executor = ByRequest()
    items = [
        WorkItem({"x": np.array([[1.0]])}, 1, context=RequestContext(id="a")),
        WorkItem({"x": np.array([[5.0]])}, 1, context=RequestContext(id="b")),
    ]
    results = execute_batch(executor, items, (), batching=True)
    assert executor.seen == ["a", "b"]
    assert [r["y"].tolist() for r in results] == [[[2.0]], [[6.0]]]
    merged = execute_batch(Merged(), items, (), batching=True)
    assert [r["y"].tolist() for r in merged] == [[[2.0]], [[10.0]]]
