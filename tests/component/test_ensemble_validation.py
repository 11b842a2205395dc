"""Ensemble load-time validation, one case per kind of error, with Triton's reasons; in
process, through the control (tests/ensemblecore.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from ensemblecore import explicit_core, row, without_heap_settling
from ensemblerepo import (
    ensemble_config,
    step,
    tensor,
    write_add_sub,
    write_addk,
    write_ensemble,
    write_pipelines,
)
from modelgen import add_const_model, write_model

from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.reports import ModelState

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def no_heap_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    without_heap_settling(monkeypatch)


@pytest.fixture
async def core(tmp_path: Path) -> AsyncIterator[InferenceServer]:
    async with explicit_core(tmp_path) as served:
        yield served


ADD1_IN = step("add1", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})
# Each case: the ensemble `pipe`'s steps (and config arguments), and Triton's reason.
INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "unknown model": (
        {"steps": [step("nope", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]},
        "ensemble pipe contains models that are not available or ambiguous: nope",
    ),
    "unknown step input": (
        {"steps": [step("add1", {"WRONG": "IN"}, {"OUTPUT0": "OUT"})]},
        "in ensemble pipe, ensemble tensor IN is mapping to non-existing input WRONG in model add1",
    ),
    "unknown step output": (
        {"steps": [step("add1", {"INPUT0": "IN"}, {"WRONG": "OUT"})]},
        "in ensemble pipe, ensemble tensor OUT is mapped from non-existing output WRONG in "
        "model add1",
    ),
    "step input not fed": (
        {"steps": [step("add_sub", {"A": "IN"}, {"SUM": "OUT"})]},
        "in ensemble pipe, input B in model add_sub is not mapped to any ensemble tensors",
    ),
    "cycle": (
        {
            "steps": [
                step("add_sub", {"A": "IN", "B": "back"}, {"SUM": "x"}),
                step("add1", {"INPUT0": "x"}, {"OUTPUT0": "back"}),
                step("add10", {"INPUT0": "x"}, {"OUTPUT0": "OUT"}),
            ]
        },
        "circular dependency in ensemble 'pipe': step 0 (model 'add_sub') -> "
        "step 1 (model 'add1') -> step 0 (model 'add_sub')",
    ),
    "cycle between ensembles": (
        {"steps": [step("pipe2", {"IN": "IN"}, {"OUT": "OUT"})]},
        "circular dependency between ensembles: pipe -> pipe2 -> pipe",
    ),
    "type mismatch": (
        {"steps": [ADD1_IN], "inputs": [tensor("IN", "TYPE_INT32")]},
        "in ensemble pipe, ensemble tensor IN: inconsistent data type: TYPE_INT32 is "
        "inferred from model pipe while TYPE_FP32 is inferred from model add1",
    ),
    "shape mismatch": (
        {
            "steps": [
                step("add1", {"INPUT0": "IN"}, {"OUTPUT0": "mid"}),
                step("wide", {"INPUT0": "mid"}, {"OUTPUT0": "OUT"}),
            ],
            "outputs": [tensor("OUT", dims=[8])],
        },
        "in ensemble pipe, ensemble tensor mid: inconsistent shape: [-1,4] is inferred from "
        "model add1 while [-1,8] is inferred from model wide",
    ),
    "batch size too large": (
        {"steps": [ADD1_IN], "max_batch_size": 16},
        "ensemble pipe allows maximum batch size 16, but it contains model add1 which only "
        "allows maximum batch size to be 8",
    ),
    "output never written": (
        {
            "steps": [
                step("add1", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
                step("add_sub", {"A": "a", "B": "ghost"}, {"SUM": "OUT"}),
            ]
        },
        "output 'OUT' for ensemble 'pipe' is not written: at least one of its depending "
        "tensors, 'ghost', is not connected",
    ),
    "output not produced at all": (
        {"steps": [ADD1_IN], "outputs": [tensor("OUT"), tensor("OTHER")]},
        "ensemble output 'OTHER' for ensemble pipe' is not used",
    ),
    "tensor written twice": (
        {"steps": [ADD1_IN, step("add10", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]},
        "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'pipe' step 1",
    ),
    "tensor never read": (
        {"steps": [ADD1_IN, step("add10", {"INPUT0": "IN"}, {"OUTPUT0": "spare"})]},
        "ensemble tensor 'spare' is unused in ensemble 'pipe'",
    ),
    "input never read": (
        {"steps": [ADD1_IN], "inputs": [tensor("IN"), tensor("UNUSED")]},
        "ensemble input 'UNUSED' for ensemble pipe' is not used",
    ),
    "version not loaded": (
        {"steps": [step("add1", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}, version=7)]},
        "ensemble 'pipe' depends on 'add1' whose required version 7 is not loaded.",
    ),
    "step fed from two decoupled origins": (
        {
            "steps": [
                step("stream", {"INPUT0": "IN"}, {"OUTPUT0": "mid"}),
                step("add_sub", {"A": "IN", "B": "mid"}, {"SUM": "OUT"}),
            ]
        },
        "in ensemble pipe, step of model 'add_sub' receives inputs originated from "
        "different decoupled models",
    ),
    "outputs from two decoupled origins": (
        {
            "steps": [
                step("stream", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
                step("add1", {"INPUT0": "IN"}, {"OUTPUT0": "OTHER"}),
            ],
            "outputs": [tensor("OUT"), tensor("OTHER")],
        },
        "in ensemble pipe, the ensemble outputs originate from different decoupled models; "
        "a response carries outputs of one origin",
    ),
    "instance group": (
        {"steps": [ADD1_IN], "extra": "instance_group [{ count: 1 kind: KIND_CPU }]"},
        "instance group should not be specified for ensemble 'pipe'",
    ),
    "backend": (
        {"steps": [ADD1_IN], "extra": 'backend: "python"'},
        "Ensemble model 'pipe' must have platform type 'ensemble' and empty backend type",
    ),
    "no steps": (
        {"steps": []},
        "must specify 'step' for ensemble 'pipe'",
    ),
}


def write_step_models(repo: Path) -> None:
    write_addk(repo, "add1", 1.0)
    write_addk(repo, "add10", 10.0)
    write_add_sub(repo)
    config = (
        'name: "wide"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        f"input [{tensor('INPUT0', dims=[8])}]\noutput [{tensor('OUTPUT0', dims=[8])}]\n"
    )
    write_model(repo, "wide", add_const_model(1.0, 8), config)
    write_addk(repo, "stream", 1.0, "model_transaction_policy { decoupled: true }")
    back = [step("pipe", {"IN": "IN"}, {"OUT": "OUT"})]
    write_ensemble(repo, "pipe2", ensemble_config("pipe2", back))


@pytest.mark.parametrize("kind", list(INVALID))
async def test_an_invalid_ensemble_fails_its_load_and_says_why(
    kind: str, tmp_path: Path, core: InferenceServer
) -> None:
    arguments, reason = INVALID[kind]
    write_step_models(tmp_path)
    write_ensemble(tmp_path, "pipe", ensemble_config("pipe", **arguments))
    with pytest.raises(ServerError) as caught:
        await core.load_model("pipe")
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == f"failed to load 'pipe': {reason}"
    state = row(core, "pipe")
    assert (state.state, state.reason) == (ModelState.UNAVAILABLE, reason)
    assert not core.ready()


async def test_a_step_model_that_fails_to_load_leaves_the_ensemble_unavailable(
    tmp_path: Path, core: InferenceServer
) -> None:
    write_pipelines(tmp_path)
    (tmp_path / "add10" / "1" / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(ServerError) as caught:
        await core.load_model("chain")
    prefix = (
        "ensemble 'chain' depends on 'add10' which has no loaded version. Model 'add10' "
        "loading failed with error: "
    )
    assert caught.value.message.startswith(f"failed to load 'chain': {prefix}")
    assert row(core, "chain").reason.startswith(prefix)
    assert row(core, "add10").state is ModelState.UNAVAILABLE
    assert core.model_ready("add1")
