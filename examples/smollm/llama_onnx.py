"""A LLaMA-architecture decoder as one ONNX step graph over a paged KV cache. Its kin's
differences (Qwen2's biases, Qwen3's head norms, Gemma's scaled embeddings, GELU, sandwich
norms, local layers and soft caps, LongRoPE's attention factor) are LlamaConfig's options.

One graph serves both prefill (q = the prompt chunk's length) and decode (q = 1): it takes
the new tokens of each row, their absolute positions, the row's past tokens as a list of
cache blocks and an additive attention mask, and returns the next-token logits of each
row's last position plus the new tokens' keys and values, which the engine writes into its
cache pool. The pool itself is an input (read only, passed zero-copy); the graph gathers the
blocks each row names, so no cache is copied whole from step to step.

The rows come in two groups, each [batch, q] with its own q: typically the decoding rows
(q = 1) and the rows prefilling a prompt chunk. The dense layers (norms, projections, MLP,
most of the work and all of the weights) run once over the flat tokens of both groups, so
one call reads the weights once per iteration; attention runs per group at the group's q
(llama_attention.py), so decode rows are not padded to the chunk's length. The second
group's inputs default to no rows (initializers of the same names, which a feed
overrides): a caller that feeds only the first group gets the one-group graph.

The contract (names and shapes the engine codes against; every dim symbolic but
kv_heads, head_dim and vocab):

    input_ids        INT64 [batch, q]
    positions        INT64 [batch, q]          absolute positions of the new tokens (RoPE)
    block_table      INT64 [batch, blocks]     each row's past blocks in order: past token t
                                               sits in block block_table[row, t // block_size]
                                               at offset t % block_size
    attention_mask   FP32  [batch, q, blocks * block_size + q]   0 to attend, -1e9 not; the
                                               past slots first, then the new tokens
    chunk_input_ids, chunk_positions, chunk_block_table, chunk_attention_mask
                                               the second group, the same way (default:
                                               [0, 1], [0, 1], [0, 1], [0, 1, 1])
    key_cache_{i}    FP32  [num_blocks, block_size, kv_heads, head_dim]   (and value_cache_{i})
    ->
    logits           FP32  [batch + chunk_batch, vocab]   the last query position of each
                                               row, the first group's rows first
    key_{i}          FP32  [batch * q + chunk_batch * chunk_q, kv_heads, head_dim]   after
                                               RoPE, flat: row r of the first group's q
                                               tokens from r * q, then the second group's
                                               (and value_{i})
    hidden_states    FP32  [batch * q + chunk_batch * chunk_q, hidden]   optional: every
                                               new token's hidden state after the final
                                               norm, flat as key_{i}; the LM head over it
                                               (then the logits' soft cap, where `logits`
                                               is Mul(Tanh(Div(x, c)), c)) gives each
                                               position's logits (the prompt's log
                                               probabilities). Fetched only when asked.

    metadata max_positions   the positions the RoPE tables hold (the engine refuses a
                             max_model_len above it)

Why it is shaped as it is, for onnxruntime on a CPU:
- Q, K and V come from one MatMul and gate/up from another (pre-transposed [in, out]
  weights), so a decode step runs few large GEMMs rather than many small ones; RoPE runs
  once on the Q and K heads together. At decode batch sizes every op's fixed cost counts
  (30 layers), so the graph keeps the op count per layer low.
- The attention scale 1/sqrt(head_dim) is folded into the Q weights (RoPE is a rotation,
  so scaling before or after it is the same).
- RoPE uses Hugging Face's rotate-half pairing (dimension j with j + rotary_dim/2); cos and
  sin come from tables computed in float64 and gathered by position, so a far position is
  as exact as a near one. The sign of rotate-half is folded into the sin table.
- Scores against the past slots and against the new tokens are two MatMuls whose results
  are concatenated, rather than concatenating the gathered past K and V with the new ones:
  for decode that copies a score row per head instead of the whole past K and V.
- Grouped-query attention without repeating K and V: the query heads of one KV head are
  stacked along the query axis, [batch, kv_heads, group * q, head_dim].
- RMSNorm is written as Pow, ReduceMean, Add, Sqrt, Div, Mul: the pattern onnxruntime
  fuses into its SimplifiedLayerNormalization kernel.
- The final norm runs over every new token (it is `hidden_states`), the LM head on each
  row's last position only; the head is a Gemm with transB=1 on the (tied) embedding
  table, so the table is stored once and never transposed. onnxruntime computes every
  node whether or not its output is fetched, so the norm is not a branch of its own:
  decode rows' tokens are all last positions (no extra work), and a prefill chunk adds
  one norm over its tokens.
- The mask is finite (-1e9), so a fully masked padding row gives a uniform softmax, not NaN.

Standard ONNX ops only (opset 17), fp32 weights; or, given the GGUF's Q4_1 blocks, the
layers in an If: on the blocks where a step has one token (llama_linear.py), on fp32
otherwise. That graph uses a com.microsoft kernel: it is for onnxruntime only, as is a
mixture of experts' (its MoE and QMoE operators, llama_moe.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import onnx
from llama_attention import (
    ExternalData,
    Graph,
    GroupInputs,
    attention,
    group_shapes,
    key_cache_name,
    rope,
    rope_tables,
    value_cache_name,
)
from llama_linear import DOMAIN as Q4_DOMAIN
from llama_linear import (
    Blocks,
    Linear,
    Q80Blocks,
    blocks_linear,
    fp32_linear,
    head_switch,
)
from llama_moe import ExpertBlocks, moe
from llama_weights import linear_weight_names, weight_names, weight_shapes
from onnx import TensorProto, helper

OPSET = 17
IR_VERSION = 8
PRODUCER_NAME = "ge-serve-examples"

# Graph input and output names (the engine's contract; see the module docstring).
INPUT_IDS = "input_ids"
POSITIONS = "positions"
BLOCK_TABLE = "block_table"
ATTENTION_MASK = "attention_mask"
CHUNK_INPUT_IDS = "chunk_input_ids"
CHUNK_POSITIONS = "chunk_positions"
CHUNK_BLOCK_TABLE = "chunk_block_table"
CHUNK_ATTENTION_MASK = "chunk_attention_mask"
LOGITS = "logits"
HIDDEN_STATES = "hidden_states"
MAX_POSITIONS = "max_positions"
MASKED = -1e9


def key_name(layer: int) -> str:
    return f"key_{layer}"


def value_name(layer: int) -> str:
    return f"value_{layer}"


Weights = Mapping[str, npt.NDArray[np.float32]]


@dataclass(frozen=True)
class LlamaConfig:
    """The hyperparameters of a LLaMA-architecture decoder."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    # Qwen2's: Q, K and V projections with a bias each.
    qkv_bias: bool = False
    # RoPE scaling as a GGUF stores it (Llama 3.1's `rope_freqs`, LongRoPE's short or long
    # factors, YaRN's, a linear factor for each): each frequency pair's divisor,
    # rotary_dim/2 of them; None: none.
    rope_freq_factors: tuple[float, ...] | None = None
    # Qwen3's and Gemma's: a head size of its own (the GGUF's key_length); None: hidden /
    # heads.
    head_size: int | None = None
    # Qwen3's and Gemma 3's: an RMSNorm over each Q and K head (its own weights) before RoPE;
    # OLMo 2's (`qk_norm_whole`): over all of Q's heads at once, and all of K's.
    qk_norm: bool = False
    qk_norm_whole: bool = False
    # OLMo 2's: no norm before the attention and the MLP (their outputs are normed,
    # `sandwich_norms`).
    pre_norms: bool = True
    # Gemma's: the embeddings times sqrt(hidden) (the tied LM head's table is not), and a
    # GELU (tanh) gate in place of SiLU.
    scale_embeddings: bool = False
    gelu: bool = False
    # Gemma 3's: a norm on the attention's and the MLP's outputs, before each residual add.
    sandwich_norms: bool = False
    # The scale of Q.K; None: 1/sqrt(head_dim).
    attention_scale: float | None = None
    # Gemma 3's (and OLMo 3's) local layers: each query sees the keys less than
    # `sliding_window` positions back, and RoPE runs at its own base there, unscaled.
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    sliding_rope_theta: float = 10000.0
    # The local layers' cos and sin magnitude (llama.cpp's: Gemma's the GGUF's attn_factor,
    # OLMo 3's none; neither YaRN's).
    sliding_rope_attention_factor: float = 1.0
    # LongRoPE's (Phi-3's) or YaRN's magnitude: the global layers' cos and sin multiplied by
    # it (llama.cpp's attn_factor).
    rope_attention_factor: float = 1.0
    # Gemma 2's soft caps, c * tanh(x / c), on the attention scores and on the logits;
    # 0: none.
    attention_softcap: float = 0.0
    logit_softcap: float = 0.0
    # Phi-4-mini's: RoPE over the first `rope_dims` of each head (rotate-half within them),
    # the rest passed as they are; None: the whole head.
    rope_dims: int | None = None
    # SmolLM3's: layers whose Q and K take no RoPE (every fourth).
    nope_layers: tuple[int, ...] = ()
    # Granite's multipliers: the embeddings times `embedding_scale`, the attention's and
    # the MLP's outputs times `residual_scale` before each residual add, the logits
    # divided by `logit_scale`.
    embedding_scale: float = 1.0
    residual_scale: float = 1.0
    logit_scale: float = 1.0
    # Ministral 3's (Llama 4's) attention temperature: Q times 1 + scale * ln(1 +
    # floor(position / length)), past the original context; 0: none.
    attention_temperature_scale: float = 0.0
    attention_temperature_length: int = 0
    # A mixture of experts in place of the MLP (Qwen3-MoE's, Qwen2-MoE's, OLMoE's, Granite
    # MoE's, ERNIE 4.5's, Mixtral's): a router picks `experts_used` of `num_experts` MLPs
    # of `expert_size` each per token (softmax over all, the top k kept), their outputs
    # summed by the kept weights, renormalized to sum 1 where `expert_norm` (OLMoE's and
    # Qwen2-MoE's are not); 0 experts: the dense MLP.
    num_experts: int = 0
    experts_used: int = 0
    expert_size: int = 0
    expert_norm: bool = True
    # A shared expert beside them (Qwen2-MoE's, Granite MoE Shared's): a dense SwiGLU MLP
    # of this size every token runs, its output added to the mixture's; with
    # `shared_expert_gate` (Qwen2-MoE's), first times sigmoid(x . w) for a weight w
    # [1, hidden]. 0: none.
    shared_expert_size: int = 0
    shared_expert_gate: bool = False
    # ERNIE 4.5's: the experts are chosen by their softmax weights plus a bias per expert
    # (`mlp.router.selection.bias`, llama.cpp's exp_probs_b), and weighted by the
    # softmax weights alone; and its first layers keep the dense MLP (`dense_layers`).
    expert_selection_bias: bool = False
    dense_layers: tuple[int, ...] = ()

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def rotary_dim(self) -> int:
        """The dimensions of each head RoPE rotates."""
        return self.head_dim if self.rope_dims is None else self.rope_dims

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    def validate(self) -> None:
        uneven = self.head_size is None and self.hidden_size % self.num_heads
        if uneven or self.num_heads % self.num_kv_heads:
            raise ValueError(f"heads do not divide evenly: {self}")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(
                f"RoPE needs an even number of dimensions up to head_dim {self.head_dim}, "
                f"got {self.rotary_dim}"
            )
        if bool(self.sliding_window) != bool(self.sliding_layers) or not set(
            self.sliding_layers
        ) <= set(range(self.num_layers)):
            raise ValueError(f"sliding layers {self.sliding_layers} of {self.num_layers}")
        if not set(self.nope_layers) <= set(range(self.num_layers)):
            raise ValueError(f"layers without RoPE {self.nope_layers} of {self.num_layers}")
        if self.qk_norm_whole and not self.qk_norm:
            raise ValueError("qk_norm_whole needs qk_norm")
        if not self.pre_norms and not self.sandwich_norms:
            raise ValueError("a layer without its pre-norms needs its output norms")
        if self.sandwich_norms and self.residual_scale != 1.0:
            raise ValueError("a residual scale before the output norms would be normed away")
        magnitudes = (
            self.logit_scale,
            self.rope_attention_factor,
            self.sliding_rope_attention_factor,
            *(self.rope_freq_factors or ()),
        )
        if not all(0 < value < math.inf for value in magnitudes):
            raise ValueError(
                f"logit_scale, the RoPE magnitudes and frequency factors must be positive "
                f"and finite, got {magnitudes}"
            )
        if self.num_experts and not (
            0 < self.experts_used <= self.num_experts and self.expert_size > 0
        ):
            raise ValueError(
                f"{self.experts_used} of {self.num_experts} experts of size "
                f"{self.expert_size}: a mixture needs 1 to all of its experts, each of some size"
            )
        if (self.shared_expert_size or self.shared_expert_gate) and not self.num_experts:
            raise ValueError("a shared expert needs a mixture of experts beside it")
        if self.shared_expert_size < 0 or (self.shared_expert_gate and not self.shared_expert_size):
            raise ValueError(f"a shared expert of size {self.shared_expert_size}")
        if (self.expert_selection_bias or self.dense_layers) and not self.num_experts:
            raise ValueError("a selection bias or dense layers need a mixture of experts")
        if not set(self.dense_layers) < set(range(self.num_layers)):
            raise ValueError(
                f"{len(self.dense_layers)} dense layers of {self.num_layers}: a mixture keeps "
                "some, and dense layers are among its own"
            )
        if self.expert_selection_bias and not self.expert_norm:
            # The unnormalized weights' correction (llama_moe.py) takes the top k of the
            # softmax, not of the biased weights.
            raise ValueError("a selection bias with weights not renormalized is not supported")
        if self.attention_temperature_scale and self.attention_temperature_length < 1:
            raise ValueError("an attention temperature needs its length (the original context)")
        factors = self.rope_freq_factors
        if factors is not None and len(factors) != self.rotary_dim // 2:
            raise ValueError(
                f"{len(factors)} RoPE frequency factors for {self.rotary_dim} rotated "
                f"dimensions (expected {self.rotary_dim // 2})"
            )


