"""Trace sampling and settings: rate, count, per-model settings over the global ones, and
the extension's checks."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ge_serve.backends.base import SlotInfo
from ge_serve.scheduler.batch import execute_batch
from ge_serve.scheduler.work import Timings, WorkItem
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.observability.traceconfig import TraceSettings
from ge_serve.server.observability.tracefile import TraceFileSink
from ge_serve.server.observability.tracing import Trace, TraceControl


class Kept:
    def __init__(self) -> None:
        self.done: list[Any] = []

    def started(self, trace: Any) -> None:
        pass

    def finished(self, trace: Any) -> None:
        self.done.append(trace)

    def close(self) -> None:
        pass


def sampled(control: TraceControl, model: str, times: int) -> int:
    return sum(control.begin(model, 1, "", "", 0) is not None for _ in range(times))


def test_off_means_inactive_and_nothing_sampled() -> None:
    control = TraceControl()
    assert not control.active
    assert sampled(control, "m", 10) == 0


def test_rate_and_count() -> None:
    control = TraceControl(TraceSettings(level=("TIMESTAMPS",), rate=3, count=2, file="t.json"))
    assert control.active
    assert sampled(control, "m", 9) == 2, "every third, until the count runs out"
    assert control.settings()["trace_count"] == "0"


def test_a_global_update_counts_the_rate_from_the_update_on() -> None:
    # As Triton's (and qa's L0_trace): with every second request traced, the second
    # request after the update is the first traced, whatever came before it.
    control = TraceControl(TraceSettings(level=("TIMESTAMPS",), rate=1, file="t.json"))
    control.update("m", {"trace_level": ["TIMESTAMPS"]})
    assert sampled(control, "m", 1) == 1 and sampled(control, "other", 1) == 1
    control.update("", {"trace_rate": ["2"]})
    assert sampled(control, "m", 1) == 0 and sampled(control, "other", 1) == 0
    assert sampled(control, "m", 1) == 1 and sampled(control, "other", 1) == 1


def test_a_model_overrides_only_what_it_sets() -> None:
    control = TraceControl(TraceSettings(level=("TIMESTAMPS",), rate=1, file="t.json"))
    control.update("m", {"trace_rate": ["2"]})
    assert control.settings("m")["trace_rate"] == "2"
    assert control.settings("m")["trace_level"] == ["TIMESTAMPS"]
    assert sampled(control, "m", 4) == 2 and sampled(control, "other", 4) == 4
    control.update("m", {"trace_rate": None})
    assert control.settings("m")["trace_rate"] == "1"
    control.update("m", {"trace_level": ["OFF"]})
    control.update("", {"trace_level": ["OFF"]})
    assert not control.active
    control.update("m", {"trace_level": ["TIMESTAMPS"]})
    assert control.active, "one model still traces"
    control.update("m", {})
    assert not control.active, "a model's empty update drops its own settings"


def test_ending_a_trace_hands_it_to_the_sink_with_its_timestamps() -> None:
    sink = Kept()
    control = TraceControl(TraceSettings(level=("TIMESTAMPS",), rate=1, file="t.json"), sink)
    trace = control.begin("m", 1, "r", "", 5)
    assert trace is not None
    child = control.child(trace, "step", 2, "")
    child.end()
    trace.end()
    assert [t.id for t in sink.done] == [child.id, trace.id]
    assert child.parent_id == trace.id
    assert [name for name, _ in trace.marks] == ["REQUEST_START", "REQUEST_END"]


@pytest.mark.parametrize(
    ("changes", "code", "message"),
    [
        ({"trace_file": ["x"]}, ErrorCode.UNSUPPORTED, "trace file location can not be updated"),
        ({"trace_level": ["OFF", "TENSORS"]}, ErrorCode.INVALID_ARG, "Expect only one trace"),
        ({"trace_rate": ["x"]}, ErrorCode.INVALID_ARG, "Unable to parse 'trace_rate', got: x"),
        ({"trace_count": ["-2"]}, ErrorCode.INVALID_ARG, "Expecting value >= -1, got:-2"),
        ({"log_frequency": ["-1"]}, ErrorCode.INVALID_ARG, "value is out of range [ 0,"),
        ({"trace_colour": ["x"]}, ErrorCode.INVALID_ARG, "unknown trace setting 'trace_colour'"),
    ],
)
def test_bad_updates_change_nothing(
    changes: dict[str, list[str] | None], code: ErrorCode, message: str
) -> None:
    control = TraceControl(TraceSettings(rate=4))
    with pytest.raises(ServerError) as info:
        control.update("", {"trace_rate": ["9"], **changes})
    assert info.value.code is code and message in info.value.message
    assert control.settings()["trace_rate"] == "4"


def _trace() -> Trace:
    return Trace(1, "m", 1, "r", ("TIMESTAMPS",), "triton")


def test_compute_starts_where_the_scheduler_counted_the_queue_from() -> None:
    # The core sets enqueue_ns to the request's start; QUEUE_START comes 300 ns later.
    trace = _trace()
    trace.executed(1_300, Timings(queue_ns=500, compute_input_ns=10), enqueue_ns=1_000)
    marks = dict(trace.marks)
    assert marks["COMPUTE_START"] == 1_500
    assert marks["COMPUTE_INPUT_END"] == 1_510


def test_compute_never_starts_before_queue_start() -> None:
    # An ensemble has no queue of its own: queue_ns 0 from the request's start.
    trace = _trace()
    trace.executed(1_300, Timings(), enqueue_ns=1_000)
    assert dict(trace.marks)["COMPUTE_START"] == 1_300


def test_compute_starts_where_the_execution_began() -> None:
    # The slot's thread began 4 µs after the queue let the request go: a BLS call made
    # inside the execution must end before COMPUTE_END.
    trace = _trace()
    timings = Timings(queue_ns=500, compute_start_ns=5_500, compute_infer_ns=100)
    trace.executed(1_300, timings, enqueue_ns=1_000)
    marks = dict(trace.marks)
    assert marks["COMPUTE_START"] == 5_500
    assert marks["COMPUTE_END"] == 5_600


def test_an_execution_stamps_when_it_began() -> None:
    class Stamping:
        slot = SlotInfo(name="stamping", device="cpu")
        entered = 0

        def execute(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
            Stamping.entered = time.monotonic_ns()
            return dict(inputs)

        def close(self) -> None:
            pass

    work = WorkItem({"X": np.zeros(1)}, 1)
    before = time.monotonic_ns()
    execute_batch(Stamping(), [work], (), batching=False)
    assert before <= work.timings.compute_start_ns <= Stamping.entered


@pytest.mark.parametrize(
    ("startup", "changes", "reason"),
    [
        (TraceSettings(), {"trace_level": ["TIMESTAMPS"]}, "trace file name is not given"),
        (
            TraceSettings(file="t.json"),
            {"trace_level": ["TENSORS"], "trace_rate": ["0"]},
            "sample rate must be non-zero",
        ),
    ],
)
def test_a_setting_that_could_not_trace_is_refused(
    startup: TraceSettings, changes: dict[str, list[str] | None], reason: str
) -> None:
    control = TraceControl(startup)
    for model in ("", "m"):
        with pytest.raises(ServerError) as info:
            control.update(model, changes)
        assert info.value.code is ErrorCode.INVALID_ARG
        assert info.value.message == f"Attempting to set invalid trace setting :{reason}"
        assert control.settings(model)["trace_level"] == ["OFF"] and not control.active
    control.update("", {"trace_level": ["OFF"], "trace_rate": ["0"]})  # tracing nothing is fine


def test_a_models_own_settings_can_be_cleared_whatever_the_global_ones_are() -> None:
    # A level with no file at startup traces nothing; a model's own OFF, then cleared.
    control = TraceControl(TraceSettings(level=("TIMESTAMPS",)))
    control.update("m", {"trace_level": ["OFF"]})
    control.update("m", {})
    assert control.settings("m")["trace_level"] == ["TIMESTAMPS"] and not control.active


def test_a_level_without_a_file_at_startup_traces_nothing() -> None:
    control = TraceControl(TraceSettings(level=("TIMESTAMPS",), rate=1))
    assert not control.active and sampled(control, "m", 5) == 0


def test_models_without_their_own_count_follow_a_new_global_count() -> None:
    control = TraceControl(TraceSettings(level=("TIMESTAMPS",), rate=1, file="t.json"))
    control.update("m", {"trace_rate": ["1"]})
    control.update("own", {"trace_count": ["5"]})
    control.update("", {"trace_count": ["2"]})
    assert control.settings("m")["trace_count"] == "2"
    assert sampled(control, "m", 4) == 2
    assert control.settings("own")["trace_count"] == "5", "its own count stays"


def test_the_trace_file_gets_the_last_traces_when_the_count_runs_out(tmp_path: Path) -> None:
    file = tmp_path / "trace.json"
    control = TraceControl(TraceSettings(level=("TIMESTAMPS",), rate=1, count=2, file=str(file)))
    control.sink = TraceFileSink(control)
    first, second = control.begin("m", 1, "a", "", 0), control.begin("m", 1, "b", "", 0)
    assert first is not None and second is not None
    first.end()
    assert not list(tmp_path.iterdir()), "one trace is still open"
    second.end()
    written = json.loads((tmp_path / "trace.json.0").read_text())
    assert {r.get("request_id") for r in written if "model_name" in r} == {"a", "b"}


def test_only_a_valid_traceparent_forces_a_trace() -> None:
    control = TraceControl(TraceSettings(mode="opentelemetry", level=("TIMESTAMPS",), rate=0))
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert control.begin("m", 1, "", good, 0) is not None
    zero_trace = "00-" + "0" * 32 + good[35:]
    for junk in ("x", good.upper(), "ff" + good[2:], zero_trace):
        assert control.begin("m", 1, "", junk, 0) is None, junk
