"""The batch dimension between an ensemble and its steps, as Triton's ReshapeTensorDims
sets it: the rule itself, and a decoupled ensemble keeping each tensor's batch size (the
core puts the dimension on a step's inputs; the scheduler takes it off the outputs)."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import numpy as np
import pytest
from recording_sink import RecordingSink

from ge_serve.backends.base import RequestContext
from ge_serve.scheduler.ensemble import EnsemblePlan, EnsembleStep, StepCall, StepResult
from ge_serve.scheduler.ensemble_shapes import batch_reshape
from ge_serve.scheduler.ensemble_stream import DecoupledEnsembleScheduler
from ge_serve.scheduler.work import Timings, WorkItem

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("dims", "batching", "made", "shape", "expected"),
    [
        # Into a model that batches, from one that does not: a batch of 1 where the shape
        # is the config's dims, else as it is (taken to hold its batch already).
        ((-1,), True, 0, (3,), (1, 3)),
        ((-1,), True, 0, (0,), (1, 0)),
        ((4,), True, 0, (2, 4), (2, 4)),
        # Into one that does not batch, from a batch of 1: off where the shape is not the
        # config's dims; a larger batch, or one the dims allow, passes as it is.
        ((-1,), False, 1, (1, 3), (3,)),
        ((-1, -1), False, 1, (1, 3), (1, 3)),
        ((-1,), False, 2, (2, 3), (2, 3)),
        # Both the same: never.
        ((-1,), True, 1, (1, 3), (1, 3)),
        ((-1,), False, 0, (3,), (3,)),
    ],
)
def test_the_batch_dimension_fix_up(
    dims: tuple[int, ...],
    batching: bool,
    made: int,
    shape: tuple[int, ...],
    expected: tuple[int, ...],
) -> None:
    assert batch_reshape(dims, batching, made, shape) == expected


async def test_a_decoupled_ensemble_that_does_not_batch_answers_without_the_steps_batch() -> None:
    plan = EnsemblePlan(
        "stream",
        (EnsembleStep("repeat", "", (("X", "IN"),), (("Y", "OUT"),), decoupled=True),),
        ("OUT",),
        decoupled=True,
        inputs=("IN",),
        batching=False,
        output_dims={"OUT": (-1,)},
    )
    calls: list[StepCall] = []

    async def stream(call: StepCall) -> AsyncGenerator[StepResult, None]:
        calls.append(call)
        batched = call.inputs["X"][None]  # as the core hands a batching step its input
        for _ in range(2):
            yield StepResult({"Y": batched}, Timings(), {}, False, batch_size=1)

    async def run(call: StepCall) -> StepResult:
        raise AssertionError("no step answers once")

    sink = RecordingSink()
    data = np.arange(3, dtype=np.float32)
    item = WorkItem({"IN": data}, 1, context=RequestContext(responses=sink))
    await DecoupledEnsembleScheduler(plan, run, stream).submit(item)
    # The ensemble's input was made without batching; each response loses the step's.
    assert [dict(call.batch_sizes) for call in calls] == [{"X": 0}]
    answers = [sent.outputs for sent in sink.sent if sent.outputs is not None]
    assert [a["OUT"].shape for a in answers] == [(3,), (3,)]
