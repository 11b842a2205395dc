"""A config that contradicts its ONNX model fails the GE load with Triton's reason.

The cases are Triton's qa L0_model_config autofill_noplatform/onnx ones: a model with no
backend named goes to GE, which must refuse them at load as Triton's onnxruntime backend
does, not load READY and fail every request.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ge_helpers import EXAMPLES

from ge_serve.backends.ge.acl_sim import SimRuntime
from ge_serve.backends.ge.backend import GeBackend
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.server.app import make_scheduler
from ge_serve.server.errors import ServerError
from ge_serve.server.inference.reports import ModelState
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle
from ge_serve.server.models.repository import ModelRepository

# examples/models/simple: INPUT0, INPUT1, OUTPUT0, OUTPUT1, all INT32 [-1, 16].
SIMPLE = EXAMPLES / "simple" / "1" / "model.onnx"
IN0 = '{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }'
IN1 = '{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }'
OUT0 = '{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }'
OUT1 = '{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }'


def config(inputs: list[str], outputs: list[str], max_batch_size: int = 1) -> str:
    return (
        f"max_batch_size: {max_batch_size}\n"
        f"input [ {', '.join(inputs)} ]\noutput [ {', '.join(outputs)} ]\n"
    )


@pytest.fixture
async def life(tmp_path: Path) -> AsyncIterator[ModelLifecycle]:
    lifecycle = ModelLifecycle(
        ModelRepository([tmp_path]),
        {"onnxruntime": OnnxRuntimeBackend(), "ge": GeBackend(SimRuntime())},
        make_scheduler,
        LifecycleSettings(default_backend="ge", unload_timeout_s=5.0),
    )
    try:
        yield lifecycle
    finally:
        await lifecycle.close()


def write(repo: Path, name: str, text: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(text, encoding="utf-8")
    shutil.copyfile(SIMPLE, repo / name / "1" / "model.onnx")


BATCH_NOTE = (
    "(an initial batch dimension because max_batch_size > 0 followed by the explicit "
    "tensor shape, making complete shape"
)


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("bad_input_dims",
         config([IN0.replace("[ 16 ]", "[ 16, 1 ]"), IN1], [OUT0, OUT1]),
         "model 'bad_input_dims', tensor 'INPUT0': the model expects 2 dimensions (shape "
         f"[-1,16]) but the model configuration specifies 3 dimensions {BATCH_NOTE} "
         "[-1,16,1])"),
        ("bad_output_dims",
         config([IN0, IN1], [OUT0, OUT1.replace("[ 16 ]", "[ 1 ]")]),
         "model 'bad_output_dims', tensor 'OUTPUT1': the model expects 2 dimensions (shape "
         f"[-1,16]) but the model configuration specifies 2 dimensions {BATCH_NOTE} [-1,1])"),
        ("no_batch_dims",
         config([IN0, IN1], [OUT0, OUT1], max_batch_size=0),
         "model 'no_batch_dims', tensor 'INPUT0': the model expects 2 dimensions (shape "
         "[-1,16]) but the model configuration specifies 1 dimensions (shape [16])"),
        ("too_few_inputs",
         config([IN1], [OUT0, OUT1]),
         "unable to load model 'too_few_inputs', configuration expects 1 inputs, model "
         "provides 2"),
        ("too_many_inputs",
         config([IN0, IN1, IN1.replace("INPUT1", "INPUT_EXTRA")], [OUT0, OUT1]),
         "unable to load model 'too_many_inputs', configuration expects 3 inputs, model "
         "provides 2"),
        ("unknown_input",
         config([IN0, IN1.replace("INPUT1", "INPUT_UNKNOWN")], [OUT0, OUT1]),
         "unexpected inference input 'INPUT_UNKNOWN', allowed inputs are: INPUT0, INPUT1"),
        ("unknown_output",
         config([IN0, IN1], [OUT0.replace("OUTPUT0", "OUTPUT_UNKNOWN")]),
         "unexpected inference output 'OUTPUT_UNKNOWN', allowed outputs are: OUTPUT0, "
         "OUTPUT1"),
        ("bad_datatype",
         config([IN0.replace("INT32", "FP32"), IN1], [OUT0, OUT1]),
         "unable to load model 'bad_datatype', configuration expects datatype TYPE_FP32 "
         "for input 'INPUT0', model provides TYPE_INT32"),
    ],
)  # fmt: skip
async def test_a_contradicting_config_fails_the_ge_load(
    life: ModelLifecycle, name: str, text: str, reason: str
) -> None:
    repo = life.repository.paths[0]
    write(repo, name, text)
    with pytest.raises(ServerError) as info:
        await life.load(name)
    assert reason in info.value.message
    [row] = life.index()
    assert row.state is ModelState.UNAVAILABLE
    assert reason in row.reason
