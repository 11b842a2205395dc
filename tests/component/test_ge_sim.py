"""The simulated NPU under the GE backend, with the real scheduler slots (in process).

Concurrency is proved with a barrier inside the simulated stream, never with timing: the
barrier only opens when the expected number of executions are in flight at once.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from ge_helpers import (
    EXAMPLES,
    SIMPLE_IO,
    make_model,
    params,
    simple_inputs,
    spec_for,
)
from modelgen import gather_model, weights_model

from ge_serve.backends.base import BackendError, LoadedModel
from ge_serve.backends.ge.acl import AclError, DeviceOutOfMemory
from ge_serve.backends.ge.acl_sim import SimRuntime
from ge_serve.backends.ge.backend import GeBackend, loaded_pool_stats
from ge_serve.backends.ge.sim_cost import parse_sim_cost
from ge_serve.scheduler.direct import DirectScheduler
from ge_serve.scheduler.dispatch import ExecutorSlot, SlotPool
from ge_serve.scheduler.work import WorkItem

SIMPLE_ONNX = EXAMPLES / "simple" / "1" / "model.onnx"
CLASSIFIER = EXAMPLES / "image_classifier" / "1" / "model.onnx"
pytestmark = pytest.mark.timeout(60)

# These tests count executions and device work exactly: the load-time accuracy check
# (its own tests: test_ge_accuracy.py) would add its runs.
NO_ACCURACY_CHECK = {"accuracy_check": "false"}


def simple_folder(tmp_path: Path, extra: str = "", name: str = "simple") -> Path:
    return make_model(tmp_path, name, "max_batch_size: 8\n" + SIMPLE_IO + extra, SIMPLE_ONNX)


def scheduler_for(loaded: LoadedModel) -> DirectScheduler:
    pool = SlotPool([ExecutorSlot(e) for e in loaded.executors])
    return DirectScheduler(pool, loaded.gears, batching=True)


class Gate:
    """Blocks each execution until `parties` of them are in flight together."""

    def __init__(self, parties: int) -> None:
        self.barrier = threading.Barrier(parties, timeout=20)
        self.devices: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, device_id: int, model_id: int) -> None:
        with self._lock:
            self.devices.append(device_id)
        self.barrier.wait()  # BrokenBarrierError (a failed request) if they never overlap


def test_two_devices_two_streams_run_concurrently(tmp_path: Path) -> None:
    gate = Gate(4)
    runtime = SimRuntime(devices=2, on_execute=gate)
    folder = simple_folder(tmp_path, params(device_ids="0,1", device_exec_blocks="2"))
    loaded = GeBackend(runtime, NO_ACCURACY_CHECK).load(spec_for(folder))
    assert len(loaded.executors) == 4

    async def scenario() -> list[dict[str, np.ndarray]]:
        scheduler = scheduler_for(loaded)
        items = [WorkItem(simple_inputs(2, seed=i), 2) for i in range(4)]
        try:
            return await asyncio.gather(*(scheduler.submit(item) for item in items))
        finally:
            await scheduler.close(5)

    results = asyncio.run(scenario())
    for seed, outputs in enumerate(results):
        inputs = simple_inputs(2, seed=seed)
        np.testing.assert_array_equal(outputs["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
    # Four at once on 2 devices x 2 streams: two per device.
    assert Counter(gate.devices) == {0: 2, 1: 2}


def test_least_loaded_device_first(tmp_path: Path) -> None:
    gate = Gate(2)
    runtime = SimRuntime(devices=2, on_execute=gate)
    folder = simple_folder(tmp_path, params(device_ids="0,1", device_exec_blocks="2"))
    loaded = GeBackend(runtime, NO_ACCURACY_CHECK).load(spec_for(folder))

    async def scenario() -> None:
        scheduler = scheduler_for(loaded)
        try:
            items = [WorkItem(simple_inputs(1, seed=i), 1) for i in range(2)]
            await asyncio.gather(*(scheduler.submit(item) for item in items))
        finally:
            await scheduler.close(5)

    asyncio.run(scenario())
    # Device 0 already runs one, so the second goes to idle device 1 (not stream 1 of 0).
    assert sorted(gate.devices) == [0, 1]


def test_a_failing_execution_fails_only_its_request(tmp_path: Path) -> None:
    calls = {"n": 0}

    def fail_first(device_id: int, model_id: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected device fault")

    runtime = SimRuntime(on_execute=fail_first)
    loaded = GeBackend(runtime, NO_ACCURACY_CHECK).load(spec_for(simple_folder(tmp_path)))

    async def scenario() -> dict[str, np.ndarray]:
        scheduler = scheduler_for(loaded)
        try:
            with pytest.raises(BackendError, match="injected device fault"):
                await scheduler.submit(WorkItem(simple_inputs(1), 1))
            return await scheduler.submit(WorkItem(simple_inputs(1, seed=3), 1))
        finally:
            await scheduler.close(5)

    outputs = asyncio.run(scenario())
    inputs = simple_inputs(1, seed=3)
    np.testing.assert_array_equal(outputs["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])
    (stats,) = loaded_pool_stats(loaded)
    assert stats["failures"] == 1 and stats["executions"] == 1


def test_model_runtime_error_is_a_backend_error_and_slot_survives(tmp_path: Path) -> None:
    body = """max_batch_size: 4
