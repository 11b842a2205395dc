"""GGUF files for tests, written here: tokenizer specs of either kind (GPT-2's byte
symbols with merges, SentencePiece's pieces with scores) and random-weight GGUFs of the
architectures examples/smollm reads, with llama.cpp's tensor names and row orders."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from smollm import gguf_model, gguf_tokenizer, llama_weights

BOS, EOS = "<s>", "</s>"
SPACE = "\u2581"
# head_dim 16: Llama 3.1's shape of RoPE factors.
FACTORS = (1.0, 1.5, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0)


def byte_level_spec(pre: str, merges: tuple[str, ...] = (), **fields: Any) -> Any:
    """Two control tokens, then GPT-2's 256 byte symbols and the merges' results."""
    from tokenizers import pre_tokenizers

    tokens = [BOS, EOS, *sorted(pre_tokenizers.ByteLevel.alphabet())]
    tokens += ["".join(m.split(" ")) for m in merges]
    types = [3, 3] + [1] * (len(tokens) - 2)
    return gguf_tokenizer().TokenizerSpec(
        tokens=tokens, token_types=types, merges=list(merges), pre=pre, bos_token_id=0,
        eos_token_id=1, chat_template="", **fields,
    )  # fmt: skip


def pieces(tokenizer: Any, text: str) -> list[str]:
    return [piece for piece, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text)]


def spm_spec(scores: dict[str, float], **fields: Any) -> Any:
    """<unk>, <s>, </s>, the 256 byte tokens, then `scores`' pieces."""
    tokens = ["<unk>", BOS, EOS, *(f"<0x{b:02X}>" for b in range(256)), *scores]
    types = [2, 3, 3] + [6] * 256 + [1] * len(scores)
    return gguf_tokenizer().TokenizerSpec(
        tokens=tokens, token_types=types, merges=[], pre="default", bos_token_id=1,
        eos_token_id=2, chat_template="", model="llama",
        scores=[0.0] * 259 + list(scores.values()), **fields,
    )  # fmt: skip


