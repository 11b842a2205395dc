"""The real ACL shim (acl_real.AclReal) end to end against the strict fake pyACL.

The fake is injected as the `acl` module; the fake `atc` compiles ONNX into fake OMs.
Every test ends with the fake's teardown check: nothing held, no contract broken.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fake_acl import FakeAcl, build_module
from fake_acl import om as fake_om
from ge_helpers import (
    EXAMPLES,
    FAKE_ATC_BIN,
    SIMPLE_IO,
    make_model,
    params,
    simple_inputs,
    spec_for,
)

from ge_serve.backends.base import BackendError
from ge_serve.backends.ge.acl import AclError
from ge_serve.backends.ge.acl_real import AclReal
from ge_serve.backends.ge.backend import GeBackend
from ge_serve.backends.ge.compile import AtcCompiler
from ge_serve.scheduler.batch import execute_batch
from ge_serve.scheduler.work import WorkItem

SIMPLE_ONNX = EXAMPLES / "simple" / "1" / "model.onnx"
pytestmark = pytest.mark.timeout(120)

# These tests count executions and device work exactly: the load-time accuracy check
# (its own tests: test_ge_accuracy.py) would add its runs.
NO_ACCURACY_CHECK = {"accuracy_check": "false"}


@pytest.fixture
def atc_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "atc.log"
    monkeypatch.setenv("PATH", f"{FAKE_ATC_BIN}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("FAKE_ATC_LOG", str(log))
    monkeypatch.setenv("FAKE_ACL_SOC", "Ascend310P3")
    return log


@pytest.fixture
def fake() -> FakeAcl:
    return FakeAcl(devices=2, soc="Ascend310P3")


@pytest.fixture
def runtime(fake: FakeAcl, tmp_path: Path, atc_log: Path) -> Iterator[AclReal]:
    real = AclReal(build_module(fake), AtcCompiler(tmp_path / "om-cache"))
    yield real


def finish(runtime: AclReal, fake: FakeAcl) -> None:
    """Teardown: finalize, then nothing may be held and no rule may have been broken."""
    runtime.shutdown()
    assert fake.leaks() == []
    assert fake.violations == []


def simple_model(
    repo: Path, name: str = "simple", extra: str = "", max_batch_size: int = 8
) -> Path:
    body = f"max_batch_size: {max_batch_size}\n" + SIMPLE_IO + extra
    return make_model(repo, name, body, SIMPLE_ONNX)


def check_simple(outputs: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> None:
    np.testing.assert_array_equal(outputs["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
    np.testing.assert_array_equal(outputs["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])


def test_npu_ge_config_runs_on_every_slot_with_gears(
    runtime: AclReal, fake: FakeAcl, tmp_path: Path, atc_log: Path
) -> None:
    folder = simple_model(
        tmp_path,
        extra=params(
            device_ids="0,1",
            device_exec_blocks="2",
            graph__dot__ge__dot__dynamicDims="1;2;4;8",
            graph__dot__ge__dot__dynamicNodeType="1",
        ),
    )
    loaded = GeBackend(runtime).load(spec_for(folder))
    assert loaded.gears == (1, 2, 4, 8)
    assert [(e.slot.device_id, e.slot.stream) for e in loaded.executors] == [
        (0, 0),
        (1, 0),
        (0, 1),
        (1, 1),
    ]
    # One atc run for the model, however many slots load it.
    assert len(atc_log.read_text().splitlines()) == 1
    assert len(fake.models) == 4
    for index, executor in enumerate(loaded.executors):
        inputs = simple_inputs(4, seed=index)
        check_simple(executor.execute(inputs), inputs)
    # Execute from another thread: the executor binds its context there itself.
    inputs = simple_inputs(2, seed=9)
    result: dict[str, dict[str, np.ndarray]] = {}
    worker = threading.Thread(target=lambda: result.update(r=loaded.executors[1].execute(inputs)))
    worker.start()
    worker.join(30)
    check_simple(result["r"], inputs)
    loaded.close()
    finish(runtime, fake)


def test_scheduler_pads_to_a_gear_and_trims(
    runtime: AclReal, fake: FakeAcl, tmp_path: Path
) -> None:
    folder = simple_model(
        tmp_path, extra=params(graph__dot__ge__dot__dynamicDims="2;4"), max_batch_size=4
    )
    loaded = GeBackend(runtime, NO_ACCURACY_CHECK).load(spec_for(folder))
    executor = loaded.executors[0]
    with pytest.raises(BackendError, match="batch size 3 is not a gear"):
        executor.execute(simple_inputs(3))
    items = [WorkItem(simple_inputs(1, seed=1), 1), WorkItem(simple_inputs(2, seed=2), 2)]
    results = execute_batch(executor, items, loaded.gears, batching=True)
    for item, outputs in zip(items, results, strict=True):
        check_simple(outputs, item.inputs)
    stats = executor.pool_stats()  # type: ignore[attr-defined]
    assert stats["by_gear"] == {4: 1}
    loaded.close()
    finish(runtime, fake)


def test_pool_is_reused_not_reallocated(runtime: AclReal, fake: FakeAcl, tmp_path: Path) -> None:
    loaded = GeBackend(runtime, NO_ACCURACY_CHECK).load(spec_for(simple_model(tmp_path)))
    executor = loaded.executors[0]
    before = executor.pool_stats()  # type: ignore[attr-defined]
    mallocs = fake.calls.count("acl.rt.malloc")
    for seed in range(10):
        inputs = simple_inputs(8 if seed % 2 else 1, seed=seed)
        check_simple(executor.execute(inputs), inputs)
    after = executor.pool_stats()  # type: ignore[attr-defined]
    assert fake.calls.count("acl.rt.malloc") == mallocs
    assert after["allocations"] == before["allocations"] == 5  # 2 inputs, the gear, 2 outputs
    assert after["buffers"] == 5 and after["executions"] == 10
    assert after["by_gear"] == {1: 5, 8: 5}
    loaded.close()
    finish(runtime, fake)


def test_static_model_compiles_batch_one_and_loops_over_the_batch(
    runtime: AclReal, fake: FakeAcl, tmp_path: Path, atc_log: Path
) -> None:
    # npu_ge's static_model with a dynamic batch: a batch-1 graph, run once per row.
    folder = simple_model(tmp_path, extra=params(static_model="true"))
    loaded = GeBackend(runtime, NO_ACCURACY_CHECK).load(spec_for(folder))
    assert loaded.gears == ()  # any batch up to max_batch_size, no padding
    (argv,) = [json.loads(line) for line in atc_log.read_text().splitlines()]
    assert "--input_shape=INPUT0:1,16;INPUT1:1,16" in argv
    assert not any(a.startswith("--dynamic_batch_size") for a in argv)
    before = fake.executions
    inputs = simple_inputs(5)
    check_simple(loaded.executors[0].execute(inputs), inputs)
    assert fake.executions - before == 5
    assert loaded.executors[0].pool_stats()["by_gear"] == {1: 5}  # type: ignore[attr-defined]
    loaded.close()
    finish(runtime, fake)


def test_an_om_whose_gears_cannot_hold_max_batch_size_is_refused(
    runtime: AclReal, fake: FakeAcl, tmp_path: Path
) -> None:
    built = fake_om.build(SIMPLE_ONNX, "Ascend310P3", "INPUT0:-1,16;INPUT1:-1,16", [1, 4], 5)
    folder = simple_model(tmp_path, name="prebuilt", max_batch_size=8)
    fake_om.write(built, folder / "1" / "model.om")
    with pytest.raises(
        ValueError, match="max_batch_size 8 exceeds the largest batch gear 4 of the compiled model"
    ):
        GeBackend(runtime).load(spec_for(folder, "model.om"))
    finish(runtime, fake)


def test_model_without_batching(runtime: AclReal, fake: FakeAcl, tmp_path: Path) -> None:
    body = SIMPLE_IO.replace("dims: [ 16 ]", "dims: [ 2, 16 ]")
    folder = make_model(tmp_path, "unbatched", "max_batch_size: 0\n" + body, SIMPLE_ONNX)
    loaded = GeBackend(runtime).load(spec_for(folder))
    assert loaded.gears == ()
    inputs = simple_inputs(2)
    check_simple(loaded.executors[0].execute(inputs), inputs)
    loaded.close()
    finish(runtime, fake)


def test_prebuilt_om_loads_without_atc(
    runtime: AclReal, fake: FakeAcl, tmp_path: Path, atc_log: Path
) -> None:
    built = fake_om.build(SIMPLE_ONNX, "Ascend310P3", "INPUT0:-1,16;INPUT1:-1,16", [1, 4], 5)
    folder = simple_model(tmp_path, name="prebuilt", max_batch_size=4)
    fake_om.write(built, folder / "1" / "model.om")
    loaded = GeBackend(runtime).load(spec_for(folder, "model.om"))
    assert loaded.gears == (1, 4)  # the OM's own gear list
    assert not atc_log.exists()
    inputs = simple_inputs(4)
    check_simple(loaded.executors[0].execute(inputs), inputs)
    loaded.close()
    finish(runtime, fake)


@pytest.mark.parametrize(
    ("call", "code", "name"),
    [
        ("acl.rt.create_context", 107000, "ACL_ERROR_RT_PARAM_INVALID"),
        ("acl.rt.malloc", 207001, "ACL_ERROR_RT_MEMORY_ALLOCATION"),
        ("acl.mdl.load_from_file", 100003, "ACL_ERROR_INVALID_FILE"),
        ("acl.rt.create_stream", 107000, "ACL_ERROR_RT_PARAM_INVALID"),
        ("acl.mdl.add_dataset_buffer", 100000, "ACL_ERROR_INVALID_PARAM"),
    ],
)
def test_load_failure_codes_are_clear_and_leave_nothing(
    runtime: AclReal, fake: FakeAcl, tmp_path: Path, call: str, code: int, name: str
) -> None:
    folder = simple_model(tmp_path, extra=params(device_exec_blocks="2"))
    fake.fail_next(call, code)
    with pytest.raises(AclError) as raised:
        GeBackend(runtime).load(spec_for(folder))
    message = str(raised.value)
    assert f"{call} failed with ACL error {code} ({name})" in message
    assert raised.value.code == code
    finish(runtime, fake)


@pytest.mark.parametrize(
    "call", ["acl.mdl.execute_async", "acl.rt.synchronize_stream", "acl.rt.memcpy"]
)
def test_execute_failure_fails_one_batch_and_the_slot_keeps_serving(
    runtime: AclReal, fake: FakeAcl, tmp_path: Path, call: str
) -> None:
    loaded = GeBackend(runtime).load(spec_for(simple_model(tmp_path)))
    executor = loaded.executors[0]
    fake.fail_next(call, 507899)
    with pytest.raises(BackendError, match=rf"{call}.* failed with ACL error 507899"):
        executor.execute(simple_inputs(2))
    inputs = simple_inputs(2, seed=5)
    check_simple(executor.execute(inputs), inputs)
    assert executor.pool_stats()["failures"] == 1  # type: ignore[attr-defined]
    loaded.close()
    finish(runtime, fake)


def test_a_failed_unload_still_destroys_the_model_description(
    runtime: AclReal, fake: FakeAcl, tmp_path: Path
) -> None:
    loaded = GeBackend(runtime).load(spec_for(simple_model(tmp_path)))
    fake.fail_next("acl.mdl.unload", 100000)
    with pytest.raises(BackendError, match=r"acl.mdl.unload failed with ACL error 100000"):
        loaded.close()
    # The model pyACL refused to unload stays; its description does not leak with it.
    assert fake.descs == {}
    assert [leak for leak in fake.leaks() if "model" in leak] == [
        f"model {model_id} not unloaded" for model_id in fake.models
    ]


def test_gear_values_are_validated_by_pyacl(
    runtime: AclReal, fake: FakeAcl, tmp_path: Path
) -> None:
    folder = simple_model(tmp_path, extra=params(graph__dot__ge__dot__dynamicDims="1;2;4;8"))
    prepared_source = GeBackend(runtime)
    loaded = prepared_source.load(spec_for(folder))
    executor = loaded.executors[0]
    model, dataset = executor._model, executor._in_dataset  # type: ignore[attr-defined]
    runtime.bind_thread(0)
    with pytest.raises(AclError, match=r"acl\.mdl\.set_dynamic_batch_size failed with ACL error"):
        runtime.set_dynamic_batch(model, dataset, 3)
    assert fake.violations == [
        "acl.mdl.set_dynamic_batch_size: 3 is not a gear of the model [1, 2, 4, 8]"
    ]
    fake.violations.clear()
    loaded.close()
    finish(runtime, fake)


def test_device_stats_come_from_pyacl(runtime: AclReal, fake: FakeAcl, tmp_path: Path) -> None:
    backend = GeBackend(runtime)
    assert backend.device_metrics() == []  # no NPU in use yet
    loaded = backend.load(spec_for(simple_model(tmp_path)))
    (metrics,) = backend.device_metrics()
    assert metrics.device == "npu0" and metrics.utilization == 0.0
    assert metrics.memory_total_bytes == fake.memory and metrics.pool_bytes > 0
    inputs = simple_inputs(8)
    loaded.executors[0].execute(inputs)
    stats = runtime.device_stats(0)
    assert stats.memory_total == fake.memory
    assert stats.memory_used == sum(a.size for a in fake.allocs.values())
    assert stats.busy_ns > 0
    assert stats.utilization == 0.0
    loaded.close()
    finish(runtime, fake)


def test_unknown_device_is_refused_before_pyacl(
    runtime: AclReal, fake: FakeAcl, tmp_path: Path
) -> None:
    folder = simple_model(tmp_path, extra=params(device_ids="4,5"))
    with pytest.raises(ValueError, match=r"NPU 4 is not available: the npu runtime has 2 device"):
        GeBackend(runtime).load(spec_for(folder))
    finish(runtime, fake)


# --- the fake catches a broken client --------------------------------------------------


def test_fake_catches_a_client_that_skips_set_context(runtime: AclReal, fake: FakeAcl) -> None:
    runtime.open_device(0)
    failure: list[BaseException] = []

    def broken_client() -> None:
        try:
            runtime.malloc(0, 64)  # no bind_thread on this new thread
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=broken_client)
    thread.start()
    thread.join(10)
    assert isinstance(failure[0], AclError)
    assert failure[0].code == 107002
    assert "ACL_ERROR_RT_CONTEXT_NULL" in str(failure[0])
    assert fake.violations == ["acl.rt.malloc without a current context on this thread"]
    runtime.close_device(0)
    fake.violations.clear()
    finish(runtime, fake)


def test_fake_catches_a_client_that_forgets_to_free(runtime: AclReal, fake: FakeAcl) -> None:
    runtime.open_device(0)
    buffer = runtime.malloc(0, 256)
    with pytest.raises(AclError, match=r"acl\.rt\.destroy_context failed"):
        runtime.close_device(0)
    assert fake.leaks() == [f"device memory {buffer.ptr:#x} (256 bytes) not freed"] + [
        f"context {c:#x} not destroyed" for c in fake.contexts
    ] + ["device 0 not reset"]
    with pytest.raises(AclError, match=r"acl\.finalize failed"):
        runtime.shutdown()
    assert any("not freed" in v for v in fake.violations)


def test_fake_catches_one_model_on_two_streams(
    runtime: AclReal, fake: FakeAcl, tmp_path: Path
) -> None:
    loaded = GeBackend(runtime).load(spec_for(simple_model(tmp_path)))
    executor = loaded.executors[0]
    model = executor._model  # type: ignore[attr-defined]
    in_ds, out_ds = executor._in_dataset, executor._out_dataset  # type: ignore[attr-defined]
    runtime.bind_thread(0)
    first = runtime.create_stream(0)
    second = runtime.create_stream(0)
    runtime.set_dynamic_batch(model, in_ds, 1)
    runtime.execute_async(model, in_ds, out_ds, first)
    with pytest.raises(AclError, match=r"acl\.mdl\.execute_async failed"):
        runtime.execute_async(model, in_ds, out_ds, second)
    assert "one loaded model runs on one stream at a time" in fake.violations[-1]
    # Reading the outputs before synchronizing is caught too.
    host = np.empty((1, 16), np.int32)
    out_buffer = executor._out_buffers[0]  # type: ignore[attr-defined]
    with pytest.raises(AclError, match=r"acl\.rt\.memcpy"):
        runtime.memcpy_d2h(host, out_buffer)
    assert "before acl.rt.synchronize_stream" in fake.violations[-1]
    runtime.synchronize_stream(0, first)
    runtime.destroy_stream(0, first)
    runtime.destroy_stream(0, second)
    fake.violations.clear()
    loaded.close()
    finish(runtime, fake)