input [ { name: "DATA" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INDEX" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
    folder = make_model(tmp_path, "gather", body, onnx_model=gather_model())
    loaded = GeBackend(SimRuntime()).load(spec_for(folder))
    executor = loaded.executors[0]
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    with pytest.raises(BackendError, match="model execution failed"):
        executor.execute({"DATA": data, "INDEX": np.array([[7]], np.int64)})
    result = executor.execute({"DATA": data, "INDEX": np.array([[2]], np.int64)})
    assert result["OUT"].tolist() == [[2.0]]
    loaded.close()


def test_gear_padding_gives_correct_results(tmp_path: Path) -> None:
    body = """max_batch_size: 8
input [ { name: "image" data_type: TYPE_FP32 dims: [ 3, 64, 64 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]
""" + params(graph__dot__ge__dot__dynamicDims="1;4;8")
    folder = make_model(tmp_path, "classifier", body, CLASSIFIER)
    loaded = GeBackend(SimRuntime(), NO_ACCURACY_CHECK).load(spec_for(folder))
    assert loaded.gears == (1, 4, 8)
    reference = ort.InferenceSession(str(CLASSIFIER), providers=["CPUExecutionProvider"])
    images = np.random.default_rng(0).random((3, 3, 64, 64), dtype=np.float32)
    (expected,) = reference.run(None, {"image": images})

    async def scenario() -> dict[str, np.ndarray]:
        scheduler = scheduler_for(loaded)
        try:
            return await scheduler.submit(WorkItem({"image": images}, 3))
        finally:
            await scheduler.close(5)

    outputs = asyncio.run(scenario())
    assert outputs["probabilities"].shape == (3, 10)
    np.testing.assert_allclose(outputs["probabilities"], expected, rtol=1e-5, atol=1e-6)
    (stats,) = loaded_pool_stats(loaded)
    assert stats["by_gear"] == {4: 1}


def test_a_non_gear_batch_is_refused_like_the_npu(tmp_path: Path) -> None:
    runtime = SimRuntime()
    folder = simple_folder(tmp_path, params(graph__dot__ge__dot__dynamicDims="2;4;8"))
    loaded = GeBackend(runtime).load(spec_for(folder))
    executor = loaded.executors[0]
    with pytest.raises(BackendError, match=r"batch size 3 is not a gear .*\[2, 4, 8\]"):
        executor.execute(simple_inputs(3))
    model, dataset = executor._model, executor._in_dataset  # type: ignore[attr-defined]
    runtime.bind_thread(0)
    with pytest.raises(AclError, match="batch size 3 is not one of the model's gears"):
        runtime.set_dynamic_batch(model, dataset, 3)
    loaded.close()


def test_loading_past_device_memory_is_out_of_memory(tmp_path: Path) -> None:
    runtime = SimRuntime(devices=1, memory_per_device=4 * 1024 * 1024)
    body = """max_batch_size: 1
input [ { name: "X" data_type: TYPE_FP32 dims: [ 262144 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 262144 ] } ]
"""
    folder = make_model(tmp_path, "heavy", body, onnx_model=weights_model(1))
    loaded = GeBackend(runtime).load(spec_for(folder))  # 1 MiB weights + 2 MiB I/O fit
    loaded.close()
    folder = make_model(
        tmp_path, "heavier", body + params(device_exec_blocks="2"), onnx_model=weights_model(1)
    )
    with pytest.raises(DeviceOutOfMemory, match="out of memory: simulated NPU 0 cannot fit"):
        GeBackend(runtime).load(spec_for(folder))
    # The failed load gave back what it had taken.
    assert runtime.devices[0].used == 0
    assert runtime.devices[0].allocation_count() == 0


def test_malloc_past_capacity_is_out_of_memory() -> None:
    runtime = SimRuntime(memory_per_device=1000)
    runtime.open_device(0)
    first = runtime.malloc(0, 600)
    with pytest.raises(DeviceOutOfMemory) as raised:
        runtime.malloc(0, 600)
    assert raised.value.code == 207001
    assert "600 B): 600 B of 1000 B already in use (--sim-device-memory)" in str(raised.value)
    runtime.free(first)
    runtime.free(runtime.malloc(0, 1000))
    runtime.close_device(0)


def test_om_on_the_simulated_device_is_refused(tmp_path: Path) -> None:
    folder = simple_folder(tmp_path, name="offline")
    (folder / "1" / "model.om").write_bytes(b"not for the sim")
    with pytest.raises(ValueError, match=r"offline model \(OM\) that only an Ascend NPU can run"):
        GeBackend(SimRuntime()).load(spec_for(folder, "model.om"))


def test_tensorflow_on_the_simulated_device_is_refused(tmp_path: Path) -> None:
    folder = simple_folder(tmp_path, name="tf")
    (folder / "1" / "model.pb").write_bytes(b"\n\x00")
    with pytest.raises(ValueError, match="TensorFlow model, which ge-serve compiles with"):
        GeBackend(SimRuntime()).load(spec_for(folder, "model.pb"))


def test_missing_device_names_the_flag(tmp_path: Path) -> None:
    folder = simple_folder(tmp_path, params(device_ids="1"))
    with pytest.raises(ValueError, match=r"NPU 1 is not available.*\(--sim-devices\)"):
        GeBackend(SimRuntime(devices=1)).load(spec_for(folder))


def test_device_calls_need_the_device_bound_to_the_thread() -> None:
    runtime = SimRuntime()
    runtime.open_device(0)
    failure: list[BaseException] = []
    thread = threading.Thread(target=lambda: _capture(failure, lambda: runtime.malloc(0, 8)))
    thread.start()
    thread.join(10)
    assert isinstance(failure[0], AclError) and failure[0].code == 107002
    runtime.close_device(0)


def _capture(into: list[BaseException], call: object) -> None:
    try:
        call()  # type: ignore[operator]
    except BaseException as exc:
        into.append(exc)


def test_busy_time_and_memory_are_accounted(tmp_path: Path) -> None:
    runtime = SimRuntime(devices=2, memory_per_device=64 * 1024 * 1024)
    loaded = GeBackend(runtime, NO_ACCURACY_CHECK).load(spec_for(simple_folder(tmp_path)))
    idle = runtime.device_stats(1)
    assert idle.busy_ns == 0 and idle.memory_used == 0
    used = runtime.device_stats(0).memory_used
    assert used == runtime.devices[0].used > 0
    runtime.device_stats(0)  # start a fresh utilization window
    for seed in range(5):
        loaded.executors[0].execute(simple_inputs(8, seed=seed))
    stats = runtime.device_stats(0)
    assert stats.busy_ns > 0
    assert 0.0 < stats.utilization <= 100.0
    assert runtime.devices[0].bytes_h2d == 5 * 2 * 8 * 16 * 4
    assert runtime.devices[0].bytes_d2h == 5 * 2 * 8 * 16 * 4
    loaded.close()
    assert runtime.devices[0].used == 0


def test_model_warmup_runs_on_every_slot(tmp_path: Path) -> None:
    warmup = """model_warmup [ {
  name: "zeros" batch_size: 3 count: 2
  inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } }
  inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] random_data: true } }
} ]
"""
    folder = simple_folder(tmp_path, warmup + params(device_ids="0,1"))
    runtime = SimRuntime(devices=2)
    loaded = GeBackend(runtime).load(spec_for(folder))
    stats = loaded_pool_stats(loaded)
    assert [s["by_gear"] for s in stats] == [{4: 2}, {4: 2}]


def test_a_failing_warmup_fails_the_load(tmp_path: Path) -> None:
    warmup = """model_warmup [ {
  name: "from_file" batch_size: 1
  inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] input_data_file: "in0" } }
  inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } }
} ]
"""
    folder = simple_folder(tmp_path, warmup)
    runtime = SimRuntime()
    with pytest.raises(ValueError, match=r"warmup 'from_file': input data file .* does not exist"):
        GeBackend(runtime).load(spec_for(folder))
    assert runtime.devices[0].used == 0
    (folder / "warmup").mkdir()
    (folder / "warmup" / "in0").write_bytes(np.arange(16, dtype=np.int32).tobytes())
    loaded = GeBackend(runtime).load(spec_for(folder))
    assert loaded_pool_stats(loaded)[0]["executions"] == 1
    loaded.close()


def test_closing_the_scheduler_gives_device_memory_back(tmp_path: Path) -> None:
    runtime = SimRuntime(devices=2)
    folder = simple_folder(tmp_path, params(device_ids="0,1", device_exec_blocks="2"))
    loaded = GeBackend(runtime).load(spec_for(folder))
    assert runtime.devices[0].used > 0 and runtime.devices[1].used > 0

    async def scenario() -> None:
        scheduler = scheduler_for(loaded)
        await scheduler.submit(WorkItem(simple_inputs(2), 2))
        await scheduler.close(5)

    asyncio.run(scenario())
    # Released by the time close() returns, not later on the slot threads.
    assert [d.used for d in runtime.devices] == [0, 0]
    assert [d.allocation_count() for d in runtime.devices] == [0, 0]


def test_device_metrics_for_the_metrics_endpoint(tmp_path: Path) -> None:
    runtime = SimRuntime(devices=2, memory_per_device=1 << 30)
    backend = GeBackend(runtime)
    loaded = backend.load(spec_for(simple_folder(tmp_path, params(device_ids="1"))))
    backend.device_metrics()  # starts the utilization window
    loaded.executors[0].execute(simple_inputs(8))
    idle, used = backend.device_metrics()
    assert (idle.device, idle.memory_used_bytes, idle.pool_bytes) == ("sim0", 0, 0)
    assert idle.memory_total_bytes == 1 << 30 and idle.utilization == 0.0
    pool = loaded.executors[0].pool_stats()["bytes"]  # type: ignore[attr-defined]
    assert used.device == "sim1" and used.pool_bytes == pool > 0
    assert used.memory_used_bytes == runtime.devices[1].used > pool
    assert 0.0 < used.utilization <= 1.0
    loaded.close()
    assert backend.device_metrics()[1].pool_bytes == 0


@pytest.mark.parametrize("cost", [None, "default"])
def test_slots_share_a_device_one_execution_at_a_time_only_with_modelled_timing(
    tmp_path: Path, cost: str | None
) -> None:
    # With --sim-cost each device runs one execution at a time (its timeline), so the
    # adaptive batcher forms a slot's batch when the device is about to free; without it
    # the slots' onnxruntime sessions run side by side on the host.
    runtime = SimRuntime(devices=1, cost=parse_sim_cost(cost) if cost else None)
    folder = simple_folder(tmp_path, params(device_exec_blocks="2"))
    loaded = GeBackend(runtime, NO_ACCURACY_CHECK).load(spec_for(folder))
    pool = SlotPool([ExecutorSlot(e) for e in loaded.executors])
    try:
        assert [slot.device for slot in pool.slots] == ["npu0", "npu0"]
        assert [slot.serial for slot in pool.slots] == [cost is not None] * 2
    finally:
        pool.close()
        pool.join(5)
