"""A LLaMA-architecture decoder's forward pass in plain numpy: the reference the step graph
(examples/smollm/llama_onnx.py) and the generation engine must match.

Written from the Hugging Face modelling code's definitions, not from the graph: the whole
sequence at once, causal attention with K and V repeated per query head, no cache, no
padding, rotate-half RoPE with cos and sin computed per position, RMSNorm, SwiGLU, the LM
head on the tied embedding. It runs in float64 by default, so it is the more exact side of
any comparison.

Greedy decoding is checked by teacher forcing (`greedy_mismatch`): one forward pass over
prompt + generated tokens gives the logits at every position, and the generated sequence is
the reference's own greedy output exactly when each generated token is the argmax at the
position before it. That is the same check as decoding token by token, at the cost of one
pass instead of one per token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from threadpoolctl import threadpool_limits

FloatArray = npt.NDArray[np.floating[Any]]


class Config(Protocol):
    """What the reference reads of a LlamaConfig (examples/smollm/llama_onnx.py)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rope_theta: float
    rope_freq_factors: tuple[float, ...] | None
    qkv_bias: bool
    qk_norm: bool
    qk_norm_whole: bool
    pre_norms: bool
    scale_embeddings: bool
    gelu: bool
    sandwich_norms: bool
    attention_scale: float | None
    sliding_window: int
    sliding_layers: tuple[int, ...]
    sliding_rope_theta: float
    sliding_rope_attention_factor: float
    rope_attention_factor: float
    attention_softcap: float
    logit_softcap: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    nope_layers: tuple[int, ...]
    embedding_scale: float
    residual_scale: float
    logit_scale: float
    attention_temperature_scale: float
    attention_temperature_length: int
    num_experts: int
    experts_used: int
    expert_norm: bool
    shared_expert_size: int
    shared_expert_gate: bool
    expert_selection_bias: bool
    dense_layers: tuple[int, ...]

    @property
    def head_dim(self) -> int: ...

    @property
    def rotary_dim(self) -> int: ...


def _rms_norm(x: FloatArray, weight: FloatArray, eps: float) -> FloatArray:
    out: FloatArray = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight
    return out


