"""Device memory returns to its earlier level after a reload and after an unload, on the
simulated NPU (the GE backend's SimRuntime).

Skipped where the GE backend is not present.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from swapmodels import ADDK, write_addk_version, write_atomic

from ge_serve.backends.base import Backend
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.server.app import make_scheduler
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.types import DataType, InferRequest, Tensor
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle
from ge_serve.server.models.repository import ModelRepository

acl_sim = pytest.importorskip("ge_serve.backends.ge.acl_sim")
ge_backend = pytest.importorskip("ge_serve.backends.ge.backend")

pytestmark = pytest.mark.timeout(180)

GE_CONFIG = (
    f'name: "{ADDK}"\nbackend: "npu_ge"\nmax_batch_size: 8\n'
    'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]\n'
    'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }]\n'
    "instance_group [{ count: 2 kind: KIND_GPU gpus: [0] }]\n"
)


async def served(core: InferenceServer) -> str:
    data = np.zeros((1, 4), np.float32)
    request = InferRequest(ADDK, "", inputs=[Tensor("INPUT0", DataType.FP32, (1, 4), data)])
    response = await core.infer(request)
    return response.model_version


async def test_reload_and_unload_give_device_memory_back(tmp_path: Path) -> None:
    runtime = acl_sim.SimRuntime(1, 1024**3)
    backends: dict[str, Backend] = {
        "ge": ge_backend.GeBackend(runtime),
        "onnxruntime": OnnxRuntimeBackend(),
    }
    life = ModelLifecycle(
        ModelRepository([tmp_path]),
        backends,
        make_scheduler,
        LifecycleSettings(default_backend="ge", unload_timeout_s=5.0),
    )
    core = InferenceServer(life)
    folder = tmp_path / ADDK
    write_addk_version(folder, 1)
    write_atomic(folder / "config.pbtxt", GE_CONFIG)

    def used() -> int:
        return int(runtime.device_stats(0).memory_used)

    empty = used()
    try:
        await life.load(ADDK)
        assert await served(core) == "1"
        one_version = used()
        assert one_version > empty

        for version in (2, 3):
            write_addk_version(folder, version)
            await life.load(ADDK)
            assert await served(core) == str(version)
            # The retired version's buffers and models are gone: back to one version's worth.
            assert used() == one_version

        await life.unload(ADDK)
        assert used() == empty
    finally:
        await life.close()
    assert used() == empty
