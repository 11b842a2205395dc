"""GE dynamic shape, npu_ge's default mode: -1 dims other than the batch with no gears or
ranges compile as an OM with -1 dims; each execution describes its input shapes and reads
its output shapes back, and the buffers grow on demand. On the simulated NPU and on the
real shim against the strict fake pyACL (whose teardown check fails a test that broke a
rule or leaked anything)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from dynamic_models import REC_IO, REC_RANGE, dynamic_encoder_folder, rec_folder
from fake_acl import FakeAcl, build_module
from fake_acl import om as fake_om
from ge_helpers import FAKE_ATC_BIN, ge_runtime, make_model, params, spec_for

from ge_serve.backends.base import BackendError, Executor, LoadedModel, ShapeRejected
from ge_serve.backends.ge.acl import AclRuntime
from ge_serve.backends.ge.acl_real import AclReal
from ge_serve.backends.ge.acl_sim import SimRuntime
from ge_serve.backends.ge.backend import GeBackend
from ge_serve.backends.ge.compile import AtcCompiler
from ge_serve.backends.ge.sim_cost import SimCost

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(params=["sim", "fake-acl"])
def runtime(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[AclRuntime]:
    yield from ge_runtime(request.param, tmp_path, monkeypatch)


def load(runtime: AclRuntime, folder: Path) -> LoadedModel:
    return GeBackend(runtime, cores=1).load(spec_for(folder))


def feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 1000 + seq)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[:, seq // 2 :] = rng.integers(0, 2, size=(batch, seq - seq // 2))
    return {
        "INPUT_IDS": rng.integers(0, 64, size=(batch, seq), dtype=np.int64),
        "ATTENTION_MASK": mask,
    }


def test_a_bert_with_minus_one_lengths_and_no_gears_serves_5_to_200(
    runtime: AclRuntime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = dynamic_encoder_folder(tmp_path)
    session = ort.InferenceSession(str(folder / "1" / "model.onnx"))
    with caplog.at_level(logging.INFO, logger="ge_serve.backends.ge.backend"):
        loaded = load(runtime, folder)
    try:
        assert "mode: GE dynamic shape (INPUT_IDS:1~8,-1;ATTENTION_MASK:1~8,-1)" in caplog.text
        # Any batch up to max_batch_size and any length: no gears, no buckets.
        assert loaded.gears == () and loaded.shape_buckets == ()
        executor = loaded.executors[0]
        for batch, seq in ((1, 5), (3, 17), (8, 64), (2, 200), (1, 6), (4, 128)):
            request = feeds(batch, seq)
            got = executor.execute(request)
            hidden, embedding = session.run(None, request)
            assert got["LAST_HIDDEN"].shape == (batch, seq, 16)
            np.testing.assert_allclose(got["LAST_HIDDEN"], hidden, rtol=1e-6)
            np.testing.assert_allclose(got["EMBEDDING"], embedding, rtol=1e-6)
        stats = executor.pool_stats()  # type: ignore[attr-defined]
        # The buffers grew on demand to the largest request (8 x 64 tokens), in powers of
        # two of at least 4 KiB: the two int64 inputs 4 KiB each, LAST_HIDDEN 8 x 64 x 16
        # floats (32 KiB), EMBEDDING 4 KiB. Requests that fit allocate nothing more.
        assert stats["bytes"] == 4096 + 4096 + 8 * 64 * 16 * 4 + 4096
        allocations = stats["allocations"]
        executor.execute(feeds(2, 50))
        assert executor.pool_stats()["allocations"] == allocations  # type: ignore[attr-defined]
        # The batch stays bounded by max_batch_size.
        with pytest.raises(ShapeRejected, match=r"outside the model's shape range \[1~8, -1\]"):
            executor.execute(feeds(9, 8))
    finally:
        loaded.close()


def test_the_compiled_om_has_minus_one_dims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{FAKE_ATC_BIN}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ATC_LOG", str(tmp_path / "atc.log"))
    fake = FakeAcl(soc="Ascend310P3")
    real = AclReal(build_module(fake), AtcCompiler(tmp_path / "om"))
    try:
        loaded = load(real, dynamic_encoder_folder(tmp_path))
        desc = loaded.executors[0]._model.desc  # type: ignore[attr-defined]
        assert desc.shape_kind == "dynamic"
        assert [t.dims for t in desc.data_inputs()] == [(-1, -1), (-1, -1)]
        assert desc.ranges == (((1, 8), (0, -1)), ((1, 8), (0, -1)))
        loaded.close()
        args = (tmp_path / "atc.log").read_text()
        assert "--input_shape=INPUT_IDS:1~8,-1;ATTENTION_MASK:1~8,-1" in args
        assert "dynamic_dims" not in args and "dynamic_batch_size" not in args
    finally:
        real.shutdown()
    assert fake.leaks() == [] and fake.violations == []


def test_an_unbounded_dim_in_input_shape_is_dynamic_shape(
    runtime: AclRuntime, tmp_path: Path
) -> None:
    # A range with no upper bound ("-1") is GE dynamic shape too, its bounded dims kept.
    folder = rec_folder(tmp_path)
    config = (folder / "config.pbtxt").read_text()
    extra = 'parameters [ { key: "graph.ge.inputShape" value: { string_value: "X:1~4,3,32,-1" } } ]'
    (folder / "config.pbtxt").write_text(config.split("parameters")[0] + extra)
    loaded = load(runtime, folder)
    try:
        executor = loaded.executors[0]
        for width in (32, 400, 1000):
            got = executor.execute({"X": np.ones((2, 3, 32, width), np.float32)})["PROBS"]
            assert got.shape == (2, (width - 4) // 4 + 1, 12)
        with pytest.raises(ShapeRejected, match=r"\[1~4, 3, 32, -1\]"):
            executor.execute({"X": np.ones((5, 3, 32, 64), np.float32)})
    finally:
        loaded.close()


def test_dynamic_shape_runs_with_the_cost_profile_and_gears_stay_faster(tmp_path: Path) -> None:
    # Dynamic shape prices every row as a whole sample; a gear prices it in proportion to
    # its elements against the largest gear, so it never costs more.
    cost = SimCost("test", launch_us=0.0, per_sample_us=1000.0)
    runtime = SimRuntime(cost=cost)
    backend = GeBackend(runtime, {"accuracy_check": "false"}, cores=1)  # count this run only
    loaded = backend.load(spec_for(dynamic_encoder_folder(tmp_path)))
    try:
        loaded.executors[0].execute(feeds(2, 5))
        timeline = runtime.timelines[0]
        assert timeline.executions == 1 and timeline.modelled_ns == 2 * 1_000_000
    finally:
        loaded.close()


# --- prebuilt shape-range OMs whose outputs vary -----------------------------------------


def prebuilt_rec(tmp_path: Path, extra: str = "") -> Path:
    """OCR recognition compiled by atc beforehand with a width range; the config names the
    OM, so there is no ONNX to infer the output's maximum from."""
    source = rec_folder(tmp_path / "source") / "1" / "model.onnx"
    built = fake_om.build_shaped(source, "Ascend310P3", {"input_shape": REC_RANGE}, 5)
    body = 'default_model_filename: "model.om"\nmax_batch_size: 4\n' + REC_IO + extra
    folder = make_model(tmp_path, "prebuilt_rec", body)
    fake_om.write(built, folder / "1" / "model.om")
    return folder