def _layer(
    g: Graph,
    x: str,
    weights: Weights,
    cfg: LlamaConfig,
    i: int,
    env: Mapping[str, str],
    groups: Sequence[Mapping[str, str]],
    linear: Linear,
    experts: Mapping[str, ExpertBlocks],
    int8_experts: bool = False,
) -> tuple[str, str, str]:
    """One decoder layer over the flat tokens of every group; returns (x out, key_i,
    value_i). The dense work (norms, projections, MLP) runs once over all the tokens, so
    the weights are read once per step; only attention runs per group. `experts`: a
    mixture's projections as GGUF blocks (llama_moe.py), where it has them;
    `int8_experts`: those blocks multiply activations rounded to 8 bits."""
    p = f"model.layers.{i}"
    d, kvh = cfg.head_dim, cfg.num_kv_heads
    # The attention scale goes into Q's weights, or, where Q is normed after them (which
    # would undo it), into its norm's.
    scale = cfg.attention_scale or 1.0 / math.sqrt(d)
    q_scale = 1.0 if cfg.qk_norm else scale
    normed = x
    if cfg.pre_norms:
        normed = g.rms_norm(
            x, weights[f"{p}.input_layernorm.weight"], f"{p}.attn_norm", cfg.rms_norm_eps
        )
    qkv = linear(
        g, normed,
        [
            (f"{p}.self_attn.q_proj.weight", q_scale),
            (f"{p}.self_attn.k_proj.weight", 1.0),
            (f"{p}.self_attn.v_proj.weight", 1.0),
        ],
        f"{p}.qkv",
    )  # fmt: skip
    if cfg.qkv_bias:  # Q's scaled as its weights are
        bias = np.concatenate([
            weights[f"{p}.self_attn.q_proj.bias"] * q_scale,
            weights[f"{p}.self_attn.k_proj.bias"],
            weights[f"{p}.self_attn.v_proj.bias"],
        ])  # fmt: skip
        qkv = g.op("Add", [qkv, g.const(f"{p}.qkv.bias", bias)], f"{p}.qkv_biased")
    if cfg.qk_norm_whole:  # OLMo 2's: Q's norm over all its heads, and K's
        sizes = [cfg.num_heads * d, kvh * d, kvh * d]
        flat_q, flat_k, flat_v = g.ops(
            "Split", [qkv, g.ints(f"{p}.qkv.parts", sizes)],
            [f"{p}.flat_q", f"{p}.flat_k", f"{p}.flat_v"], axis=-1,
        )  # fmt: skip
        normed_q = g.rms_norm(flat_q, weights[f"{p}.self_attn.q_norm.weight"] * scale,
                              f"{p}.q_norm", cfg.rms_norm_eps)  # fmt: skip
        normed_k = g.rms_norm(flat_k, weights[f"{p}.self_attn.k_norm.weight"], f"{p}.k_norm",
                              cfg.rms_norm_eps)  # fmt: skip
        qkv = g.op("Concat", [normed_q, normed_k, flat_v], f"{p}.qkv_normed", axis=-1)
    # One Reshape to heads, and RoPE on the Q and K heads together (they are adjacent).
    heads = g.op(
        "Reshape", [qkv, g.ints(f"{p}.qkv.shape", [0, cfg.num_heads + 2 * kvh, d])],
        f"{p}.qkv_heads",
    )  # fmt: skip
    qk, value = g.ops(
        "Split", [heads, g.ints(f"{p}.qkv.split", [cfg.num_heads + kvh, kvh])],
        [f"{p}.qk", value_name(i)], axis=1,
    )  # fmt: skip
    if cfg.qk_norm and not cfg.qk_norm_whole:
        # One norm over the Q and K heads: each head's row of weights.
        rows = np.concatenate([
            np.tile(weights[f"{p}.self_attn.q_norm.weight"] * scale, (cfg.num_heads, 1)),
            np.tile(weights[f"{p}.self_attn.k_norm.weight"], (kvh, 1)),
        ])  # fmt: skip
        qk = g.rms_norm(qk, rows, f"{p}.qk_norm", cfg.rms_norm_eps)
    sliding = i in cfg.sliding_layers
    tables = {"cos": env["cos_sliding"], "sin": env["sin_sliding"]} if sliding else env
    if i not in cfg.nope_layers:
        qk = rope(g, qk, tables, cfg.rotary_dim, d, f"{p}.qk_rope")
    q, key = g.ops(
        "Split", [qk, g.ints(f"{p}.qk.split", [cfg.num_heads, kvh])],
        [f"{p}.q_rope", key_name(i)], axis=1,
    )  # fmt: skip
    if cfg.attention_temperature_scale:
        q = g.op("Mul", [q, env["q_temperature"]], f"{p}.q_warm")
    if len(groups) == 1:  # every token is the group's: nothing to split or join
        ctx = attention(g, q, key, value, cfg, i, groups[0], groups[0]["tag"])
    else:
        tags = [grp["tag"] for grp in groups]
        split = env["group_tokens"]
        qs = g.ops("Split", [q, split], [f"{p}.q.{t}" for t in tags], axis=0)
        ks = g.ops("Split", [key, split], [f"{p}.k.{t}" for t in tags], axis=0)
        vs = g.ops("Split", [value, split], [f"{p}.v.{t}" for t in tags], axis=0)
        contexts = [
            attention(g, qs[n], ks[n], vs[n], cfg, i, grp, grp["tag"])
            for n, grp in enumerate(groups)
        ]
        ctx = g.op("Concat", contexts, f"{p}.ctx", axis=0)
    # Granite's residual scale rides on the output projections' weights.
    attn = linear(g, ctx, [(f"{p}.self_attn.o_proj.weight", cfg.residual_scale)], f"{p}.o")
    if cfg.sandwich_norms:
        attn = g.rms_norm(attn, weights[f"{p}.post_self_attn_layernorm.weight"],
                          f"{p}.attn_out_norm", cfg.rms_norm_eps)  # fmt: skip
    x = g.op("Add", [x, attn], f"{p}.resid1")

    normed = x
    if cfg.pre_norms:
        normed = g.rms_norm(x, weights[f"{p}.post_attention_layernorm.weight"],
                            f"{p}.mlp_norm", cfg.rms_norm_eps)  # fmt: skip
    if cfg.num_experts and i not in cfg.dense_layers:
        down = moe(g, normed, weights, experts, cfg, i, cfg.residual_scale, int8_experts)
        if cfg.shared_expert_size:
            down = g.op("Add", [down, _shared_expert(g, normed, weights, cfg, i, linear)],
                        f"{p}.mlp.with_shared")  # fmt: skip
    else:
        down = _mlp(g, normed, cfg, linear, f"{p}.mlp", cfg.intermediate_size)
    if cfg.sandwich_norms:
        down = g.rms_norm(down, weights[f"{p}.post_feedforward_layernorm.weight"],
                          f"{p}.mlp_out_norm", cfg.rms_norm_eps)  # fmt: skip
    return g.op("Add", [x, down], f"{p}.out"), key, value


