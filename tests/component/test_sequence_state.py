"""Implicit sequence state through the core, for an ONNX and a Python-backend model: the
accumulator of Triton's implicit-state docs, with its state kept between requests, and
the request parameters sequence_id / sequence_start / sequence_end read by the core."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pymodels
import pytest
from modelgen import ACCUMULATOR_CONFIG, accumulator_model, write_model

from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.backends.python.host.backend import PythonBackend
from ge_serve.scheduler.factory import SchedulerOptions
from ge_serve.server.app import make_scheduler
from ge_serve.server.errors import ServerError
from ge_serve.server.inference.bls import CoreBridge
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.types import DataType, InferRequest, Parameters, Tensor
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle
from ge_serve.server.models.repository import ModelRepository

pytestmark = pytest.mark.timeout(120)

PYTHON_ACCUMULATOR = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "INPUT_STATE").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            total = np.where(start == 1, value, value + state).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("OUTPUT_STATE", total),
            ]))
        return responses
"""


@pytest.fixture
async def core(tmp_path: Path) -> AsyncIterator[InferenceServer]:
    write_model(
        tmp_path,
        "acc_onnx",
        accumulator_model(),
        ACCUMULATOR_CONFIG.format(name="acc_onnx", platform='platform: "onnxruntime_onnx"'),
    )
    pymodels.write_model(
        tmp_path,
        "acc_python",
        PYTHON_ACCUMULATOR,
        ACCUMULATOR_CONFIG.format(name="acc_python", platform='backend: "python"'),
    )
    python = PythonBackend()
    lifecycle = ModelLifecycle(
        ModelRepository([tmp_path]),
        {"onnxruntime": OnnxRuntimeBackend(), "python": python},
        functools.partial(make_scheduler, options=SchedulerOptions()),
        LifecycleSettings(unload_timeout_s=10.0),
    )
    server = InferenceServer(lifecycle)
    python.attach_core(CoreBridge(server, asyncio.get_running_loop()))
    failed = await lifecycle.load_many(["acc_onnx", "acc_python"])
    assert failed == {}, failed
    try:
        yield server
    finally:
        await lifecycle.close()
        python.close()


def ask(model: str, value: int, seq: int | str, **flags: bool) -> InferRequest:
    data = np.array([[value]], dtype=np.int32)
    params: Parameters = {"sequence_id": seq}
    params.update({f"sequence_{k}": v for k, v in flags.items()})
    return InferRequest(
        model, inputs=[Tensor("INPUT", DataType.INT32, (1, 1), data)], parameters=params
    )


@pytest.mark.parametrize("model", ["acc_onnx", "acc_python"])
async def test_the_state_is_kept_between_the_requests_of_each_sequence(
    core: InferenceServer, model: str
) -> None:
    async def sequence(seq: int | str, values: list[int]) -> list[int]:
        totals = []
        for index, value in enumerate(values):
            flags = {"start": index == 0, "end": index == len(values) - 1}
            response = await core.infer(ask(model, value, seq, **flags))
            assert [t.name for t in response.outputs] == ["OUTPUT"]  # the state stays inside
            totals.append(int(response.outputs[0].data[0][0]))
        return totals

    # Two sequences at once, interleaved (they share the model's batches).
    first, second = await asyncio.gather(
        sequence(1000, [1, 2, 3, 4]), sequence("seq-b", [10, 20, 30])
    )
    assert first == [1, 3, 6, 10]
    assert second == [10, 30, 60]
    # A new sequence with an old ID starts again from the initial state.
    assert await sequence(1000, [5, 5]) == [5, 10]
    with pytest.raises(ServerError, match="must specify the START flag"):
        await core.infer(ask(model, 1, 1000))
