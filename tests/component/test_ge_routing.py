"""Which backend a model goes to, and which device runtime `--device` selects."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from fake_acl import FakeAcl, build_module
from google.protobuf import text_format
from modelgen import add_sub_model, identity_model, slow_model, write_model
from onnx import TensorProto

from ge_serve.backends.base import Backend, ModelSpec
from ge_serve.backends.ge.acl_real import AclReal
from ge_serve.backends.ge.acl_sim import SimRuntime
from ge_serve.backends.ge.auto import DeviceUnavailable, select_runtime
from ge_serve.backends.ge.backend import GeBackend
from ge_serve.backends.onnx_io import autocomplete_from_onnx
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.dispatch import ExecutorSlot, SlotPool
from ge_serve.server.app import make_scheduler
from ge_serve.server.models.autocomplete import resolve_backend
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle
from ge_serve.server.models.repository import ModelRepository

BACKENDS: dict[str, Backend] = {"onnxruntime": OnnxRuntimeBackend(), "ge": GeBackend(SimRuntime())}


def resolve(tmp_path: Path, model: object, config: str = "") -> str:
    folder = write_model(tmp_path, "m", model, config)  # type: ignore[arg-type]
    parsed = model_config_pb2.ModelConfig()
    text_format.Parse(config, parsed)
    return resolve_backend(parsed, BACKENDS, "ge", folder / "1").name


def test_plain_onnx_goes_to_ge(tmp_path: Path) -> None:
    assert resolve(tmp_path, add_sub_model(("batch", 4))) == "ge"


@pytest.mark.parametrize(
    "config",
    [
        'backend: "onnxruntime"',
        'platform: "onnxruntime_onnx"',
        "instance_group [ { kind: KIND_CPU } ]",
    ],
)
def test_host_cpu_when_asked(tmp_path: Path, config: str) -> None:
    assert resolve(tmp_path, add_sub_model(("batch", 4)), config) == "onnxruntime"


@pytest.mark.parametrize("config", ['backend: "npu_ge"', 'backend: "ge"'])
def test_ge_when_named(tmp_path: Path, config: str) -> None:
    assert resolve(tmp_path, slow_model(), config) == "ge"


def test_string_tensors_stay_on_the_host(tmp_path: Path) -> None:
    assert resolve(tmp_path, identity_model(TensorProto.STRING, ("batch", 4))) == "onnxruntime"


def test_bfloat16_tensors_stay_on_the_host(tmp_path: Path) -> None:
    assert resolve(tmp_path, identity_model(TensorProto.BFLOAT16, ("batch", 4))) == "onnxruntime"


def test_run_time_dims_go_to_ge_as_dynamic_shape(tmp_path: Path) -> None:
    # npu_ge's default mode: dims other than the batch that vary need no gears on GE.
    assert resolve(tmp_path, slow_model()) == "ge"
    assert resolve(tmp_path, identity_model(TensorProto.FLOAT, ("batch", None))) == "ge"


def test_config_dims_can_fix_what_the_file_leaves_open(tmp_path: Path) -> None:
    config = """max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 8 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 8 ] } ]"""
    model = identity_model(TensorProto.FLOAT, ("batch", None))
    assert resolve(tmp_path, model, config) == "ge"


async def test_the_lifecycle_routes_and_serves(tmp_path: Path) -> None:
    life = ModelLifecycle(
        ModelRepository([tmp_path]),
        dict(BACKENDS),
        make_scheduler,
        LifecycleSettings(default_backend="ge", unload_timeout_s=5.0),
    )
    write_model(tmp_path, "sums", add_sub_model(("batch", 4)))
    write_model(tmp_path, "slow", slow_model())
    try:
        await life.load("sums")
        await life.load("slow")
        assert life.get("sums").backend == "ge"
        assert life.get("sums").loaded.gears == (1, 2, 4)
        assert life.get("slow").backend == "ge"  # GE dynamic shape
    finally:
        await life.close()


# --- --device auto|npu|sim ---------------------------------------------------------------


def no_acl() -> ModuleType:
    raise ImportError("No module named 'acl'")


def fake_acl(devices: int, fail_init: bool = False) -> ModuleType:
    fake = FakeAcl(devices=devices)
    if fail_init:
        fake.fail_next("acl.init", 500000)
    return build_module(fake)


def test_sim_when_asked() -> None:
    choice = select_runtime("sim", sim_devices=3, import_acl=lambda: fake_acl(1))
    assert isinstance(choice.runtime, SimRuntime)
    assert choice.runtime.device_count() == 3
    assert choice.reason == "--device sim"


def test_auto_without_pyacl_is_the_simulated_device() -> None:
    choice = select_runtime("auto", sim_devices=2, import_acl=no_acl)
    assert isinstance(choice.runtime, SimRuntime)
    assert (
        choice.reason == "--device auto: pyACL is not available (import acl: No module named 'acl')"
    )


def test_auto_with_a_device_is_pyacl() -> None:
    choice = select_runtime("auto", import_acl=lambda: fake_acl(2))
    assert isinstance(choice.runtime, AclReal)
    assert choice.reason == "--device auto: pyACL reports 2 NPU device(s)"
    assert choice.runtime.describe() == "Ascend NPU via pyACL (2 device(s), SoC Ascend310P3)"
    choice.runtime.shutdown()


def test_auto_with_no_device_is_the_simulated_device() -> None:
    module = fake_acl(0)
    choice = select_runtime("auto", import_acl=lambda: module)
    assert isinstance(choice.runtime, SimRuntime)
    assert choice.reason == "--device auto: pyACL is installed but reports no NPU device"
    assert module.fake.finalized


def test_auto_when_pyacl_fails_to_start() -> None:
    choice = select_runtime("auto", import_acl=lambda: fake_acl(1, fail_init=True))
    assert isinstance(choice.runtime, SimRuntime)
    assert choice.reason.startswith(
        "--device auto: pyACL is installed but failed to start (acl.init"
    )


@pytest.mark.parametrize(
    ("importer", "message"),
    [
        (no_acl, "pyACL cannot be imported"),
        (lambda: fake_acl(0), "pyACL reports no NPU device"),
        (lambda: fake_acl(1, fail_init=True), "pyACL failed to start: acl.init failed"),
    ],
)
def test_npu_insists(importer: object, message: str) -> None:
    with pytest.raises(DeviceUnavailable, match=message):
        select_runtime("npu", import_acl=importer)  # type: ignore[arg-type]


def test_slot_pool_groups_ge_slots_by_device(tmp_path: Path) -> None:
    """SlotPool's least-loaded rule keys on SlotInfo.device, one name per NPU."""
    write_model(tmp_path, "sums", add_sub_model(("batch", 4)))
    config = model_config_pb2.ModelConfig()
    text_format.Parse(
        'name: "sums" max_batch_size: 4 parameters [ { key: "device_exec_blocks" value: '
        '{ string_value: "2" } }, { key: "device_ids" value: { string_value: "0,1" } } ]',
        config,
    )
    path = tmp_path / "sums" / "1" / "model.onnx"
    autocomplete_from_onnx(config, path)
    loaded = GeBackend(SimRuntime(devices=2)).load(
        ModelSpec("sums", 1, config, tmp_path / "sums", path)
    )
    slots = [ExecutorSlot(e) for e in loaded.executors]
    pool = SlotPool(slots)
    first = pool.try_acquire()
    second = pool.try_acquire()
    assert first is not None and second is not None
    assert {first.device, second.device} == {"npu0", "npu1"}
    pool.close()
    for slot in slots:
        slot.join(10)


def test_auto_when_pyacl_cannot_count_devices_finalizes_it() -> None:
    fake = FakeAcl(devices=1)
    fake.fail_next("acl.rt.get_device_count", 507899)
    choice = select_runtime("auto", import_acl=lambda: build_module(fake))
    assert isinstance(choice.runtime, SimRuntime)
    assert "acl.rt.get_device_count failed with ACL error 507899" in choice.reason
    assert fake.finalized


@pytest.mark.parametrize(
    ("device", "devices", "memory", "message"),
    [
        ("gpu", 1, 1, "--device must be auto, npu or sim, not 'gpu'"),
        ("sim", 0, 1, "--sim-devices must be at least 1, not 0"),
        ("auto", 1, 0, "--sim-device-memory must be positive, not 0"),
    ],
)
def test_impossible_runtimes_are_refused(
    device: str, devices: int, memory: int, message: str
) -> None:
    with pytest.raises(DeviceUnavailable, match=message):
        select_runtime(device, devices, memory, import_acl=no_acl)