def _mlp(g: Graph, x: str, cfg: LlamaConfig, linear: Linear, p: str, size: int) -> str:
    """The gated MLP under `p` (its gate, up and down projections, `size` wide) over x,
    times Granite's residual scale."""
    both = [(f"{p}.gate_proj.weight", 1.0), (f"{p}.up_proj.weight", 1.0)]
    gu = linear(g, x, both, f"{p}.gate_up")
    gate, up = g.ops(
        "Split", [gu, g.ints(f"{p}.gate_up.split", [size, size])], [f"{p}.gate", f"{p}.up"],
        axis=-1,
    )  # fmt: skip
    if cfg.gelu:
        gated = g.gelu_tanh(gate, f"{p}.gelu")
    else:
        gated = g.op("Mul", [gate, g.op("Sigmoid", [gate], f"{p}.sigmoid")], f"{p}.silu")
    act = g.op("Mul", [gated, up], f"{p}.act")
    return linear(g, act, [(f"{p}.down_proj.weight", cfg.residual_scale)], f"{p}.down")


def _shared_expert(
    g: Graph, x: str, weights: Weights, cfg: LlamaConfig, i: int, linear: Linear
) -> str:
    """A mixture's shared expert over x: its MLP, times sigmoid(x . w) where it is gated
    (Qwen2-MoE's shared_expert_gate, as Hugging Face's and llama.cpp's graphs have it)."""
    p = f"model.layers.{i}.mlp"
    out = _mlp(g, x, cfg, linear, f"{p}.shared_expert", cfg.shared_expert_size)
    if not cfg.shared_expert_gate:
        return out
    w_t = np.ascontiguousarray(weights[f"{p}.shared_expert_gate.weight"].T)  # [hidden, 1]
    logit = g.op("MatMul", [x, g.const(f"{p}.shared_expert_gate.t", w_t)], f"{p}.shared_gate")
    gate = g.op("Sigmoid", [logit], f"{p}.shared_gate.sigmoid")
    return g.op("Mul", [out, gate], f"{p}.shared_expert.gated")