def test_a_prebuilt_range_om_with_varying_outputs_loads_and_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeAcl(soc="Ascend310P3")
    real = AclReal(build_module(fake), AtcCompiler(tmp_path / "om"))
    folder = prebuilt_rec(tmp_path)
    session = ort.InferenceSession(str(tmp_path / "source" / "ocr_rec" / "1" / "model.onnx"))
    try:
        with caplog.at_level(logging.INFO, logger="ge_serve.backends.ge.backend"):
            loaded = GeBackend(real, cores=1).load(spec_for(folder, "model.om"))
        assert "mode: shape ranges, as the prebuilt OM was compiled" in caplog.text
        executor = loaded.executors[0]
        for batch, width in ((1, 32), (4, 320), (3, 101)):
            image = np.random.default_rng(width).random((batch, 3, 32, width), np.float32)
            got = executor.execute({"X": image})["PROBS"]
            # The true output shape, read back after the run.
            assert got.shape == (batch, (width - 4) // 4 + 1, 12)
            np.testing.assert_allclose(got, session.run(None, {"X": image})[0], rtol=1e-5)
        # The OM reports PROBS [-1, -1, 12] of size 0: its buffer is sized from the ranges,
        # the batch dim at the batch range's 4, the other at the widest range's 320.
        stats = executor.pool_stats()  # type: ignore[attr-defined]
        assert stats["bytes"] == 4 * 3 * 32 * 320 * 4 + 4 * 320 * 12 * 4
        loaded.close()
        # output_max_shape sizes it exactly.
        exact = prebuilt_rec(tmp_path / "exact", params(output_max_shape="PROBS:4,80,12"))
        loaded = GeBackend(real, cores=1).load(spec_for(exact, "model.om"))
        assert loaded.executors[0].pool_stats()["bytes"] == 4 * 3 * 32 * 320 * 4 + 4 * 80 * 12 * 4  # type: ignore[attr-defined]
        loaded.close()
    finally:
        real.shutdown()
    assert fake.leaks() == [] and fake.violations == []


def test_a_request_too_big_for_the_device_fails_alone(tmp_path: Path) -> None:
    # Growing buffers allocates before it lets go of anything: out of device memory, the
    # request fails and the pool serves the next one as before.
    runtime = SimRuntime(memory_per_device=4 * 1024**2)
    backend = GeBackend(runtime, {"accuracy_check": "false"}, cores=1)
    loaded = backend.load(spec_for(dynamic_encoder_folder(tmp_path)))
    try:
        executor = loaded.executors[0]
        assert executor.execute(feeds(2, 50))["LAST_HIDDEN"].shape == (2, 50, 16)
        before = executor.pool_stats()  # type: ignore[attr-defined]
        with pytest.raises(BackendError, match="out of memory"):
            executor.execute(feeds(8, 20000))  # LAST_HIDDEN alone is 10 MiB
        assert executor.pool_stats()["bytes"] == before["bytes"]  # type: ignore[attr-defined]
        assert executor.execute(feeds(2, 60))["EMBEDDING"].shape == (2, 16)
    finally:
        loaded.close()
    assert runtime.devices[0].used == 0


@pytest.fixture
def fake_acl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeAcl, AclReal]]:
    """The real shim over a strict fake pyACL the test injects failures into; at the end
    nothing may be held and no rule broken."""
    monkeypatch.setenv("PATH", f"{FAKE_ATC_BIN}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ATC_LOG", str(tmp_path / "atc.log"))
    fake = FakeAcl(soc="Ascend310P3")
    real = AclReal(build_module(fake), AtcCompiler(tmp_path / "om"))
    try:
        yield fake, real
    finally:
        real.shutdown()
    assert fake.leaks() == [] and fake.violations == []


