"""Phi-4-mini's and Mistral NeMo's GGUFs (examples/smollm), written here: GPT-4o's and
Tekken's pre-tokenizers (capitals, then small letters, as a word; digits in threes or
alone; Tekken's whole pieces and BOS), and RoPE over part of each head (Phi-4-mini's
`rope.dimension_count` below the head size, LongRoPE's factors over those dimensions),
its graph computed against the reference."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ggufwriter import BOS, byte_level_spec, pieces, read_back, write_gguf
from llama_reference import forward
from smollm import (
    CachedSeq,
    PagedCache,
    gguf_model,
    gguf_tokenizer,
    llama_onnx,
    llama_weights,
    session_for,
    tiny_config,
)

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")

TEXT = "camelCaseWord's HTTPServer 1234567 a/b/\nIT'S"


def test_gpt4o_splits_words_at_capitals_and_numbers_in_threes() -> None:
    tokenizer = gguf_tokenizer().build_tokenizer(byte_level_spec("gpt-4o"))
    assert pieces(tokenizer, TEXT) == [
        "camel", "Case", "Word's", "ĠHTTPServer", "Ġ", "123", "456", "7", "Ġa", "/b",
        "/Ċ", "IT'S",
    ]  # fmt: skip
    assert tokenizer.encode("ab").tokens == ["a", "b"]  # no BOS: a BPE kind's default
    # A combining mark stays with its letter (the model's own regex; llama.cpp's splits it).
    assert pieces(tokenizer, "Cafe\u0301s") == ["CafeÌģs"]


def test_tekken_splits_digits_alone_takes_whole_pieces_and_adds_bos() -> None:
    spec = byte_level_spec("tekken", ("a b",))
    spec.tokens.append("abc")
    spec.token_types.append(1)
    tokenizer = gguf_tokenizer().build_tokenizer(spec)
    assert pieces(tokenizer, TEXT) == [
        "camel", "Case", "Word", "'s", "ĠHTTPServer", "Ġ", "1", "2", "3", "4", "5", "6", "7",
        "Ġa", "/b", "/Ċ", "IT", "'S",
    ]  # fmt: skip
    # llama.cpp's `ignore_merges`: a piece the vocabulary holds whole is one token.
    assert tokenizer.encode("abc").tokens == [BOS, "abc"]
    assert tokenizer.encode("abc", add_special_tokens=False).tokens == ["abc"]


SHORT = (1.0, 2.0, 4.0, 8.0)


def phi4_gguf(path: Path, **fields: Any) -> Any:
    """A Phi-4-mini-shaped GGUF: Phi-3's architecture, heads of 16 rotated over their
    first 8 dimensions, LongRoPE's factors (4 of each) with its attention factor."""
    spec = byte_level_spec("gpt-4o", ("a b", "ab c"))
    cfg = tiny_config(vocab_size=len(spec.tokens), rope_dims=8, rope_freq_factors=SHORT,
                      rope_attention_factor=1.19, max_position_embeddings=128)  # fmt: skip
    factors = {
        "rope_factors_short.weight": np.asarray(SHORT, np.float32),
        "rope_factors_long.weight": np.asarray([3.0 * f for f in SHORT], np.float32),
    }
    extra = {"rope_scaling_attn_factors": 1.19, "rope_scaling_orig_ctx_len": 32} | fields
    write_gguf(path, cfg, spec, extra, "phi3", factors)
    return cfg