def _temperature(g: Graph, cfg: LlamaConfig, positions: str) -> str:
    """Each new token's Q multiplier [n, 1, 1]: 1 + s ln(1 + floor(position / length))."""
    where = g.op("Cast", [positions], "temp.positions", to=TensorProto.FLOAT)
    length = g.const("temp.length", float(cfg.attention_temperature_length))
    turns = g.op("Floor", [g.op("Div", [where, length], "temp.div")], "temp.floor")
    one = g.const("temp.one", 1.0)
    grown = g.op("Log", [g.op("Add", [turns, one], "temp.add")], "temp.log")
    scale = g.const("temp.scale", cfg.attention_temperature_scale)
    factor = g.op("Add", [g.op("Mul", [grown, scale], "temp.mul"), one], "temp.factor")
    return g.op("Unsqueeze", [factor, g.ints("axes.1_2", [1, 2])], "temp.factor3")


def _prelude(
    g: Graph, cfg: LlamaConfig, groups: Sequence[GroupInputs], rows: int
) -> tuple[dict[str, str], list[dict[str, str]], str]:
    """The shape tensors and tables (of `rows` positions) every layer shares, each
    group's, and the flat token ids [n] (every group's rows x chunk, in group order)."""
    cos_table, sin_table = rope_tables(
        cfg, cfg.rope_theta, cfg.rope_freq_factors, rows, cfg.rope_attention_factor
    )
    flat = g.ints("c.flat", [-1])
    ids = g.op(
        "Concat", [g.op("Reshape", [grp.input_ids, flat], f"{grp.tag}.ids_flat") for grp in groups],
        "ids_flat", axis=0,
    )  # fmt: skip
    positions = g.op(
        "Concat",
        [g.op("Reshape", [grp.positions, flat], f"{grp.tag}.positions_flat") for grp in groups],
        "positions_flat",
        axis=0,
    )
    cos = g.op("Gather", [g.const("rope.cos", cos_table), positions], "rope.cos_q", axis=0)
    sin = g.op("Gather", [g.const("rope.sin", sin_table), positions], "rope.sin_q", axis=0)
    head_axis = g.ints("axes.1", [1])
    env = {
        "cos": g.op("Unsqueeze", [cos, head_axis], "rope.cos3"),
        "sin": g.op("Unsqueeze", [sin, head_axis], "rope.sin3"),
    }
    if cfg.sliding_layers:  # the local layers' RoPE: its own base, no scaling
        local = rope_tables(
            cfg, cfg.sliding_rope_theta, None, rows, cfg.sliding_rope_attention_factor
        )
        for part, table in zip(("cos", "sin"), local, strict=True):
            picked = g.op("Gather", [g.const(f"rope.{part}_sliding", table), positions],
                          f"rope.{part}_sliding_q", axis=0)  # fmt: skip
            env[f"{part}_sliding"] = g.op("Unsqueeze", [picked, head_axis], f"rope.{part}_sliding3")
    if cfg.attention_temperature_scale:
        env["q_temperature"] = _temperature(g, cfg, positions)
    one, two = g.ints("c.1", [1]), g.ints("c.2", [2])
    block_size = g.op(
        "Slice", [g.op("Shape", [key_cache_name(0)], "shape.pool"), one, two], "shape.block_size"
    )
    envs = [group_shapes(g, cfg, grp, block_size) for grp in groups]
    env["group_tokens"] = g.op("Concat", [e["tokens"] for e in envs], "shape.group_tokens", axis=0)
    return env, envs, ids