def _rotate_half(x: FloatArray) -> FloatArray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _apply_rope(x: FloatArray, cos: FloatArray, sin: FloatArray) -> FloatArray:
    """x rotated over its first cos.shape[-1] dimensions, the rest passed as they are
    (Hugging Face's partial rotary: q_rot, q_pass)."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    return np.concatenate([rot * cos + _rotate_half(rot) * sin, rest], axis=-1)


def _silu(x: FloatArray) -> FloatArray:
    out: FloatArray = x / (1.0 + np.exp(-x))
    return out


def _gelu_tanh(x: FloatArray) -> FloatArray:
    out: FloatArray = 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return out


def _rope(
    n: int, d: int, theta: float, factors: Sequence[float] | None, dtype: type, magnitude: float
) -> tuple[FloatArray, FloatArray]:
    """(cos, sin) [n, 1, d] of positions 0..n-1, each frequency divided by its factor, both
    times `magnitude` (LongRoPE's)."""
    inv_freq = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    if factors is not None:
        inv_freq = inv_freq / np.asarray(factors)
    angles = np.arange(n, dtype=np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate([angles, angles], axis=-1)
    cos, sin = np.cos(emb) * magnitude, np.sin(emb) * magnitude
    return cos.astype(dtype)[:, None, :], sin.astype(dtype)[:, None, :]


# The weights forward() last converted: (the caller's mapping, dtype, the converted arrays).
# One entry: a test checks many sequences of one model in a row, and converting SmolLM2's
# 135M weights to float64 costs a second of CPU a pass (a fifth of the pass) and a GB.
_converted: tuple[Mapping[str, npt.NDArray[np.float32]], type, dict[str, FloatArray]] | None = None


def _weights_as(
    weights: Mapping[str, npt.NDArray[np.float32]], dtype: type
) -> dict[str, FloatArray]:
    """`weights` converted to `dtype`, kept for the next call with the same mapping (the
    mapping itself is kept too, so no other can take its id; weights are never changed in
    place)."""
    global _converted
    if _converted is None or _converted[0] is not weights or _converted[1] is not dtype:
        _converted = None  # free the previous model's arrays before converting the next
        _converted = (weights, dtype, {k: v.astype(dtype) for k, v in weights.items()})
    return _converted[2]


def forward(
    weights: Mapping[str, npt.NDArray[np.float32]],
    cfg: Config,
    ids: Sequence[int],
    dtype: type = np.float64,
    first: int = 0,
) -> FloatArray:
    """The logits [len(ids) - first, vocab] at positions first.. of one unpadded sequence
    (the LM head is the costly part of a short sequence; skip what is not needed); numpy's
    BLAS runs it on one thread: its idle threads spin, and on the suite's loaded two cores
    a pass cost several times the CPU on two threads that it costs on one."""
    with threadpool_limits(limits=1, user_api="blas"):
        return _forward(weights, cfg, ids, dtype, first)


def _forward(
    weights: Mapping[str, npt.NDArray[np.float32]],
    cfg: Config,
    ids: Sequence[int],
    dtype: type,
    first: int,
) -> FloatArray:
    w = _weights_as(weights, dtype)
    n, heads, kv_heads = len(ids), cfg.num_heads, cfg.num_kv_heads
    d, r = cfg.head_dim, cfg.rotary_dim
    x = w["model.embed_tokens.weight"][np.asarray(ids, dtype=np.int64)]
    if cfg.scale_embeddings:  # Gemma's
        x = x * np.sqrt(np.asarray(cfg.hidden_size, dtype))
    x = x * cfg.embedding_scale  # Granite's embedding_multiplier
    causal = np.triu(np.full((n, n), -np.inf), k=1)
    back = np.arange(n)[:, None] - np.arange(n)[None, :]  # query position - key position
    local = causal + np.where(back >= cfg.sliding_window, -np.inf, 0.0)
    tables = {
        False: _rope(n, r, cfg.rope_theta, cfg.rope_freq_factors, dtype, cfg.rope_attention_factor),
        True: _rope(n, r, cfg.sliding_rope_theta, None, dtype, cfg.sliding_rope_attention_factor),
    }
    for i in range(cfg.num_layers):
        sliding = i in cfg.sliding_layers
        cos, sin = tables[sliding]
        p = f"model.layers.{i}"
        h = _rms_norm(x, w[f"{p}.input_layernorm.weight"], cfg.rms_norm_eps) if cfg.pre_norms else x
        q: FloatArray
        k: FloatArray
        q, k, v = (h @ w[f"{p}.self_attn.{c}_proj.weight"].T for c in "qkv")
        if cfg.qkv_bias:
            q, k, v = (
                x + w[f"{p}.self_attn.{c}_proj.bias"] for x, c in zip((q, k, v), "qkv", strict=True)
            )
        if cfg.qk_norm_whole:  # OLMo 2's: all of Q's heads normed at once, and K's
            q = _rms_norm(q, w[f"{p}.self_attn.q_norm.weight"], cfg.rms_norm_eps)
            k = _rms_norm(k, w[f"{p}.self_attn.k_norm.weight"], cfg.rms_norm_eps)
        q, k, v = q.reshape(n, heads, d), k.reshape(n, kv_heads, d), v.reshape(n, kv_heads, d)
        if cfg.qk_norm and not cfg.qk_norm_whole:  # Qwen3's: each head normed on its own
            q = _rms_norm(q, w[f"{p}.self_attn.q_norm.weight"], cfg.rms_norm_eps)
            k = _rms_norm(k, w[f"{p}.self_attn.k_norm.weight"], cfg.rms_norm_eps)
        if i not in cfg.nope_layers:  # SmolLM3's no_rope_layers
            q, k = _apply_rope(q, cos, sin), _apply_rope(k, cos, sin)
        if cfg.attention_temperature_scale:  # Ministral 3's llama_4_scaling_beta
            turns = np.floor(np.arange(n) / cfg.attention_temperature_length)
            q = q * (1 + cfg.attention_temperature_scale * np.log1p(turns))[:, None, None]
        group = heads // kv_heads
        k = np.repeat(k, group, axis=1)  # query head j reads KV head j // group
        v = np.repeat(v, group, axis=1)
        scale = cfg.attention_scale or 1.0 / math.sqrt(d)
        scores = np.einsum("qhd,khd->hqk", q, k) * scale
        if cfg.attention_softcap:  # Gemma 2's, before the mask
            scores = np.tanh(scores / cfg.attention_softcap) * cfg.attention_softcap
        scores = scores + (local if sliding else causal)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        context = np.einsum("hqk,khd->qhd", probs, v).reshape(n, heads * d)
        attn: FloatArray = context @ w[f"{p}.self_attn.o_proj.weight"].T
        if cfg.sandwich_norms:  # Gemma 3's
            attn = _rms_norm(attn, w[f"{p}.post_self_attn_layernorm.weight"], cfg.rms_norm_eps)
        x = x + attn * cfg.residual_scale  # Granite's residual_multiplier
        if cfg.pre_norms:
            h = _rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], cfg.rms_norm_eps)
        else:
            h = x
        down: FloatArray
        if cfg.num_experts and i not in cfg.dense_layers:
            down = _experts(h, w, cfg, p)
        else:
            gate = h @ w[f"{p}.mlp.gate_proj.weight"].T
            up = h @ w[f"{p}.mlp.up_proj.weight"].T
            down = ((_gelu_tanh(gate) if cfg.gelu else _silu(gate)) * up) @ w[
                f"{p}.mlp.down_proj.weight"
            ].T
        if cfg.sandwich_norms:
            down = _rms_norm(down, w[f"{p}.post_feedforward_layernorm.weight"], cfg.rms_norm_eps)
        x = x + down * cfg.residual_scale
    x = _rms_norm(x[first:], w["model.norm.weight"], cfg.rms_norm_eps)
    head = w["model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"]
    logits: FloatArray = x @ head.T / cfg.logit_scale  # Granite's logits_scaling
    if cfg.logit_softcap:
        logits = np.tanh(logits / cfg.logit_softcap) * cfg.logit_softcap
    return logits


