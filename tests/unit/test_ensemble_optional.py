"""Missing tensors in the ensemble scheduler, through submit() only, with fake steps: an
output a step did not produce is Triton's placeholder (the next step runs without it, the
ensemble answers without it), in a decoupled ensemble as in any other, and an output no
step can write is Triton's INVALID_ARG "unexpected deadlock"."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import numpy as np
import pytest
from recording_sink import RecordingSink

from ge_serve.backends.base import RequestContext
from ge_serve.scheduler.ensemble import (
    EnsemblePlan,
    EnsembleScheduler,
    EnsembleStep,
    StepCall,
    StepResult,
)
from ge_serve.scheduler.ensemble_stream import DecoupledEnsembleScheduler
from ge_serve.scheduler.work import Timings, WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = pytest.mark.timeout(30)


def pair_step(
    reads: tuple[str, str], writes: tuple[str, str], decoupled: bool = False
) -> EnsembleStep:
    inputs = (("X0", reads[0]), ("X1", reads[1]))
    outputs = (("Y0", writes[0]), ("Y1", writes[1]))
    return EnsembleStep("ident", "", inputs, outputs, decoupled)


# IN0, IN1 (optional) -> ident -> (a0, a1) -> ident -> (OUT0, OUT1)
CONNECTED = EnsemblePlan(
    "connected",
    (pair_step(("IN0", "IN1"), ("a0", "a1")), pair_step(("a0", "a1"), ("OUT0", "OUT1"))),
    ("OUT0", "OUT1"),
    inputs=("IN0", "IN1"),
)


def identity(call: StepCall) -> StepResult:
    """Yn = Xn for each input the step request has."""
    outputs = {f"Y{name[1:]}": array for name, array in call.inputs.items()}
    return StepResult(outputs, Timings())


class Steps:
    def __init__(self) -> None:
        self.calls: list[StepCall] = []

    async def run(self, call: StepCall) -> StepResult:
        self.calls.append(call)
        return identity(call)

    async def stream(self, call: StepCall) -> AsyncGenerator[StepResult, None]:
        self.calls.append(call)
        yield identity(call)


async def test_an_output_a_step_did_not_produce_is_a_missing_input_and_output() -> None:
    steps = Steps()
    data = np.ones((1, 1), np.float32)
    outputs = await EnsembleScheduler(CONNECTED, steps.run).submit(WorkItem({"IN0": data}, 1))
    assert list(outputs) == ["OUT0"]
    np.testing.assert_array_equal(outputs["OUT0"], data)
    assert [sorted(call.inputs) for call in steps.calls] == [["X0"], ["X0"]]


async def test_an_output_no_step_writes_is_a_deadlock_and_the_requests_fault() -> None:
    plan = EnsemblePlan(
        "stuck",
        (EnsembleStep("ident", "", (("X0", "IN0"),), (("Y0", "OUT0"),)),),
        ("OUT0", "NEVER"),
        inputs=("IN0",),
    )
    item = WorkItem({"IN0": np.ones((1, 1), np.float32)}, 1, context=RequestContext(id="r7"))
    with pytest.raises(ServerError) as caught:
        await EnsembleScheduler(plan, Steps().run).submit(item)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == (
        "in ensemble 'stuck', [request id: r7] unexpected deadlock, at least one output is "
        "not set while no more ensemble steps can be made"
    )


async def test_a_decoupled_ensemble_runs_the_steps_without_a_missing_tensor() -> None:
    second = CONNECTED.steps[1]
    plan = EnsemblePlan(
        "connected",
        (pair_step(("IN0", "IN1"), ("a0", "a1"), decoupled=True), second),
        CONNECTED.outputs,
        decoupled=True,
        inputs=CONNECTED.inputs,
    )
    steps, sink = Steps(), RecordingSink()
    data = np.ones((1, 1), np.float32)
    item = WorkItem({"IN1": data}, 1, context=RequestContext(responses=sink))
    await DecoupledEnsembleScheduler(plan, steps.run, steps.stream).submit(item)
    assert [sorted(call.inputs) for call in steps.calls] == [["X1"], ["X1"]]
    (sent,) = sink.sent
    assert sent.outputs is not None and list(sent.outputs) == ["OUT1"] and sent.final
    np.testing.assert_array_equal(sent.outputs["OUT1"], data)


# IN0 -> left -> (L, mid); mid -> right -> R; IN0 -> side -> S (S is read by no one and
# is not an output: Triton never prunes its step).
BRANCHED = EnsemblePlan(
    "branched",
    (
        EnsembleStep("left", "", (("X0", "IN0"),), (("Y0", "L"), ("Y1", "mid"))),
        EnsembleStep("right", "", (("X0", "mid"),), (("Y0", "R"),)),
        EnsembleStep("side", "", (("X0", "IN0"),), (("Y0", "S"),)),
    ),
    ("L", "R"),
    inputs=("IN0",),
)


def both_outputs(call: StepCall) -> StepResult:
    array = call.inputs["X0"]
    return StepResult({"Y0": array, "Y1": array + 1}, Timings())


@pytest.mark.parametrize(
    ("requested", "ran"),
    [
        ((), ["left", "right", "side"]),
        (("L", "R"), ["left", "right", "side"]),
        (("L",), ["left", "side"]),
        (("R",), ["left", "right", "side"]),
    ],
)
@pytest.mark.parametrize("decoupled", [False, True])
async def test_a_request_runs_only_the_steps_its_requested_outputs_need(
    requested: tuple[str, ...], ran: list[str], decoupled: bool
) -> None:
    called: list[str] = []

    async def run(call: StepCall) -> StepResult:
        called.append(call.model_name)
        return both_outputs(call)

    async def stream(call: StepCall) -> AsyncGenerator[StepResult, None]:
        yield await run(call)

    data = np.ones((1, 1), np.float32)
    context = RequestContext(requested_outputs=requested)
    if decoupled:
        plan = EnsemblePlan(BRANCHED.name, BRANCHED.steps, BRANCHED.outputs, True, ("IN0",))
        sink = RecordingSink()
        context.responses = sink
        await DecoupledEnsembleScheduler(plan, run, stream).submit(
            WorkItem({"IN0": data}, 1, context=context)
        )
        outputs = sink.sent[0].outputs or {}
    else:
        item = WorkItem({"IN0": data}, 1, context=context)
        outputs = await EnsembleScheduler(BRANCHED, run).submit(item)
    assert sorted(called) == ran
    if decoupled:  # each response carries the requested outputs
        assert sorted(outputs) == sorted(requested or ("L", "R"))
    else:  # every output written (the response keeps the requested ones)
        assert sorted(outputs) == (["L", "R"] if "right" in ran else ["L"])