GROUPS = (
    GroupInputs("rows", INPUT_IDS, POSITIONS, BLOCK_TABLE, ATTENTION_MASK),
    GroupInputs("chunk", CHUNK_INPUT_IDS, CHUNK_POSITIONS, CHUNK_BLOCK_TABLE, CHUNK_ATTENTION_MASK),
)
# The first group's token ids, flat (_prelude's name for them).
ROWS_IDS_FLAT = f"{GROUPS[0].tag}.ids_flat"


def _chunk_defaults(g: Graph) -> None:
    """The second group's inputs default to no rows (initializers of the same name, which
    a feed overrides): a caller that feeds only the first group runs it alone."""
    chunk = GROUPS[1]
    g.const(chunk.input_ids, np.zeros((0, 1)), np.int64)
    g.const(chunk.positions, np.zeros((0, 1)), np.int64)
    g.const(chunk.block_table, np.zeros((0, 1)), np.int64)
    g.const(chunk.attention_mask, np.zeros((0, 1, 1)), np.float32)


def _shape(weights: Weights, name: str) -> tuple[int, ...]:
    """A weight's shape, without dequantizing one that blocks stand in for
    (gguf_model.BlockWeights says it)."""
    shape_of = getattr(weights, "shape_of", None)
    return tuple(shape_of(name)) if shape_of is not None else tuple(weights[name].shape)


