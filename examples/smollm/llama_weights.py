"""The weights a LLaMA step graph (llama_onnx.py) is built from, by their Hugging Face
names and shapes; random ones of those shapes for tests. A mixture of experts' weights
are stacked, one [experts, out, in] tensor each for the gate, up and down projections
(`mlp.experts.{kind}_proj`), and its router is `mlp.router` [experts, hidden]; a shared
expert's projections are `mlp.shared_expert.{kind}_proj`, its gate
`mlp.shared_expert_gate` [1, hidden] (Hugging Face's Qwen2-MoE names), and a bias on
the router's weights for choosing the experts `mlp.router.selection.bias` [experts]."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from llama_linear import LINEAR_KINDS

if TYPE_CHECKING:
    from llama_onnx import LlamaConfig


def weight_names(cfg: LlamaConfig) -> list[str]:
    """The tensors a weights dict holds, by their Hugging Face names; each linear weight is
    [out, in] as torch's Linear keeps it, Q and K in Hugging Face's (rotate-half) order."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not cfg.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}"
        if cfg.pre_norms:
            names += [f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight"]
        names += [f"{p}.self_attn.{k}_proj.weight" for k in ("q", "k", "v", "o")]
        if cfg.num_experts and i not in cfg.dense_layers:
            names.append(f"{p}.mlp.router.weight")
            if cfg.expert_selection_bias:
                names.append(f"{p}.mlp.router.selection.bias")
            names += [f"{p}.mlp.experts.{k}_proj.weight" for k in ("gate", "up", "down")]
            if cfg.shared_expert_size:
                names += [f"{p}.mlp.shared_expert.{k}_proj.weight" for k in ("gate", "up", "down")]
            if cfg.shared_expert_gate:
                names.append(f"{p}.mlp.shared_expert_gate.weight")
        else:
            names += [f"{p}.mlp.{k}_proj.weight" for k in ("gate", "up", "down")]
        if cfg.qkv_bias:
            names += [f"{p}.self_attn.{k}_proj.bias" for k in ("q", "k", "v")]
        if cfg.qk_norm:
            names += [f"{p}.self_attn.{k}_norm.weight" for k in ("q", "k")]
        if cfg.sandwich_norms:
            names += [
                f"{p}.post_self_attn_layernorm.weight",
                f"{p}.post_feedforward_layernorm.weight",
            ]
    return names


def weight_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    h, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for name in weight_names(cfg):
        kind = name.rsplit(".", 2)[-2]
        if ".experts." in name:
            size = cfg.expert_size
            shapes[name] = (cfg.num_experts, *((h, size) if kind == "down_proj" else (size, h)))
            continue
        if ".shared_expert." in name:
            size = cfg.shared_expert_size
            shapes[name] = (h, size) if kind == "down_proj" else (size, h)
            continue
        shape = {
            "embed_tokens": (cfg.vocab_size, h),
            "lm_head": (cfg.vocab_size, h),
            "norm": (h,),
            "input_layernorm": (h,),
            "post_attention_layernorm": (h,),
            "post_self_attn_layernorm": (h,),
            "post_feedforward_layernorm": (h,),
            "q_norm": (cfg.num_heads * d,) if cfg.qk_norm_whole else (d,),
            "k_norm": (cfg.num_kv_heads * d,) if cfg.qk_norm_whole else (d,),
            "q_proj": (cfg.num_heads * d, h),
            "k_proj": (cfg.num_kv_heads * d, h),
            "v_proj": (cfg.num_kv_heads * d, h),
            "o_proj": (h, cfg.num_heads * d),
            "router": (cfg.num_experts, h),
            "selection": (cfg.num_experts,),
            "shared_expert_gate": (1, h),
            "gate_proj": (f, h),
            "up_proj": (f, h),
            "down_proj": (h, f),
        }[kind]
        shapes[name] = shape[:1] if name.endswith(".bias") else shape
    return shapes


def random_weights(cfg: LlamaConfig, seed: int = 0) -> dict[str, npt.NDArray[np.float32]]:
    """Random weights of the right shapes (for tests): scaled so activations stay O(1)."""
    rng = np.random.default_rng(seed)
    weights: dict[str, npt.NDArray[np.float32]] = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith(".bias"):
            value = 0.5 * rng.standard_normal(shape)
        elif len(shape) == 1:
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            value = rng.standard_normal(shape) / math.sqrt(shape[-1])
        weights[name] = value.astype(np.float32)
    return weights


def linear_weight_names(cfg: LlamaConfig) -> list[str]:
    """The projections' weights (what Q4_1 blocks can stand for)."""
    return [n for n in weight_names(cfg) if n.endswith(".weight") and ".experts." not in n
            and n.rsplit(".", 2)[-2].removesuffix("_proj") in LINEAR_KINDS]  # fmt: skip