def test_a_phi4_mini_gguf_rotates_part_of_each_head(tmp_path: Path) -> None:
    """RoPE over the first `rope.dimension_count` dimensions of each head (rotate-half
    within them, LongRoPE's factors and magnitude on them alone), the rest as they are:
    prefill and the decode steps after it give the reference's logits (Hugging Face's
    partial rotary), not those of a RoPE over the whole head."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    cfg = phi4_gguf(tmp_path / "phi4.gguf")
    model = gguf_model().read_gguf(tmp_path / "phi4.gguf")
    assert (model.cfg.rope_dims, model.cfg.head_dim, model.cfg.rope_freq_factors) == (8, 16, SHORT)
    assert model.config_for(33).rope_freq_factors == (3.0, 6.0, 12.0, 24.0)
    assert model.tokenizer.pre == "gpt-4o"
    weights = llama_weights().random_weights(cfg, seed=3)
    cache = PagedCache(session_for(llama_onnx().build_step_graph(model.weights, model.cfg)),
                       model.cfg, 8, 4)  # fmt: skip
    ids, seq = [5, 17, 200, 33, 9, 45, 258], CachedSeq()
    got = [cache.step([seq], [ids])[0]]
    got += [cache.step([seq], [[token]])[0] for token in (71, 8)]
    want = forward(weights, model.cfg, [*ids, 71, 8], first=len(ids) - 1)
    np.testing.assert_allclose(np.stack(got), want, atol=1e-4, rtol=0)
    # The whole head rotated (its frequencies over 16 dimensions) is another model.
    whole = dataclasses.replace(model.cfg, rope_dims=None, rope_freq_factors=SHORT * 2)
    assert np.abs(got[0] - forward(weights, whole, ids)[-1]).max() > 1e-2


@pytest.mark.parametrize(
    ("arch", "count", "words"),
    [
        ("phi3", 7, "phi3.rope.dimension_count 7 is not the head size 16 or an even number"),
        ("phi3", 32, "phi3.rope.dimension_count 32 is not the head size 16 or an even number"),
        ("llama", 8, "llama.rope.dimension_count 8 is not the head size 16$"),
        ("qwen2", 8, "qwen2.rope.dimension_count 8 is not the head size 16$"),
    ],
    ids=["odd", "wider", "llama", "qwen2"],
)
def test_a_partial_rope_the_graph_cannot_compute_is_refused(
    tmp_path: Path, arch: str, count: int, words: str
) -> None:
    """llama.cpp computes a partial RoPE for Phi-3's and Gemma's architectures alone (the
    others assert the whole head); nor does Hugging Face's Qwen2 have one."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(vocab_size=len(spec.tokens))
    write_gguf(tmp_path / "r.gguf", cfg, spec, {"rope_dimension_count": count}, arch)
    with pytest.raises(ValueError, match=words):
        gguf_model().read_gguf(tmp_path / "r.gguf")


def test_a_mistral_nemo_gguf_reads_tekken_and_its_head_size(tmp_path: Path) -> None:
    """Mistral NeMo's: LLaMA's architecture (rows permuted) with heads wider than hidden /
    heads (`key_length`) and Tekken's vocabulary, which adds the BOS."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    spec = byte_level_spec("tekken", ("a b",))
    cfg = tiny_config(vocab_size=len(spec.tokens), head_size=32)
    write_gguf(tmp_path / "nemo.gguf", cfg, spec)
    model = read_back(tmp_path / "nemo.gguf", cfg)
    assert model.tokenizer.adds_bos
    weights = llama_weights().random_weights(cfg, seed=3)
    session = session_for(llama_onnx().build_step_graph(model.weights, model.cfg))
    ids = [0, 66, 258, 70, 12]
    got = PagedCache(session, model.cfg, 8, 4).step([CachedSeq()], [ids])[0]
    np.testing.assert_allclose(got, forward(weights, cfg, ids)[-1], atol=1e-4, rtol=0)


def test_a_ministral3_gguf_warms_its_queries_past_the_original_context(tmp_path: Path) -> None:
    """Ministral 3's: LLaMA's with YaRN (its log multiplier) and Llama 4's attention
    temperature, Q times 1 + s ln(1 + floor(position / original)): prefill past the
    original context (4 positions here) and decode steps after it give the reference's
    logits, not those without the temperature."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    spec = byte_level_spec("tekken", ("a b",))
    plain = tiny_config(vocab_size=len(spec.tokens), head_size=32)
    extra = {"rope_scaling_type": "yarn", "rope_scaling_factor": 4.0,
             "rope_scaling_orig_ctx_len": 4, "rope_scaling_yarn_log_mul": 1.0,
             "attn_temperature_scale": 0.5}  # fmt: skip
    write_gguf(tmp_path / "m3.gguf", plain, spec, extra, "mistral3")
    model = gguf_model().read_gguf(tmp_path / "m3.gguf")
    cfg = model.cfg
    assert (cfg.attention_temperature_scale, cfg.attention_temperature_length) == (0.5, 4)
    assert cfg.rope_attention_factor == pytest.approx(1.0)  # mscale / mscale_all_dim
    weights = llama_weights().random_weights(plain, seed=3)
    cache = PagedCache(session_for(llama_onnx().build_step_graph(model.weights, cfg)), cfg, 8, 4)
    ids, seq = [0, 66, 258, 70, 12, 5, 17, 200, 33, 9], CachedSeq()
    got = [cache.step([seq], [ids])[0]]
    got += [cache.step([seq], [[token]])[0] for token in (71, 8)]
    want = forward(weights, cfg, [*ids, 71, 8], first=len(ids) - 1)
    np.testing.assert_allclose(np.stack(got), want, atol=1e-4, rtol=0)
    cold = dataclasses.replace(cfg, attention_temperature_scale=0.0)
    assert np.abs(got[0] - forward(weights, cold, ids)[-1]).max() > 1e-2
