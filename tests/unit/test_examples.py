"""The bundled example model repository: reproducible from its script, and correct."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
MODELS = EXAMPLES / "models"
MODEL_NAMES = ("simple", "simple_string", "image_classifier")


def _load_build_models() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_models", EXAMPLES / "build_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build_models = _load_build_models()


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models")
    build_models.main(["--out", str(out)])
    return out


def _session(name: str) -> ort.InferenceSession:
    return ort.InferenceSession(
        str(MODELS / name / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )


def _committed_files() -> list[Path]:
    return sorted(p.relative_to(MODELS) for p in MODELS.rglob("*") if p.is_file())


# --- the script and the committed repository cannot drift ---------------------------------


def test_repository_layout() -> None:
    expected = sorted(
        [Path(n, "config.pbtxt") for n in MODEL_NAMES]
        + [Path(n, "1", "model.onnx") for n in MODEL_NAMES]
        + [Path("image_classifier", "labels.txt")]
    )
    assert _committed_files() == expected


@pytest.mark.parametrize("relpath", [str(p) for p in _committed_files()])
def test_rebuild_is_byte_identical(rebuilt: Path, relpath: str) -> None:
    assert (rebuilt / relpath).read_bytes() == (MODELS / relpath).read_bytes(), (
        f"{relpath} differs from a fresh build: rerun `python3 examples/build_models.py`"
    )


def test_rebuilt_tree_has_no_extra_files(rebuilt: Path) -> None:
    built = sorted(p.relative_to(rebuilt) for p in rebuilt.rglob("*") if p.is_file())
    assert built == _committed_files()


def test_build_is_deterministic_in_process() -> None:
    first = build_models.build_image_classifier().SerializeToString()
    second = build_models.build_image_classifier().SerializeToString()
    assert first == second


# --- the models themselves -----------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_is_valid_and_small(name: str) -> None:
    path = MODELS / name / "1" / "model.onnx"
    assert path.stat().st_size < 1_000_000
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    # Every input and output has the symbolic batch dimension first.
    for value in [*model.graph.input, *model.graph.output]:
        first = value.type.tensor_type.shape.dim[0]
        assert first.dim_param == "batch", value.name


def _config(name: str) -> str:
    return (MODELS / name / "config.pbtxt").read_text(encoding="utf-8")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_config_basics(name: str) -> None:
    text = _config(name)
    assert re.search(rf'^name: "{name}"$', text, re.M)
    assert re.search(r"^max_batch_size: 8$", text, re.M)
    for forbidden in ("backend", "platform", "instance_group"):
        assert forbidden not in text, f"{name} config must not set {forbidden}"
    # Config tensors match the ONNX graph's names.
    model = onnx.load(str(MODELS / name / "1" / "model.onnx"))
    config_names = re.findall(r'^\s+name: "([^"]+)"$', text, re.M)
    graph_names = [v.name for v in [*model.graph.input, *model.graph.output]]
    assert config_names == graph_names


def test_config_batching() -> None:
    assert "dynamic_batching" not in _config("simple")
    assert "dynamic_batching" not in _config("simple_string")
    classifier = _config("image_classifier")
    assert re.search(r"dynamic_batching \{\s*max_queue_delay_microseconds: 500\s*\}", classifier)
    assert 'label_filename: "labels.txt"' in classifier
    assert "dims: [ 3, 64, 64 ]" in classifier


def test_labels() -> None:
    labels = (MODELS / "image_classifier" / "labels.txt").read_text(encoding="utf-8")
    lines = labels.splitlines()
    assert len(lines) == 10
    assert lines[0] == "airplane"
    assert all(lines) and len(set(lines)) == 10


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_simple_sum_and_difference(batch: int) -> None:
    rng = np.random.default_rng(batch)
    in0 = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    in1 = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    out0, out1 = _session("simple").run(["OUTPUT0", "OUTPUT1"], {"INPUT0": in0, "INPUT1": in1})
    assert out0.dtype == np.int32 and out1.dtype == np.int32
    np.testing.assert_array_equal(out0, in0 + in1)
    np.testing.assert_array_equal(out1, in0 - in1)


def test_simple_canonical_values() -> None:
    in0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    in1 = np.ones((1, 16), dtype=np.int32)
    out0, out1 = _session("simple").run(None, {"INPUT0": in0, "INPUT1": in1})
    assert out0.tolist() == [list(range(1, 17))]
    assert out1.tolist() == [list(range(-1, 15))]


def _strings(values: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
    strings: npt.NDArray[Any] = np.vectorize(str, otypes=[object])(values)
    return strings


@pytest.mark.parametrize("batch", [1, 4])
def test_simple_string_sum_and_difference(batch: int) -> None:
    rng = np.random.default_rng(100 + batch)
    a = rng.integers(-100000, 100000, size=(batch, 16))
    b = rng.integers(-100000, 100000, size=(batch, 16))
    out0, out1 = _session("simple_string").run(
        ["OUTPUT0", "OUTPUT1"], {"INPUT0": _strings(a), "INPUT1": _strings(b)}
    )
    assert out0.shape == (batch, 16) and out0.dtype == object
    assert out0.tolist() == _strings(a + b).tolist()
    assert out1.tolist() == _strings(a - b).tolist()


def test_simple_string_canonical_values() -> None:
    a = np.array([[str(i) for i in range(16)]], dtype=object)
    b = np.array([["1"] * 16], dtype=object)
    out0, out1 = _session("simple_string").run(None, {"INPUT0": a, "INPUT1": b})
    assert out0[0].tolist() == [str(i + 1) for i in range(16)]
    assert out1[0].tolist() == [str(i - 1) for i in range(16)]


@pytest.mark.parametrize("batch", [1, 2, 8])
def test_image_classifier_softmax(batch: int) -> None:
    images = np.random.default_rng(batch).random((batch, 3, 64, 64), dtype=np.float32)
    (probs,) = _session("image_classifier").run(["probabilities"], {"image": images})
    assert probs.shape == (batch, 10)
    assert probs.dtype == np.float32
    assert np.all(probs >= 0.0) and np.all(probs <= 1.0)
    np.testing.assert_allclose(probs.sum(axis=1), np.ones(batch), rtol=0, atol=1e-5)


def test_image_classifier_batch_rows_are_independent() -> None:
    images = np.random.default_rng(7).random((4, 3, 64, 64), dtype=np.float32)
    session = _session("image_classifier")
    (batched,) = session.run(None, {"image": images})
    for i in range(4):
        (single,) = session.run(None, {"image": images[i : i + 1]})
        np.testing.assert_allclose(single[0], batched[i], rtol=1e-5, atol=1e-6)


def test_image_classifier_depends_on_input() -> None:
    rng = np.random.default_rng(11)
    images = np.stack(
        [np.zeros((3, 64, 64), np.float32), rng.standard_normal((3, 64, 64)).astype(np.float32)]
    )
    (probs,) = _session("image_classifier").run(None, {"image": images})
    assert not np.allclose(probs[0], probs[1])
