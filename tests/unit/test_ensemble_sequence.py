"""How the ensemble scheduler carries a request's sequence, through submit() only, with a
fake step runner that records each step request and answers as its test says: every step
gets the request's correlation ID and flags, a step model's sequence response parameters
pass on to the steps after it, and the ensemble echoes the sequence as Triton does."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest

from ge_serve.backends.base import ParamValue
from ge_serve.scheduler.correlation import SequenceFlags
from ge_serve.scheduler.ensemble import (
    EnsemblePlan,
    EnsembleScheduler,
    EnsembleStep,
    StepCall,
    StepResult,
)
from ge_serve.scheduler.work import Timings, WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = pytest.mark.timeout(30)

# IN -> first -> mid -> second -> OUT; each step model copies X to Y.
CHAIN = EnsemblePlan(
    "chain",
    (
        EnsembleStep("first", "", (("X", "IN"),), (("Y", "mid"),)),
        EnsembleStep("second", "", (("X", "mid"),), (("Y", "OUT"),)),
    ),
    ("OUT",),
)


class Steps:
    """The step runner: records each call; `answers` gives a step model's response
    parameters."""

    def __init__(self, answers: Mapping[str, Mapping[str, ParamValue]] | None = None) -> None:
        self.answers = answers or {}
        self.calls: list[StepCall] = []

    async def __call__(self, call: StepCall) -> StepResult:
        self.calls.append(call)
        parameters = self.answers.get(call.model_name, {})
        return StepResult({"Y": call.inputs["X"]}, Timings(), parameters)

    def sequences(self) -> list[SequenceFlags]:
        return [call.sequence for call in self.calls]


async def run(steps: Steps, sequence: SequenceFlags | None) -> WorkItem:
    item = WorkItem({"IN": np.ones((1, 1), np.int32)}, 1, sequence=sequence)
    outputs = await EnsembleScheduler(CHAIN, steps).submit(item)
    assert outputs["OUT"].tolist() == [[1]]
    return item


@pytest.mark.parametrize(
    "sequence",
    [SequenceFlags(21, start=True), SequenceFlags(21), SequenceFlags("s-1", end=True)],
)
async def test_every_step_gets_the_requests_sequence_and_the_response_echoes_it(
    sequence: SequenceFlags,
) -> None:
    steps = Steps()
    item = await run(steps, sequence)
    assert steps.sequences() == [sequence, sequence]
    assert item.response_parameters == {
        "sequence_id": sequence.correlation_id,
        "sequence_start": sequence.start,
        "sequence_end": sequence.end,
    }


async def test_a_request_without_a_sequence_echoes_id_0_and_no_flags() -> None:
    steps = Steps()
    item = await run(steps, None)
    assert [s.in_sequence or s.start or s.end for s in steps.sequences()] == [False, False]
    assert item.response_parameters == {
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
    }


async def test_a_steps_sequence_parameters_pass_to_the_steps_after_it() -> None:
    # The first step model ends the sequence; a flag it leaves out reads false.
    steps = Steps({"first": {"sequence_end": True, "other": 3}})
    item = await run(steps, SequenceFlags(21, start=True))
    assert steps.sequences() == [SequenceFlags(21, start=True), SequenceFlags(21, end=True)]
    assert item.response_parameters == {
        "sequence_id": 21,
        "sequence_start": False,
        "sequence_end": True,
    }


async def test_an_answered_id_of_the_other_type_echoes_as_triton_writes_it() -> None:
    steps = Steps({"first": {"sequence_id": "renamed"}})
    item = await run(steps, SequenceFlags(21))
    assert steps.sequences()[1] == SequenceFlags("renamed")
    assert item.response_parameters is not None
    assert item.response_parameters["sequence_id"] == 0


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (
            {"sequence_id": 1.5},
            "expected parameter 'sequence_id' to be TRITONSERVER_PARAMETER_INT or "
            "TRITONSERVER_PARAMETER_STRING",
        ),
        (
            {"sequence_start": 1},
            "expect parameter 'sequence_start' to be TRITONSERVER_PARAMETER_BOOL",
        ),
    ],
)
async def test_sequence_parameters_of_the_wrong_type_fail_the_ensemble(
    answer: Mapping[str, ParamValue], message: str
) -> None:
    with pytest.raises(ServerError) as caught:
        await run(Steps({"first": answer}), SequenceFlags(21))
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == f"in ensemble 'chain', {message}"