def _layers(
    g: Graph,
    x: str,
    weights: Weights,
    cfg: LlamaConfig,
    env: Mapping[str, str],
    groups: Sequence[Mapping[str, str]],
    linear: Linear,
    experts: Mapping[str, ExpertBlocks],
    int8_experts: bool = False,
) -> tuple[str, list[str]]:
    """Every decoder layer; returns (x out, [key_0, value_0, key_1, ...])."""
    kv: list[str] = []
    for i in range(cfg.num_layers):
        x, key, value = _layer(g, x, weights, cfg, i, env, groups, linear, experts, int8_experts)
        kv += [key, value]
    return x, kv


def _one_token_switch(
    g: Graph,
    x: str,
    ids: str,
    weights: Weights,
    blocks: Mapping[str, Blocks],
    cfg: LlamaConfig,
    env: Mapping[str, str],
    groups: Sequence[Mapping[str, str]],
    int8_activations: bool,
    experts: Mapping[str, ExpertBlocks],
) -> tuple[str, str]:
    """(x out, the one-token condition): the layers in an If: on the Q4_1 blocks where the
    step has one token (llama_linear.py: onnxruntime's 4-bit kernel is fast for one row
    only), on the fp32 weights otherwise.
    The one-token branch is the first group's alone: the engine gives a step of one
    token as a row (a chunk only beside rows), and the second group's attention, run on
    no tokens, would still be 30-odd nodes a layer. A one-token chunk with no rows (a
    caller's choice) takes the other branch.
    Both branches read the outer graph's tensors (x, the shapes, the cache pools) and
    keep their weights there too: onnxruntime holds a second copy of a subgraph's own
    initializers (0.9 GB more for SmolLM2), and the norms' are then stored once. Each
    branch names its nodes' outputs with a prefix of its own."""
    branches = []
    for tag, linear, its_groups, int8 in (
        ("one_token/", blocks_linear(blocks, weights, int8_activations), groups[:1],
         int8_activations),
        ("tokens/", fp32_linear(weights), groups, False),
    ):  # fmt: skip
        branch = Graph(tag, g)
        out, kv = _layers(branch, x, weights, cfg, env, its_groups, linear, experts, int8)
        outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (out, *kv)]
        branches.append(helper.make_graph(branch.nodes, tag.rstrip("/"), [], outputs))
    c1 = g.ints("c.1", [1])
    one = g.op(
        "And",
        [
            g.op("Equal", [g.op("Shape", [ids], "shape.ids_flat"), c1], "one_token.all"),
            g.op("Equal", [g.op("Shape", [ROWS_IDS_FLAT], "shape.rows_flat"), c1], "one_token.row"),
        ],
        "one_token",
    )
    names = [
        "layers.out",
        *(n for i in range(cfg.num_layers) for n in (key_name(i), value_name(i))),
    ]
    out = g.ops("If", [one], names, then_branch=branches[0], else_branch=branches[1])[0]
    return out, one


