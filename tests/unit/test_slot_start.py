"""A load whose slot threads cannot all start (a huge instance_group count, or a process
short of threads) fails with a 4xx naming the model, and leaves no thread behind: a
process that kept them would fail every later load too."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import pytest

from ge_serve.backends.base import LoadedModel, SlotInfo
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.factory import SchedulerOptions, build_scheduler
from ge_serve.server.errors import ErrorCode, ServerError


class Counted:
    def __init__(self, index: int) -> None:
        self.slot = SlotInfo(name=f"counted_{index}", device="cpu")
        self.closes = 0

    def execute(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return dict(inputs)

    def close(self) -> None:
        self.closes += 1


def _config(batching: bool) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig(name="many", max_batch_size=8)
    if batching:
        config.dynamic_batching.SetInParent()
    return config


@pytest.mark.parametrize("batching", [False, True])
def test_a_slot_thread_that_cannot_start_fails_the_load_and_stops_the_others(
    monkeypatch: pytest.MonkeyPatch, batching: bool
) -> None:
    executors = [Counted(i) for i in range(5)]
    loaded = LoadedModel(executors=list(executors))
    started: list[threading.Thread] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if len(started) == 3:
            raise RuntimeError("can't start new thread")
        real_start(thread)
        started.append(thread)

    with monkeypatch.context() as patch:
        patch.setattr(threading.Thread, "start", start)
        with pytest.raises(ServerError) as failed:
            build_scheduler(_config(batching), loaded, SchedulerOptions())

    assert failed.value.code is ErrorCode.INVALID_ARG
    assert str(failed.value) == (
        "model 'many': could not start a thread for each of its 5 instances, 3 started "
        "(can't start new thread)"
    )
    for thread in started:
        thread.join(10)
        assert not thread.is_alive(), thread.name
    # The slots left the executors to the load that failed, which closes each once.
    assert [e.closes for e in executors] == [0] * 5
    loaded.close()
    assert [e.closes for e in executors] == [1] * 5