def check_serves(executor: Executor, folder: Path, *shapes: tuple[int, int]) -> None:
    session = ort.InferenceSession(str(folder / "1" / "model.onnx"))
    for batch, seq in shapes:
        request = feeds(batch, seq)
        hidden, _ = session.run(None, request)
        np.testing.assert_allclose(executor.execute(request)["LAST_HIDDEN"], hidden, rtol=1e-6)


def serving_encoder(real: AclReal, tmp_path: Path) -> tuple[LoadedModel, Path]:
    """The dynamic encoder loaded on the strict fake, one request served."""
    folder = dynamic_encoder_folder(tmp_path)
    loaded = GeBackend(real, {"accuracy_check": "false"}, cores=1).load(spec_for(folder))
    check_serves(loaded.executors[0], folder, (1, 5))
    return loaded, folder


@pytest.mark.parametrize("call", ["acl.mdl.create_dataset", "acl.mdl.add_dataset_buffer"])
def test_a_dataset_pyacl_refuses_while_growing_fails_that_request_alone(
    fake_acl: tuple[FakeAcl, AclReal], tmp_path: Path, call: str
) -> None:
    # The new dataset is built before the old one goes: when pyACL refuses it, the slot
    # keeps its live dataset, later requests (growing again) serve, and close is clean.
    fake, real = fake_acl
    loaded, folder = serving_encoder(real, tmp_path)
    executor = loaded.executors[0]
    before = executor.pool_stats()  # type: ignore[attr-defined]
    fake.fail_next(call, 100000)
    with pytest.raises(BackendError, match=call):
        executor.execute(feeds(8, 200))
    assert executor.pool_stats()["bytes"] == before["bytes"]  # type: ignore[attr-defined]
    assert fake.violations == []
    check_serves(executor, folder, (2, 6), (8, 200))
    loaded.close()


@pytest.mark.parametrize("call", ["acl.create_tensor_desc", "acl.mdl.set_dataset_tensor_desc"])
def test_a_shape_pyacl_refuses_to_describe_fails_that_request_alone(
    fake_acl: tuple[FakeAcl, AclReal], tmp_path: Path, call: str
) -> None:
    # The descs detached from the dataset before the failure are kept with it, so none
    # leaks however many requests fail (the fixture's teardown counts them).
    fake, real = fake_acl
    loaded, folder = serving_encoder(real, tmp_path)
    executor = loaded.executors[0]
    for _ in range(3):
        fake.fail_next(call, 100000)
        with pytest.raises(BackendError, match=call):
            executor.execute(feeds(2, 7))
    assert fake.violations == []
    check_serves(executor, folder, (2, 7), (3, 9))
    loaded.close()