def build_step_graph(
    weights: Weights,
    cfg: LlamaConfig,
    blocks: Mapping[str, Blocks] | None = None,
    int8_activations: bool = False,
    head: Q80Blocks | None = None,
    external: ExternalData | None = None,
    blocks_only: bool = False,
    positions: int | None = None,
    experts: Mapping[str, ExpertBlocks] | None = None,
) -> onnx.ModelProto:
    """The step graph of the contract in the module docstring, from Hugging Face-named
    weights (see weight_names). With `blocks` (projections' GGUF blocks, each equal to
    its fp32 weight), one-token steps compute on the blocks where a projection's parts
    all have a form llama_linear.blocks_linear takes, and on fp32 where not (an If;
    onnxruntime's com.microsoft MatMulNBits, so the graph is for onnxruntime only); on
    int8 activations with `int8_activations`, and then the LM head on `head` (the head's
    Q8_0 blocks, equal to its fp32 table) too. With `blocks_only`, every step computes on
    the blocks (no If, and no fp32 copy of the projections the blocks serve: those in a
    quarter of the memory, prompts slower). With `external`, the large constants
    are written to its file as they are made, the graph holding references to them. The
    RoPE tables hold `positions` (default: the config's whole context), which the graph's
    metadata says. `experts`: a mixture's stacked projections as GGUF blocks, in place of
    their fp32 weights (llama_moe.py)."""
    cfg.validate()
    rows = cfg.max_position_embeddings if positions is None else positions
    if rows < 1:
        raise ValueError(f"the RoPE tables need positions, got {rows}")
    if blocks_only and (not blocks or head is not None):
        raise ValueError("blocks_only takes projections' blocks and the fp32 head")
    if head is not None and (not blocks or not int8_activations):
        raise ValueError("the head's Q8_0 blocks serve one-token steps on int8 activations")
    table = "lm_head.weight" if not cfg.tie_word_embeddings else "model.embed_tokens.weight"
    if head is not None and head.shape != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"the head's blocks are {head.shape}, {table} is not")
    experts = experts or {}
    for name, stacked in experts.items():
        if not cfg.num_experts or stacked.shape != weight_shapes(cfg).get(name):
            raise ValueError(f"expert blocks of {stacked.shape} for {name}, no such weight")
    missing = [n for n in weight_names(cfg) if n not in weights and n not in experts]
    if missing:
        raise ValueError(f"weights lack {missing[:5]}{'...' if len(missing) > 5 else ''}")
    projections = set(linear_weight_names(cfg))
    for name, found in (blocks or {}).items():
        if name not in projections or found.shape != _shape(weights, name):
            raise ValueError(f"blocks of {found.shape} for {name}, no such projection")
    for name, shape in weight_shapes(cfg).items():
        if name not in experts and _shape(weights, name) != shape:
            raise ValueError(f"{name} is {_shape(weights, name)}, expected {shape}")
    g = Graph(external=external)
    _chunk_defaults(g)
    env, groups, ids = _prelude(g, cfg, GROUPS, rows)
    embed = g.const("model.embed_tokens.weight", weights["model.embed_tokens.weight"])
    x = g.op("Gather", [embed, ids], "embed", axis=0)
    if cfg.scale_embeddings:
        root = g.const("embed.scale", math.sqrt(cfg.hidden_size))
        x = g.op("Mul", [x, root], "embed_scaled")
    if cfg.embedding_scale != 1.0:  # Granite's
        x = g.op("Mul", [x, g.const("embed.multiplier", cfg.embedding_scale)], "embed_times")
    one_token = ""
    if not blocks:
        x, _ = _layers(g, x, weights, cfg, env, groups, fp32_linear(weights), experts)
    elif blocks_only:
        linear = blocks_linear(blocks, weights, int8_activations, mixed=True)
        x, _ = _layers(g, x, weights, cfg, env, groups, linear, experts, int8_activations)
    else:
        x, one_token = _one_token_switch(
            g, x, ids, weights, blocks, cfg, env, groups, int8_activations, experts
        )
    # The final norm runs once over every new token (its output is `hidden_states`, for
    # the prompt's log probabilities); the LM head over each row's last position only. A
    # decode step's tokens are all last positions, so that costs decode nothing, and a
    # prefill chunk one norm over its tokens (microseconds beside the layers).
    # Granite's logit scale divides the final norm's weights, so the head over
    # `hidden_states` (the prompt's log probabilities) gives the scaled logits too.
    final = weights["model.norm.weight"]
    if cfg.logit_scale != 1.0:
        final = (final / np.float32(cfg.logit_scale)).astype(np.float32)
    hidden = g.rms_norm(x, final, "model.norm", cfg.rms_norm_eps)
    g.op("Identity", [hidden], HIDDEN_STATES)
    parts = g.ops(
        "Split", [hidden, env["group_tokens"]], [f"{grp['tag']}.hidden" for grp in groups], axis=0
    )
    lasts = [
        g.op(
            "Gather",
            [g.op("Reshape", [part, grp["rows3_shape"]], f"{grp['tag']}.hidden3"), grp["last"]],
            f"{grp['tag']}.last_hidden",
            axis=1,
        )
        for part, grp in zip(parts, groups, strict=True)
    ]
    normed = g.op("Concat", lasts, "last_hidden", axis=0)
    fp32_head = g.const(table, weights[table])
    raw = f"{LOGITS}.raw" if cfg.logit_softcap else LOGITS
    if head is None:
        g.op("Gemm", [normed, fp32_head], raw, transB=1)
    else:
        head_switch(g, one_token, normed, fp32_head, head, raw)
    if cfg.logit_softcap:  # backends/llm/prompt_logprobs.py reads the cap off this pattern
        g.softcap(raw, cfg.logit_softcap, LOGITS)

    kv_shape_in: list[str | int] = ["num_blocks", "block_size", cfg.num_kv_heads, cfg.head_dim]
    kv_shape_out: list[str | int] = ["tokens", cfg.num_kv_heads, cfg.head_dim]
    inputs = []
    for grp_in, prefix in zip(GROUPS, ("", "chunk_"), strict=True):
        inputs += [
            helper.make_tensor_value_info(
                grp_in.input_ids, TensorProto.INT64, [f"{prefix}batch", f"{prefix}q"]
            ),
            helper.make_tensor_value_info(
                grp_in.positions, TensorProto.INT64, [f"{prefix}batch", f"{prefix}q"]
            ),
            helper.make_tensor_value_info(
                grp_in.block_table, TensorProto.INT64, [f"{prefix}batch", f"{prefix}blocks"]
            ),
            helper.make_tensor_value_info(
                grp_in.attention_mask,
                TensorProto.FLOAT,
                [f"{prefix}batch", f"{prefix}q", f"{prefix}past_and_q"],
            ),
        ]
    outputs = [
        helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, ["rows", cfg.vocab_size]),
        helper.make_tensor_value_info(
            HIDDEN_STATES, TensorProto.FLOAT, ["tokens", cfg.hidden_size]
        ),
    ]
    for i in range(cfg.num_layers):
        for name in (key_cache_name(i), value_cache_name(i)):
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, kv_shape_in))
        for name in (key_name(i), value_name(i)):
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, kv_shape_out))
    opsets = [helper.make_opsetid("", OPSET)]
    if blocks or cfg.num_experts:  # MatMulNBits, MoE and QMoE
        opsets.append(helper.make_opsetid(Q4_DOMAIN, 1))
    model = helper.make_model(
        helper.make_graph(g.nodes, "llama_step", inputs, outputs),
        opset_imports=opsets,
        producer_name=PRODUCER_NAME,
        ir_version=IR_VERSION,
    )
    helper.set_model_props(model, {MAX_POSITIONS: str(rows)})
    # make_graph and make_model each copy what they are given: the weights are moved in
    # one at a time instead, so a model of 5 GB is held once, not three times over.
    g.initializers.reverse()
    while g.initializers:
        model.graph.initializer.append(g.initializers.pop())
    return model