def _experts(h: FloatArray, w: Mapping[str, FloatArray], cfg: Config, p: str) -> FloatArray:
    """Hugging Face's sparse MoE block (Qwen3-MoE's, OLMoE's, Mixtral's): each token's
    softmax over the router's logits, its top k kept (renormalized to sum 1 where
    `expert_norm`), the chosen experts' SwiGLU MLPs summed by those weights; plus Qwen2-MoE's
    and Granite MoE Shared's shared expert, a SwiGLU MLP every token runs (Qwen2-MoE's times
    the sigmoid of its gate)."""
    logits = h @ w[f"{p}.mlp.router.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(h)
    # ERNIE 4.5's: chosen by the weights plus a bias, weighted without it.
    choice = probs + w[f"{p}.mlp.router.selection.bias"] if cfg.expert_selection_bias else probs
    for t in range(h.shape[0]):
        chosen = np.argsort(-choice[t], kind="stable")[: cfg.experts_used]
        weights = probs[t, chosen]
        if cfg.expert_norm:
            weights = weights / weights.sum()
        for e, weight in zip(chosen, weights, strict=True):
            gate = w[f"{p}.mlp.experts.gate_proj.weight"][e] @ h[t]
            up = w[f"{p}.mlp.experts.up_proj.weight"][e] @ h[t]
            out[t] += weight * (w[f"{p}.mlp.experts.down_proj.weight"][e] @ (_silu(gate) * up))
    if cfg.shared_expert_size:
        s = f"{p}.mlp.shared_expert"
        gate, up = h @ w[f"{s}.gate_proj.weight"].T, h @ w[f"{s}.up_proj.weight"].T
        shared = (_silu(gate) * up) @ w[f"{s}.down_proj.weight"].T
        if cfg.shared_expert_gate:
            shared = shared / (1.0 + np.exp(-(h @ w[f"{p}.mlp.shared_expert_gate.weight"].T)))
        out = out + shared
    return out


def greedy_mismatch(
    weights: Mapping[str, npt.NDArray[np.float32]],
    cfg: Config,
    prompt: Sequence[int],
    generated: Sequence[int],
    dtype: type = np.float64,
) -> str | None:
    """None when `generated` is the reference's greedy continuation of `prompt`, else a
    sentence naming the first token that differs and the two logits."""
    if not generated:
        return None
    logits = forward(weights, cfg, [*prompt, *generated[:-1]], dtype, first=len(prompt) - 1)
    for step, token in enumerate(generated):
        row = logits[step]
        best = int(row.argmax())
        if best != token:
            return (
                f"token {step}: got {token} (logit {row[token]:.5f}), the reference's greedy "
                f"choice is {best} (logit {row[best]:.5f})"
            )
    return None


def greedy(
    weights: Mapping[str, npt.NDArray[np.float32]],
    cfg: Config,
    prompt: Sequence[int],
    steps: int,
    stop: Sequence[int] = (),
) -> list[int]:
    """Greedy decoding by a full forward pass per token (small models only)."""
    out: list[int] = []
    for _ in range(steps):
        ids = [*prompt, *out]
        token = int(forward(weights, cfg, ids, first=len(ids) - 1)[-1].argmax())
        out.append(token)
        if token in stop:
            break
    return out