def write_gguf(
    path: Path,
    cfg: Any,
    spec: Any,
    extra: dict[str, Any] | None = None,
    arch: str = "llama",
    tensors: dict[str, Any] | None = None,
    quant: str | Callable[[str], str] = "",
) -> None:
    """A GGUF of `arch` of random fp32 weights with `spec`'s tokenizer, `extra` fields
    (gguf's add_<field> name -> value) and `tensors`; a `rope_freqs` tensor where `cfg`
    has factors, Q, K and V biases where it has them; Phi-3's Q, K and V in one tensor,
    and its gate and up in another; with `quant` (Q8_0, Q4_0, or a function of the GGUF
    name giving one, or "" for fp32), the layers' matrices so."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    fields: dict[str, Any] = {
        "name": "random",
        "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size,
        "feed_forward_length": cfg.intermediate_size,
        "block_count": cfg.num_layers,
        "head_count": cfg.num_heads,
        "head_count_kv": cfg.num_kv_heads,
        "rope_freq_base": cfg.rope_theta,
        "layer_norm_rms_eps": cfg.rms_norm_eps,
        "tokenizer_model": spec.model,
        "tokenizer_pre": spec.pre,
        "token_list": spec.tokens,
        "token_types": spec.token_types,
        "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id,
        "chat_template": "{{ bos_token }}{{ messages[0]['content'] }}",
        "rope_dimension_count": cfg.rotary_dim,
    } | ({"key_length": cfg.head_dim, "value_length": cfg.head_dim} if cfg.head_size else {})
    if cfg.num_experts:  # a mixture's (llama_moe.py); the feed-forward length is its size
        fields |= {"expert_count": cfg.num_experts, "expert_used_count": cfg.experts_used,
                   "expert_feed_forward_length": cfg.expert_size,
                   "feed_forward_length": cfg.expert_size}  # fmt: skip
    if cfg.shared_expert_size:
        fields["expert_shared_feed_forward_length"] = cfg.shared_expert_size
    if arch == "ernie4_5-moe":  # its mixture every layer after the dense ones
        fields |= {"interleave_moe_layer_step": 1,
                   "leading_dense_block_count": len(cfg.dense_layers),
                   "feed_forward_length": cfg.intermediate_size}  # fmt: skip
    fields |= extra or {}  # fmt: skip
    if spec.scores is not None:
        fields["token_scores"] = spec.scores
    if spec.merges:
        fields["token_merges"] = spec.merges
    for field, value in fields.items():
        if field == "rope_scaling_type":
            value = gguf.RopeScalingType(value)
        getattr(writer, f"add_{field}")(value)
    model = gguf_model()
    weights = llama_weights().random_weights(cfg, seed=3)
    kinds: tuple[str, ...] = ("attn_q", "attn_k", "attn_v", "attn_output")
    mixture: tuple[str, ...] = ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
    mixture += ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp") * bool(cfg.shared_expert_size)
    mixture += ("ffn_gate_inp_shexp",) * cfg.shared_expert_gate
    dense = ("ffn_gate", "ffn_up", "ffn_down")
    kinds += ("attn_norm", "ffn_norm") if cfg.pre_norms else ()
    kinds += ("attn_q_norm", "attn_k_norm") if cfg.qk_norm else ()
    kinds += ("post_attention_norm", "post_ffw_norm") if cfg.sandwich_norms else ()
    names = ["token_embd.weight", "output_norm.weight"]
    names += [] if cfg.tie_word_embeddings else ["output.weight"]
    for i in range(cfg.num_layers):
        moe = cfg.num_experts and i not in cfg.dense_layers
        names += [f"blk.{i}.{kind}.weight" for kind in (*kinds, *(mixture if moe else dense))]
        names += [f"blk.{i}.exp_probs_b.bias"] * bool(moe and cfg.expert_selection_bias)
    if cfg.qkv_bias:
        names += [f"blk.{i}.attn_{c}.bias" for i in range(cfg.num_layers) for c in "qkv"]
    stored: dict[str, Any] = {}
    for name in names:
        value = weights[model._hf_name(name)]
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}.get(kind)
        if heads is not None and arch in model.PERMUTED:  # llama.cpp's row order, undone
            stored[name] = np.empty_like(value)
            stored[name][model.unpermute_order(value.shape[0], heads)] = value
        else:
            stored[name] = value
    for i in range(cfg.num_layers) if arch == "phi3" else ():
        parts = [stored.pop(f"blk.{i}.attn_{c}.weight") for c in "qkv"]
        stored[f"blk.{i}.attn_qkv.weight"] = np.concatenate(parts)
        parts = [stored.pop(f"blk.{i}.ffn_{c}.weight") for c in ("gate", "up")]
        stored[f"blk.{i}.ffn_up.weight"] = np.concatenate(parts)
    if cfg.rope_freq_factors is not None and arch != "phi3":
        stored["rope_freqs.weight"] = np.asarray(cfg.rope_freq_factors, np.float32)
    for name in stored:  # the converter keeps Hugging Face's [1, experts]
        if name.endswith("exp_probs_b.bias"):
            stored[name] = stored[name].reshape(1, -1)
    for name, value in (stored | (tensors or {})).items():
        kind = quant(name) if callable(quant) else quant
        quantized = value.ndim >= 2 and "gate_inp" not in name and not name.endswith(".bias")
        if kind and name.startswith("blk.") and quantized:
            stored_as = gguf.GGMLQuantizationType[kind]
            writer.add_tensor(name, gguf.quants.quantize(value, stored_as), raw_dtype=stored_as)
        else:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def read_back(path: Path, cfg: Any) -> Any:
    """The GGUF at `path` read, after checking that it holds `cfg` (its eps as the GGUF
    rounds it) and write_gguf's weights for it."""
    model = gguf_model().read_gguf(path)
    assert model.cfg == dataclasses.replace(cfg, rms_norm_eps=model.cfg.rms_norm_eps)
    for name, value in llama_weights().random_weights(cfg, seed=3).items():
        np.testing.assert_array_equal(model.weights[name], value, err_msg=name)
    return model
