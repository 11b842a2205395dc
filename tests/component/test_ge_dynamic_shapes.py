"""Models whose other dims vary, on the GE backend: ND gears, image-size gears and shape
ranges, on the simulated NPU and on the real shim against the strict fake pyACL (whose
teardown check fails a test that broke a rule or leaked anything)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from dynamic_models import (
    DET_SIZES,
    ENCODER_GEARS,
    det_folder,
    encoder_folder,
    exported_rec_folder,
    rec_folder,
)
from ge_helpers import ge_runtime, spec_for
from modelgen import encoder_model, exported_rec_model

from ge_serve.backends.base import LoadedModel, ShapeBucket, ShapeRejected
from ge_serve.backends.ge.acl import AclRuntime
from ge_serve.backends.ge.acl_sim import SimRuntime
from ge_serve.backends.ge.backend import GeBackend
from ge_serve.backends.ge.shape_infer import infer_output_shapes, inference_model, lighten

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["sim", "fake-acl"])
def runtime(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[AclRuntime]:
    yield from ge_runtime(request.param, tmp_path, monkeypatch)


def reference(folder: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(folder / "1" / "model.onnx"))
    return [np.asarray(r) for r in session.run(None, feeds)]


def load(runtime: AclRuntime, folder: Path) -> LoadedModel:
    return GeBackend(runtime, cores=1).load(spec_for(folder))


def encoder_feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch * 100 + seq)
    ids = rng.integers(0, 64, size=(batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    mask[:, seq // 2 :] = rng.integers(0, 2, size=(batch, seq - seq // 2))
    return {"INPUT_IDS": ids, "ATTENTION_MASK": mask}


def test_nd_gears_serve_every_gear_and_become_the_shape_buckets(
    runtime: AclRuntime, tmp_path: Path
) -> None:
    folder = encoder_folder(tmp_path)
    loaded = load(runtime, folder)
    try:
        assert loaded.gears == (1, 4, 8)
        assert loaded.shape_buckets == tuple(
            ShapeBucket({"INPUT_IDS": g, "ATTENTION_MASK": g}) for g in ENCODER_GEARS
        )
        executor = loaded.executors[0]
        for batch, seq in ENCODER_GEARS:
            feeds = encoder_feeds(batch, seq)
            got = executor.execute(feeds)
            hidden, embedding = reference(folder, feeds)
            np.testing.assert_allclose(got["LAST_HIDDEN"], hidden, rtol=1e-6)
            np.testing.assert_allclose(got["EMBEDDING"], embedding, rtol=1e-6)
    finally:
        loaded.close()


def test_a_shape_that_is_no_nd_gear_is_refused_naming_the_gears(
    runtime: AclRuntime, tmp_path: Path
) -> None:
    loaded = load(runtime, encoder_folder(tmp_path))
    try:
        with pytest.raises(ShapeRejected, match=r"not a gear.*INPUT_IDS \[4, 16\]"):
            loaded.executors[0].execute(encoder_feeds(4, 8))
        # The slot keeps serving after the refusal.
        assert loaded.executors[0].execute(encoder_feeds(8, 8))["EMBEDDING"].shape == (8, 16)
    finally:
        loaded.close()


def test_image_size_gears_serve_each_size(runtime: AclRuntime, tmp_path: Path) -> None:
    folder = det_folder(tmp_path)
    loaded = load(runtime, folder)
    try:
        assert loaded.gears == (1,)
        assert [b.shapes["X"] for b in loaded.shape_buckets] == [(1, 3, h, w) for h, w in DET_SIZES]
        for height, width in DET_SIZES:
            image = np.random.default_rng(height).random((1, 3, height, width), np.float32)
            got = loaded.executors[0].execute({"X": image})["MAP"]
            np.testing.assert_allclose(got, reference(folder, {"X": image})[0], rtol=1e-5)
        with pytest.raises(ShapeRejected, match=r"X \[1, 3, 64, 64\]; X \[1, 3, 96, 128\]"):
            loaded.executors[0].execute({"X": np.zeros((1, 3, 64, 96), np.float32)})
    finally:
        loaded.close()


def test_shape_ranges_take_any_shape_inside_and_refuse_outside(
    runtime: AclRuntime, tmp_path: Path
) -> None:
    folder = rec_folder(tmp_path)
    loaded = load(runtime, folder)
    try:
        assert loaded.gears == () and loaded.shape_buckets == ()
        executor = loaded.executors[0]
        for batch, width in ((1, 32), (3, 100), (4, 320), (2, 57)):
            image = np.random.default_rng(width).random((batch, 3, 32, width), np.float32)
            got = executor.execute({"X": image})["PROBS"]
            assert got.shape == (batch, (width - 4) // 4 + 1, 12)
            np.testing.assert_allclose(got, reference(folder, {"X": image})[0], rtol=1e-5)
        for bad in ((1, 3, 32, 321), (5, 3, 32, 64), (1, 3, 31, 64)):
            with pytest.raises(ShapeRejected, match=r"outside the model's shape range \[1~4, 3"):
                executor.execute({"X": np.zeros(bad, np.float32)})
        # One set of buffers, sized for the range's maximum, serves every shape.
        stats = executor.pool_stats()  # type: ignore[attr-defined]
        assert stats["allocations"] == 2
        assert stats["bytes"] == 4 * 3 * 32 * 320 * 4 + 4 * 80 * 12 * 4
    finally:
        loaded.close()


def test_memory_counts_weights_and_work_and_the_io_buffers(
    runtime: AclRuntime, tmp_path: Path
) -> None:
    loaded = load(runtime, rec_folder(tmp_path))
    try:
        stats = loaded.executors[0].pool_stats()  # type: ignore[attr-defined]
        weights = 8 * 3 * 32 * 4 * 4 + 8 * 12 * 4
        # Above the buffers and the weights: the model's work space counts too.
        assert loaded.memory_bytes > stats["bytes"] + weights
    finally:
        loaded.close()


# --- models as exporters write them (PP-OCR through paddle2onnx) --------------------------


def test_a_range_model_whose_reshape_onnx_inference_cannot_follow_serves_every_width(
    runtime: AclRuntime, tmp_path: Path
) -> None:
    # The output's maximum (its device buffer) comes from onnxruntime's symbolic shape
    # inference where ONNX's own stops at the computed Reshape.
    folder = exported_rec_folder(tmp_path)
    loaded = load(runtime, folder)
    try:
        executor = loaded.executors[0]
        for batch, width in ((1, 32), (3, 100), (4, 320)):
            image = np.random.default_rng(width).random((batch, 3, 32, width), np.float32)
            got = executor.execute({"X": image})["PROBS"]
            assert got.shape == (batch, width // 4, 12)
            np.testing.assert_allclose(got, reference(folder, {"X": image})[0], rtol=1e-5)
        stats = executor.pool_stats()  # type: ignore[attr-defined]
        assert stats["bytes"] == 4 * 3 * 32 * 320 * 4 + 4 * 80 * 12 * 4
    finally:
        loaded.close()


def test_without_sympy_the_load_error_names_the_package_not_the_config(
    runtime: AclRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a machine where onnxruntime came without its optional sympy (1.32 moved it to
    # an extra): the load fails, and says which package is missing.
    monkeypatch.delitem(sys.modules, "onnxruntime.tools.symbolic_shape_infer", raising=False)
    monkeypatch.setitem(sys.modules, "sympy", None)
    with pytest.raises(ValueError, match="needs the 'sympy' package") as info:
        load(runtime, exported_rec_folder(tmp_path))
    assert "config.pbtxt" not in str(info.value)


def test_the_work_space_is_the_peak_at_the_range_maximum_and_constants_are_weights(
    tmp_path: Path,
) -> None:
    # The weights are the Constant nodes' bytes: the conv, the head and four int64 scalars.
    weight = (8 * 3 * 32 * 4 + 8 * 12) * 4 + 4 * 8
    for high in (64, 320):
        loaded = load(SimRuntime(), exported_rec_folder(tmp_path / str(high), high=high))
        try:
            io = loaded.executors[0].pool_stats()["bytes"]  # type: ignore[attr-defined]
            # The work space holds the most intermediates alive at once, at 4 rows of the
            # widest input: the transposed features [4, w/4, 8] beside the logits
            # [4, w/4, 12] (the conv's output is freed once reshaped; the graph's input and
            # output live in the I/O buffers).
            work = 4 * (high // 4) * (8 + 12) * 4
            assert loaded.memory_bytes == weight + work + io
        finally:
            loaded.close()


# --- shape inference without the weights ---------------------------------------------------


def test_shape_inference_sees_large_constants_as_shapes_only(tmp_path: Path) -> None:
    path = tmp_path / "encoder.onnx"
    onnx.save(encoder_model(vocab=256), str(path))
    light = inference_model(path)
    # TABLE (256 x 16) is a typed input now; the small axes keep their values, which data
    # propagation reads.
    assert sorted(t.name for t in light.graph.initializer) == ["axis1", "axis2", "one"]
    table = next(v for v in light.graph.input if v.name == "TABLE")
    assert [d.dim_value for d in table.type.tensor_type.shape.dim] == [256, 16]
    for batch, seq in ENCODER_GEARS:
        shapes = {"INPUT_IDS": (batch, seq), "ATTENTION_MASK": (batch, seq)}
        assert infer_output_shapes(light, shapes) == {
            "LAST_HIDDEN": (batch, seq, 16),
            "EMBEDDING": (batch, 16),
        }
    assert len(light.graph.input) == 3  # inferring left it as it was

    # A large Constant node (the conv weights, as paddle2onnx writes them) goes the same way,
    # and the computed Reshape is still followed.
    exported = lighten(exported_rec_model())
    constants = [n.output[0] for n in exported.graph.node if n.op_type == "Constant"]
    assert "W" not in constants and "HEAD" in constants
    assert "W" in [v.name for v in exported.graph.input]
    assert infer_output_shapes(exported, {"X": (3, 3, 32, 100)}) == {"PROBS": (3, 25, 12)}
