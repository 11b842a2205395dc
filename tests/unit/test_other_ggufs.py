"""GGUFs beside SmolLM2's (examples/smollm: gguf_tokenizer.py, gguf_model.py, build.py),
written here: the tokenizers of Llama 3 (its pre-tokenizer, whole pieces, BOS), DeepSeek
and SentencePiece (scores as merges, `▁`, byte fallback, the space before a text and
after a special token), read and built; Llama 3.1's RoPE factors and a linear scaling;
Qwen2's biases; the long-context default; build.py's errors; the engine's detokenizer
giving an answer's first space as vLLM and llama.cpp do; Qwen3's head norms, Gemma's,
Gemma 2's and Gemma 3's options, Phi-3's fused tensors, LongRoPE and special tokens;
constants streamed to model.onnx.data; and --low-memory's graph on the blocks."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from ggufwriter import (
    BOS,
    EOS,
    FACTORS,
    SPACE,
    byte_level_spec,
    pieces,
    read_back,
    spm_spec,
    write_gguf,
)
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

from ge_serve.backends.llm.text import Detokenizer, Tokenizer

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")


def test_llama3_pieces_split_numbers_in_threes_and_contractions_in_any_case() -> None:
    build = gguf_tokenizer().build_tokenizer
    text = "I'VE got 1234567 apples\n\n  ok"
    assert pieces(build(byte_level_spec("llama-bpe")), text) == [
        "I", "'VE", "Ġgot", "Ġ", "123", "456", "7", "Ġapples", "ĊĊ", "Ġ", "Ġok",
    ]  # fmt: skip
    # SmolLM's kind (GPT-2's regex, every digit alone) on the same text.
    assert pieces(build(byte_level_spec("smollm")), text) == [
        "I", "'", "VE", "Ġgot", "Ġ", "1", "2", "3", "4", "5", "6", "7", "Ġapples", "ĊĊĠ",
        "Ġok",
    ]  # fmt: skip


def test_llama3_takes_a_piece_the_vocabulary_holds_whole_and_adds_bos() -> None:
    # "abc" is a token no merge makes: llama.cpp's Llama 3 kinds take a whole piece as
    # it is; GPT-2's kinds merge what the merges allow.
    llama3 = byte_level_spec("llama-bpe", ("a b",))
    llama3.tokens.append("abc")
    llama3.token_types.append(1)
    whole = gguf_tokenizer().build_tokenizer(llama3)
    assert whole.encode("abc").tokens == [BOS, "abc"]
    assert whole.encode("abc", add_special_tokens=False).tokens == ["abc"]
    assert whole.decode(whole.encode("abc").ids) == "abc"
    gpt2 = gguf_tokenizer().build_tokenizer(dataclasses.replace(llama3, pre="gpt2"))
    assert gpt2.encode("abc").tokens == ["ab", "c"]  # no BOS either: GPT-2's default
    told = dataclasses.replace(llama3, add_bos_token=False)
    assert gguf_tokenizer().build_tokenizer(told).encode("abc").tokens == ["abc"]


def test_a_gguf_naming_no_pre_tokenizer_gets_llama_cpps_default_set() -> None:
    tokenizer = gguf_tokenizer().build_tokenizer(byte_level_spec("default"))
    assert pieces(tokenizer, "3333333 and 12345 apples") == [
        "333", "333", "3", "Ġand", "Ġ", "123", "45", "Ġapples",
    ]  # fmt: skip


def test_deepseeks_user_defined_letters_decode_as_text() -> None:
    """DeepSeek's vocabularies hold `ü` and 12 more letters as user-defined tokens, as
    text; their characters are also GPT-2's byte symbols for bytes no UTF-8 text has. The
    text matches the token, and decodes as the letter (not the byte's U+FFFD)."""
    spec = byte_level_spec("deepseek-coder")
    spec.tokens.append("ü")
    spec.token_types.append(4)
    tokenizer = gguf_tokenizer().build_tokenizer(spec)
    ids = tokenizer.encode("Grüße ü").ids
    assert ids.count(len(spec.tokens) - 1) == 2
    assert tokenizer.decode(ids) == "Grüße ü"
    # A user-defined letter of a byte UTF-8 does use (é, 0xE9, leads 道) is left as the
    # byte-level decoder reads it: spelled out, it would rewrite 道's first byte too.
    lone = byte_level_spec("deepseek-coder", ("é ģ", "éģ ĵ"))
    lone.tokens.append("é")
    lone.token_types.append(4)
    assert (
        gguf_tokenizer()
        .build_tokenizer(lone)
        .decode(gguf_tokenizer().build_tokenizer(lone).encode("道").ids)
        == "道"
    )


def test_an_end_token_the_gguf_types_normal_is_one_control_token() -> None:
    """As llama.cpp makes it: `<|eot_id|>` in a vocabulary that types it normal is one
    token (matched in the text, skipped when decoding), and ends generation."""
    from smollm import build_module

    spec = byte_level_spec("qwen2")
    spec.tokens.append("<|eot_id|>")
    spec.token_types.append(1)
    tokenizer = gguf_tokenizer().build_tokenizer(spec)
    end = len(spec.tokens) - 1
    assert tokenizer.encode("a<|eot_id|>").ids == [spec.tokens.index("a"), end]
    assert tokenizer.decode([spec.tokens.index("a"), end]) == "a"
    assert build_module().eos_token_ids(spec) == [1, end]


def test_an_unknown_pre_tokenizer_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="pre-tokenizer 'kimi-k2' is not supported"):
        gguf_tokenizer().build_tokenizer(byte_level_spec("kimi-k2"))


def test_sentencepiece_merges_the_pair_whose_union_scores_highest() -> None:
    pieces = {SPACE: -1.0, "a": -2.0, "b": -3.0, "c": -4.0, "ab": -5.0, "bc": -6.0}
    build = gguf_tokenizer().build_tokenizer
    # "bc" and "ab" compete for the b of "abc": the higher score takes it.
    assert build(spm_spec(pieces)).encode("abc").tokens == [BOS, SPACE, "ab", "c"]
    flipped = pieces | {"ab": -6.0, "bc": -5.0}
    assert build(spm_spec(flipped)).encode("abc").tokens == [BOS, SPACE, "a", "bc"]
    # Merged on: "▁ab" once "ab" is made.
    longer = build(spm_spec(pieces | {f"{SPACE}ab": -7.0}))
    assert longer.encode("abc ab").tokens == [BOS, f"{SPACE}ab", "c", f"{SPACE}ab"]


def test_sentencepiece_bytes_spaces_and_special_tokens() -> None:
    tokenizer = gguf_tokenizer().build_tokenizer(
        spm_spec({SPACE: -1.0, "a": -2.0, "b": -3.0, "ab": -4.0, f"{SPACE}ab": -5.0})
    )
    # A character the vocabulary lacks is its UTF-8 bytes; a space is ▁, one before the
    # text and one after each special token (llama.cpp's fragments).
    encoded = tokenizer.encode(f"ab é{EOS}ab", add_special_tokens=False)
    assert encoded.tokens == [
        f"{SPACE}ab", SPACE, "<0xC3>", "<0xA9>", EOS, f"{SPACE}ab",
    ]  # fmt: skip
    assert tokenizer.decode(encoded.ids) == "ab é ab"
    assert tokenizer.decode(encoded.ids, skip_special_tokens=False) == f"ab é{EOS} ab"
    without = gguf_tokenizer().build_tokenizer(
        spm_spec({SPACE: -1.0, "a": -2.0, "b": -3.0, "ab": -4.0}, add_space_prefix=False)
    )
    assert without.encode("ab").tokens == [BOS, "ab"]


def test_an_answers_first_space_is_kept_after_the_prompt(tmp_path: Path) -> None:
    """SentencePiece's decoder strips a text's leading space; the detokenizer decodes the
    answer after the prompt's last tokens, so the answer "▁ab ▁ab" reads " ab ab" (vLLM's
    and llama.cpp's text), not "ab ab"."""
    built = gguf_tokenizer().build_tokenizer(
        spm_spec({SPACE: -1.0, "a": -2.0, "b": -3.0, "ab": -4.0, f"{SPACE}ab": -5.0})
    )
    built.save(str(tmp_path / "tokenizer.json"))
    tokenizer = Tokenizer(tmp_path / "tokenizer.json")
    prompt = tokenizer.encode("ab")
    answer = tokenizer.encode("ab ab", add_special_tokens=False)
    detokenizer = Detokenizer(tokenizer, True, prompt)
    deltas = [detokenizer.add(token) for token in answer]
    assert deltas == [" ab", " ab"]
    assert "".join(deltas) + detokenizer.flush() == " ab ab"
    assert [Detokenizer(tokenizer).add(answer[0])] == ["ab"]  # no prompt: stripped


def test_a_sentencepiece_gguf_with_rope_factors_reads_builds_and_computes(
    tmp_path: Path,
) -> None:
    """Llama 2's tokenizer kind and Llama 3.1's `rope_freqs`: the folder's tokenizer adds
    the BOS, and its graph's logits are the reference's with each frequency divided by
    its factor (not those without: the factors are felt)."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import build_module

    spec = spm_spec({SPACE: -1.0, "a": -2.0, "b": -3.0, "ab": -4.0})
    cfg = tiny_config(vocab_size=len(spec.tokens), rope_freq_factors=FACTORS)
    write_gguf(tmp_path / "l.gguf", cfg, spec)
    model = read_back(tmp_path / "l.gguf", cfg)
    assert model.tokenizer.model == "llama" and model.tokenizer.adds_bos
    weights = llama_weights().random_weights(cfg, seed=3)
    folder = build_module().build(tmp_path, "m", 64, gguf=tmp_path / "l.gguf")
    tokenizer = Tokenizer(folder / "1" / "tokenizer.json")
    assert tokenizer.encode("ab") == [1, 259, 262]  # <s> ▁ ab (ids 259 on: ▁ a b ab)
    session = session_for(llama_onnx().build_step_graph(model.weights, model.cfg))
    ids = [1, 259, 262, 260, 261, 262, 259, 262, 261]
    got = PagedCache(session, model.cfg, 8, 4).step([CachedSeq()], [ids])[0]
    np.testing.assert_allclose(got, forward(weights, model.cfg, ids)[-1], atol=1e-4, rtol=0)
    plain = dataclasses.replace(model.cfg, rope_freq_factors=None)
    assert np.abs(got - forward(weights, plain, ids)[-1]).max() > 1e-2


def test_linear_rope_scaling_is_a_factor_for_every_frequency(tmp_path: Path) -> None:
    """... and a GGUF without a chat template builds a folder without one (chat then
    says the model has none)."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import build_module

    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(vocab_size=len(spec.tokens))
    extra = {"rope_scaling_type": "linear", "rope_scaling_factor": 4.0, "chat_template": ""}
    write_gguf(tmp_path / "linear.gguf", cfg, spec, extra)
    model = gguf_model().read_gguf(tmp_path / "linear.gguf")
    assert model.cfg.rope_freq_factors == (4.0,) * (cfg.head_dim // 2)
    folder = build_module().build(tmp_path, "m", 64, gguf=tmp_path / "linear.gguf")
    assert "chat_template" not in (folder / "config.pbtxt").read_text()
    assert not (folder / "1" / "chat_template.jinja").exists()


def test_build_py_says_what_the_gguf_holds_that_is_not_served(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import build_module

    spec = byte_level_spec("kimi-k2")
    write_gguf(tmp_path / "t.gguf", tiny_config(vocab_size=len(spec.tokens)), spec)
    argv = ["--gguf", str(tmp_path / "t.gguf"), "--out", str(tmp_path)]
    assert build_module().main(argv) == 2
    assert capsys.readouterr().err.startswith("build.py: pre-tokenizer 'kimi-k2' is not")


def test_a_long_context_is_cut_to_the_default_pool_unless_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Llama 3.1's GGUFs say 131,072 positions, which the engine's default KV pool (8,192
    tokens) cannot hold: the folder takes 8,192 unless --max-model-len asks for more, and
    then the KV blocks one sequence that long needs."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import build_module

    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(vocab_size=len(spec.tokens), max_position_embeddings=16384)
    write_gguf(tmp_path / "long.gguf", cfg, spec)
    build = build_module().build
    cut = build(tmp_path, "cut", gguf=tmp_path / "long.gguf").joinpath("config.pbtxt")
    assert 'key: "max_model_len" value: { string_value: "8192" }' in cut.read_text()
    assert "kv_cache_blocks" not in cut.read_text()
    assert "max_model_len 8192 of the GGUF's 16384 positions" in capsys.readouterr().err
    asked = build(tmp_path, "asked", 10000, gguf=tmp_path / "long.gguf") / "config.pbtxt"
    assert 'key: "kv_cache_blocks" value: { string_value: "625" }' in asked.read_text()
    # The graph's RoPE tables hold max_model_len positions, as its metadata says.
    graph = onnx.load(str(asked.parent / "1" / "model.onnx"))
    assert {p.key: p.value for p in graph.metadata_props} == {"max_positions": "10000"}
    # A length the GGUF cannot take is refused before anything is built.
    for length in ("0", "16385"):
        argv = ["--gguf", str(tmp_path / "long.gguf"), "--out", str(tmp_path), "--name", "no",
                "--max-model-len", length]  # fmt: skip
        assert build_module().main(argv) == 2
        assert f"max_model_len {length} is not between 2 and the model's 16384" in (
            capsys.readouterr().err
        )
        assert not (tmp_path / "no").exists()


def test_a_qwen2_gguf_reads_its_biases_and_rows_as_stored(tmp_path: Path) -> None:
    """Qwen2's architecture: LLaMA's with biases on Q, K and V, its keys under `qwen2.`,
    and its Q and K rows as Hugging Face keeps them (llama.cpp's converter permutes only
    LLaMA's). The graph's logits are the reference's with the biases (not without)."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    spec = byte_level_spec("qwen2")
    cfg = tiny_config(vocab_size=len(spec.tokens), qkv_bias=True)
    write_gguf(tmp_path / "q.gguf", cfg, spec, arch="qwen2")
    model = read_back(tmp_path / "q.gguf", cfg)
    assert model.cfg.qkv_bias and not model.tokenizer.adds_bos
    weights = llama_weights().random_weights(cfg, seed=3)
    assert sorted(model.weights) == sorted(weights)
    session = session_for(llama_onnx().build_step_graph(model.weights, model.cfg))
    ids = [5, 17, 200, 33, 9, 45]
    got = PagedCache(session, model.cfg, 8, 4).step([CachedSeq()], [ids])[0]
    np.testing.assert_allclose(got, forward(weights, model.cfg, ids)[-1], atol=1e-4, rtol=0)
    plain = dataclasses.replace(model.cfg, qkv_bias=False)
    assert np.abs(got - forward(weights, plain, ids)[-1]).max() > 1e-2


def test_a_qwen3_gguf_norms_each_q_and_k_head_and_has_its_own_head_size(
    tmp_path: Path,
) -> None:
    """Qwen3's architecture: LLaMA's with an RMSNorm over each Q and K head before RoPE
    (weights of their own) and a head size (`key_length`) that is not hidden / heads:
    Qwen3-0.6B has 16 heads of 128 over 1,024. Prefill and the decode steps after it
    (the cache holds the wider heads) give the reference's logits, not those without
    the norms."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    spec = byte_level_spec("qwen2")
    cfg = tiny_config(vocab_size=len(spec.tokens), head_size=32, qk_norm=True)
    write_gguf(tmp_path / "q3.gguf", cfg, spec, arch="qwen3")
    model = read_back(tmp_path / "q3.gguf", cfg)
    assert (model.cfg.head_size, model.cfg.qk_norm, cfg.hidden_size) == (32, True, 64)
    weights = llama_weights().random_weights(cfg, seed=3)
    assert sorted(model.weights) == sorted(weights)
    cache = PagedCache(session_for(llama_onnx().build_step_graph(model.weights, cfg)), cfg, 8, 4)
    ids, seq = [5, 17, 200, 33, 9, 45], CachedSeq()
    got = [cache.step([seq], [ids])[0]]
    got += [cache.step([seq], [[token]])[0] for token in (71, 8)]
    want = forward(weights, cfg, [*ids, 71, 8], first=len(ids) - 1)
    np.testing.assert_allclose(np.stack(got), want, atol=1e-4, rtol=0)
    plain = dataclasses.replace(cfg, qk_norm=False)
    assert np.abs(got[0] - forward(weights, plain, ids)[-1]).max() > 1e-2


def test_a_gemma3_gguf_computes_its_local_layers_and_sandwich_norms(tmp_path: Path) -> None:
    """Gemma 3's architecture: scaled embeddings, a GELU gate, Qwen3's head norms, a norm
    after attention and after the MLP, and local layers (all but every sixth, by llama.cpp's
    default) whose queries see only the last `sliding_window` positions, with a RoPE of
    their own base. A prompt three times the window, in two chunks, then decode steps:
    the reference's logits each time, and not those of a model without the window."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(
        vocab_size=len(spec.tokens), num_layers=7, head_size=32, qk_norm=True,
        scale_embeddings=True, gelu=True, sandwich_norms=True, sliding_window=4,
        sliding_layers=(0, 1, 2, 3, 4, 6), sliding_rope_theta=100.0, rope_theta=1e6,
    )  # fmt: skip
    extra = {"sliding_window": 4, "rope_freq_base_swa": 100.0}
    write_gguf(tmp_path / "g3.gguf", cfg, spec, extra, arch="gemma3")
    model = gguf_model().read_gguf(tmp_path / "g3.gguf")
    assert model.cfg == dataclasses.replace(cfg, rms_norm_eps=model.cfg.rms_norm_eps)
    weights = llama_weights().random_weights(cfg, seed=3)
    cache = PagedCache(session_for(llama_onnx().build_step_graph(model.weights, cfg)), cfg, 8, 4)
    ids, seq = [5, 17, 200, 33, 9, 45, 12, 99, 140, 7, 61, 3], CachedSeq()
    got = [cache.step([seq], [ids[:5]])[0], cache.step([seq], [ids[5:]])[0]]
    got += [cache.step([seq], [[token]])[0] for token in (71, 8)]
    want = forward(weights, cfg, [*ids, 71, 8], first=len(ids) - 1)
    np.testing.assert_allclose(np.stack(got[1:]), want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(got[0], forward(weights, cfg, ids[:5])[-1], atol=1e-4, rtol=0)
    wide = dataclasses.replace(cfg, sliding_window=1000)
    assert np.abs(got[1] - forward(weights, wide, ids)[-1]).max() > 1e-2
    # A Q scale of its own (the 27B's) goes into Q's norm as 1/sqrt(head_dim) does.
    scaled = dataclasses.replace(cfg, attention_scale=0.3)
    session = session_for(llama_onnx().build_step_graph(weights, scaled))
    got_scaled = PagedCache(session, scaled, 8, 4).step([CachedSeq()], [ids])[0]
    want_scaled = forward(weights, scaled, ids)[-1]
    np.testing.assert_allclose(got_scaled, want_scaled, atol=1e-4, rtol=0)
    assert np.abs(got_scaled - forward(weights, cfg, ids)[-1]).max() > 1e-2
    # The one-token steps on Q4_0 blocks (the If's other branch) keep the window too.
    from smollm import quantized_weights

    rounded, blocks = quantized_weights(cfg, weights, lambda name: "Q4_0")
    graph = llama_onnx().build_step_graph(rounded, cfg, blocks)
    cache, seq = PagedCache(session_for(graph), cfg, 8, 4), CachedSeq()
    got = [cache.step([seq], [ids])[0]] + [cache.step([seq], [[t]])[0] for t in (71, 8)]
    want = forward(rounded, cfg, [*ids, 71, 8], first=len(ids) - 1)
    np.testing.assert_allclose(np.stack(got), want, atol=1e-3, rtol=0)


def test_gemma3_reads_the_local_layers_as_llama_cpp_does(tmp_path: Path) -> None:
    """No sliding_window: no local layers; a period of 3; a list of flags. And the
    softcapping Gemma 2 needs is refused by name."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(vocab_size=len(spec.tokens), num_layers=4, head_size=32, qk_norm=True,
                      sandwich_norms=True)  # fmt: skip
    read = gguf_model().read_gguf
    cases: list[tuple[dict[str, Any], tuple[int, ...]]] = [
        ({}, ()),
        ({"sliding_window": 8, "sliding_window_pattern": 3}, (0, 1, 3)),
        ({"sliding_window": 8, "sliding_window_pattern": [False, True, True, False]}, (1, 2)),
    ]  # fmt: skip
    for n, (extra, layers) in enumerate(cases):
        write_gguf(tmp_path / f"{n}.gguf", cfg, spec, extra, arch="gemma3")
        got = read(tmp_path / f"{n}.gguf").cfg
        assert (got.sliding_layers, got.scale_embeddings, got.gelu) == (layers, True, True)
        assert got.sliding_window == (8 if layers else 0)
    # llama.cpp's rule for Gemma 3 27B (62 layers): Q scaled by hidden/heads (64/4).
    deep = dataclasses.replace(cfg, num_layers=62)
    write_gguf(tmp_path / "27b.gguf", deep, spec, arch="gemma3")
    assert read(tmp_path / "27b.gguf").cfg.attention_scale == 0.25
    write_gguf(tmp_path / "cap.gguf", cfg, spec, {"final_logit_softcapping": 30.0}, "gemma3")
    with pytest.raises(ValueError, match="logit softcapping is not supported for gemma3"):
        read(tmp_path / "cap.gguf")
    # Gemma (the first): scaled embeddings and GELU alone; its window key is not read.
    plain = dataclasses.replace(cfg, qk_norm=False, sandwich_norms=False)
    write_gguf(tmp_path / "g.gguf", plain, spec, {"sliding_window": 8}, arch="gemma")
    got = read(tmp_path / "g.gguf").cfg
    assert got == dataclasses.replace(plain, scale_embeddings=True, gelu=True,
                                      rms_norm_eps=got.rms_norm_eps)  # fmt: skip


def test_a_phi3_gguf_splits_its_fused_projections_and_takes_longrope(tmp_path: Path) -> None:
    """Phi-3's architecture: Q, K and V in one `attn_qkv`, the gate and up projections in
    one `ffn_up` (the gate's rows first), and LongRoPE: the short factors within the
    original context, the long ones past it (as llama.cpp chooses by its context size),
    cos and sin times the GGUF's attention factor. The graph's logits are the
    reference's; build.py writes the long factors for a longer max_model_len."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    import json

    from smollm import build_module

    spec = spm_spec({SPACE: -1.0, "a": -2.0, "b": -3.0, "ab": -4.0})
    short, long = FACTORS, tuple(2.0 * f for f in FACTORS)
    cfg = tiny_config(vocab_size=len(spec.tokens), rope_freq_factors=short,
                      rope_attention_factor=1.19, max_position_embeddings=128)  # fmt: skip
    factors = {
        "rope_factors_short.weight": np.asarray(short, np.float32),
        "rope_factors_long.weight": np.asarray(long, np.float32),
    }
    extra = {"rope_scaling_attn_factors": 1.19, "rope_scaling_orig_ctx_len": 32}
    write_gguf(tmp_path / "phi.gguf", cfg, spec, extra, "phi3", factors)
    model = gguf_model().read_gguf(tmp_path / "phi.gguf")
    assert model.cfg == dataclasses.replace(
        cfg,
        rms_norm_eps=model.cfg.rms_norm_eps,
        rope_attention_factor=model.cfg.rope_attention_factor,
    )
    assert model.cfg.rope_attention_factor == pytest.approx(1.19)
    assert model.config_for(32).rope_freq_factors == short
    assert model.config_for(33).rope_freq_factors == long
    weights = llama_weights().random_weights(cfg, seed=3)
    assert sorted(model.weights) == sorted(weights)
    for name, value in weights.items():
        np.testing.assert_array_equal(model.weights[name], value, err_msg=name)
    ids = [1, 259, 262, 260, 261, 262, 259, 262, 261]
    session = session_for(llama_onnx().build_step_graph(model.weights, model.cfg))
    got = PagedCache(session, model.cfg, 8, 4).step([CachedSeq()], [ids])[0]
    np.testing.assert_allclose(got, forward(weights, model.cfg, ids)[-1], atol=1e-4, rtol=0)
    plain = dataclasses.replace(model.cfg, rope_attention_factor=1.0)
    assert np.abs(got - forward(weights, plain, ids)[-1]).max() > 1e-2
    folder = build_module().build(tmp_path, "m", 64, gguf=tmp_path / "phi.gguf")
    written = json.loads((folder / "1" / "generation.json").read_text())["config"]
    assert written["rope_freq_factors"] == list(long)
    # ... and its graph computes with them.
    built = PagedCache(session_for(folder / "1" / "model.onnx"), model.cfg, 8, 4)
    got_long = built.step([CachedSeq()], [ids])[0]
    longer = model.config_for(64)
    np.testing.assert_allclose(got_long, forward(weights, longer, ids)[-1], atol=1e-4, rtol=0)
    # Quantized, the fused tensors' blocks split as their rows do.
    write_gguf(tmp_path / "q8.gguf", cfg, spec, extra, "phi3", factors, quant="Q8_0")
    q8 = gguf_model().read_gguf(tmp_path / "q8.gguf")
    assert sorted(q8.blocks) == sorted(llama_weights().linear_weight_names(cfg))
    for name, found in q8.blocks.items():
        np.testing.assert_array_equal(found.dequantize(), q8.weights[name], err_msg=name)
        np.testing.assert_allclose(q8.weights[name], weights[name], atol=0.02, err_msg=name)


def test_phi3_drops_the_whitespace_after_its_special_tokens(tmp_path: Path) -> None:
    """llama.cpp's rule for a model named Phi-3 (its tokenizer.json's `rstrip`): the
    whitespace after a special token goes, but not after <s>, <unk> or <|endoftext|>."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    import gguf

    plain_spec = spm_spec({SPACE: -1.0, "a": -2.0})
    cfg = tiny_config(vocab_size=len(plain_spec.tokens))
    for name, rule in (("Phi 3 random", False), ("Phi-3 mini", True), ("phi3", True)):
        write_gguf(tmp_path / "n.gguf", cfg, plain_spec, {"name": name}, "phi3")
        read = gguf_tokenizer().read_spec(gguf.GGUFReader(str(tmp_path / "n.gguf")))
        assert read.rstrip_special is rule, name
    spec = spm_spec({SPACE: -1.0, "a": -2.0, "b": -3.0, "ab": -4.0}, rstrip_special=True)
    spec.tokens.append("<|user|>")
    spec.token_types.append(3)
    tokenizer = gguf_tokenizer().build_tokenizer(spec)
    user, space, ab = (spec.tokens.index(t) for t in ("<|user|>", SPACE, "ab"))
    # The ▁ after a special token (llama.cpp's fragments) stays: "ab" is a text of its own.
    assert tokenizer.encode("<|user|>\n ab", add_special_tokens=False).ids == [user, space, ab]
    assert tokenizer.encode(f"{BOS} ab", add_special_tokens=False).ids == [1, space, space, ab]
    plain = gguf_tokenizer().build_tokenizer(dataclasses.replace(spec, rstrip_special=False))
    assert len(plain.encode("<|user|>\n ab", add_special_tokens=False).ids) > 3


def test_a_large_model_writes_its_constants_as_the_graph_is_built(tmp_path: Path) -> None:
    """Past half the inline limit (2 GB; 0 here) build.py streams the graph's constants to
    model.onnx.data as it makes them, so the weights are held once: the folder serves
    what the inline build serves, bit for bit (prefill, and one-token steps on int8
    activations and Q8_0 blocks), at page-aligned offsets onnxruntime can map. Building
    inline into the same folder afterwards leaves no data file behind, and back again."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    import onnx
    import onnxruntime as ort
    from smollm import build_module

    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(vocab_size=len(spec.tokens))
    write_gguf(tmp_path / "q8.gguf", cfg, spec, quant="Q8_0")
    build = build_module().build
    folders = [
        build(tmp_path / kind, "m", 64, gguf=tmp_path / "q8.gguf", int8_activations=True,
              inline_limit=limit) / "1"
        for kind, limit in (("inline", 2**31), ("streamed", 0))
    ]  # fmt: skip
    inline, streamed = folders
    assert not (inline / "model.onnx.data").exists()
    graph = onnx.load(str(streamed / "model.onnx"), load_external_data=False)
    offsets = [
        int(entry.value)
        for tensor in graph.graph.initializer
        for entry in tensor.external_data
        if entry.key == "offset"
    ]
    assert len(offsets) > 10 and all(offset % 4096 == 0 for offset in offsets)
    assert (streamed / "model.onnx").stat().st_size < 64 * 1024
    runs = []
    for folder in folders:
        cache, seq = (
            PagedCache(ort.InferenceSession(str(folder / "model.onnx")), cfg, 8, 4),
            CachedSeq(),
        )
        runs.append([cache.step([seq], [[5, 17, 200]]), cache.step([seq], [[9]])])
    np.testing.assert_array_equal(np.stack(runs[0]), np.stack(runs[1]))
    again = build(tmp_path / "streamed", "m", 64, gguf=tmp_path / "q8.gguf") / "1"
    assert not (again / "model.onnx.data").exists()
    # A link standing where the data goes is replaced, not written through.
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"kept")
    (again / "model.onnx.data").symlink_to(outside)
    build(tmp_path / "streamed", "m", 64, gguf=tmp_path / "q8.gguf", inline_limit=0)
    assert outside.read_bytes() == b"kept"
    assert not (again / "model.onnx.data").is_symlink()
    # A build that fails leaves the folder as it was, and no partial data file.
    model = gguf_model().read_gguf(tmp_path / "q8.gguf")
    lacking = dict(model.weights)
    del lacking["model.norm.weight"]
    with pytest.raises(ValueError, match="weights lack"):
        build(tmp_path / "streamed", "m", 64, model=dataclasses.replace(model, weights=lacking),
              inline_limit=0)  # fmt: skip
    assert sorted(p.name for p in again.iterdir()) == [
        "chat_template.jinja", "generation.json", "model.onnx", "model.onnx.data",
        "tokenizer.json",
    ]  # fmt: skip
    ort.InferenceSession(str(again / "model.onnx"))


def test_low_memory_computes_every_step_on_the_blocks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--low-memory: the projections the GGUF stores as blocks are read as blocks alone
    (dequantized only when asked for), and the graph computes every step on them, with no
    If and no fp32 copy: a one-token step gives what the usual build's blocks give, bit
    for bit, and a prompt what the fp32 weights give, up to rounding."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    import onnx
    import onnxruntime as ort
    from smollm import build_module

    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(vocab_size=len(spec.tokens))
    write_gguf(tmp_path / "q4.gguf", cfg, spec, quant="Q4_0")
    full = gguf_model().read_gguf(tmp_path / "q4.gguf")
    lean = gguf_model().read_gguf(tmp_path / "q4.gguf", fp32_projections=False)
    assert sorted(lean.weights) == sorted(full.weights) and len(lean.weights) == len(full.weights)
    for name, value in full.weights.items():
        np.testing.assert_array_equal(lean.weights[name], value, err_msg=name)
    # The low-memory graph asks for no projection's fp32 weights (its blocks serve them
    # all), so no fp32 copy of them is ever made.
    with pytest.MonkeyPatch.context() as patch:
        for found in lean.blocks.values():
            patch.setattr(type(found), "dequantize", lambda _: pytest.fail("dequantized"))
        assert all(name in lean.weights for name in lean.blocks)
        llama_onnx().build_step_graph(lean.weights, cfg, lean.blocks, blocks_only=True)
    build = build_module().build
    folders = [
        build(tmp_path / "usual", "m", 64, gguf=tmp_path / "q4.gguf") / "1",
        build(tmp_path / "lean", "m", 64, gguf=tmp_path / "q4.gguf", low_memory=True) / "1",
    ]
    usual, low = (onnx.load(str(folder / "model.onnx")) for folder in folders)
    assert "If" in {n.op_type for n in usual.graph.node}
    assert "If" not in {n.op_type for n in low.graph.node}
    assert low.ByteSize() < usual.ByteSize() / 2
    runs = []
    for folder in folders:
        session = ort.InferenceSession(str(folder / "model.onnx"))
        cache, seq = PagedCache(session, cfg, 8, 4), CachedSeq()
        runs.append([cache.step([seq], [[5, 17, 200, 33]])[0], cache.step([seq], [[9]])[0]])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    want = forward(full.weights, cfg, [5, 17, 200, 33])[-1]
    np.testing.assert_allclose(runs[1][0], want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(runs[0][0], want, atol=1e-4, rtol=0)
    # --fp32-only keeps no blocks to compute on.
    argv = ["--gguf", str(tmp_path / "q4.gguf"), "--out", str(tmp_path), "--fp32-only"]
    with pytest.raises(SystemExit) as refused:
        build_module().main([*argv, "--low-memory"])
    assert refused.value.code == 2
    assert "--low-memory take the GGUF's blocks" in capsys.readouterr().err


def test_low_memory_keeps_fp32_only_the_parts_no_kernel_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GGUF that mixes types (Q4_0 Q and K, Q8_0 V, as Q4_K_M's Q6_K V): without int8
    activations no kernel takes V, which --low-memory computes on fp32 alone, Q and K
    staying on their blocks (no fp32 copy of the projection whole), and says so."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    import onnx
    from smollm import build_module

    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(vocab_size=len(spec.tokens))
    write_gguf(tmp_path / "mix.gguf", cfg, spec,
               quant=lambda name: "Q8_0" if ".attn_v." in name else "Q4_0")  # fmt: skip
    folder = build_module().build(tmp_path, "m", 64, gguf=tmp_path / "mix.gguf",
                                  low_memory=True) / "1"  # fmt: skip
    assert "2 of the 14 projections have no blocks a kernel takes" in capsys.readouterr().err
    graph = onnx.load(str(folder / "model.onnx"))
    fp32 = {t.name for t in graph.graph.initializer if t.name.endswith(".weight_t")}
    assert fp32 == {f"model.layers.{i}.qkv.1.weight_t" for i in range(cfg.num_layers)}
    full = gguf_model().read_gguf(tmp_path / "mix.gguf")
    ids = [5, 17, 200, 33]
    got = PagedCache(session_for(folder / "model.onnx"), cfg, 8, 4).step([CachedSeq()], [ids])[0]
    np.testing.assert_allclose(got, forward(full.weights, cfg, ids)[-1], atol=1e-4, rtol=0)


def test_a_gemma2_gguf_caps_its_scores_and_logits(tmp_path: Path) -> None:
    """Gemma 2's architecture: Gemma's, the norms after attention and the MLP, every other
    layer local (a 4,096-position window where the GGUF says none, as llama.cpp takes it;
    the global RoPE base), and soft caps c * tanh(x / c) on the scaled scores and on the
    logits. The graph's logits are the reference's (not those without the caps), and the
    prompt's log probabilities read the logits' cap off the graph with the head."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import build_module

    from ge_serve.backends.llm.prompt_logprobs import LmHead

    spec = byte_level_spec("llama-bpe")
    plain = tiny_config(vocab_size=len(spec.tokens), num_layers=3, head_size=32,
                        sandwich_norms=True, rope_theta=5000.0)  # fmt: skip
    write_gguf(tmp_path / "default.gguf", plain, spec, arch="gemma2")
    got = gguf_model().read_gguf(tmp_path / "default.gguf").cfg
    assert (got.sliding_window, got.sliding_layers, got.sliding_rope_theta) == (
        4096,
        (0, 2),
        5000.0,
    )
    # llama.cpp's caps where the GGUF has none.
    assert (got.attention_softcap, got.logit_softcap, got.gelu) == (50.0, 30.0, True)
    extra = {"sliding_window": 4, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0}
    write_gguf(tmp_path / "g2.gguf", plain, spec, extra, arch="gemma2")
    cfg = gguf_model().read_gguf(tmp_path / "g2.gguf").cfg
    assert (cfg.attention_softcap, cfg.logit_softcap, cfg.sliding_window) == (2.0, 3.0, 4)
    weights = llama_weights().random_weights(cfg, seed=3)
    folder = build_module().build(tmp_path, "m", 64, gguf=tmp_path / "g2.gguf") / "1"
    cache, seq = PagedCache(session_for(folder / "model.onnx"), cfg, 8, 4), CachedSeq()
    ids = [5, 17, 200, 33, 9, 45, 12, 99, 140, 7]
    got_logits = [cache.step([seq], [ids[:6]])[0], cache.step([seq], [ids[6:]])[0]]
    got_logits.append(cache.step([seq], [[71]])[0])
    want = forward(weights, cfg, [*ids, 71], first=len(ids) - 1)
    np.testing.assert_allclose(np.stack(got_logits[1:]), want, atol=1e-4, rtol=0)
    assert np.abs(got_logits[2]).max() < 3.0
    uncapped = dataclasses.replace(cfg, attention_softcap=0.0)
    assert np.abs(got_logits[1] - forward(weights, uncapped, ids)[-1]).max() > 1e-2
    head = LmHead(folder / "model.onnx")
    head.load()
    assert head.cap == 3.0
    hidden = np.random.default_rng(0).standard_normal((2, cfg.hidden_size)).astype(np.float32)
    table = weights["model.embed_tokens.weight"]
    np.testing.assert_allclose(
        head.logits(hidden), np.tanh(hidden @ table.T / 3.0) * 3.0, atol=1e-5, rtol=0
    )
    # A Mul(Tanh(Div(x, a)), b) with another divisor is no cap: the head is not read.
    import onnx

    from ge_serve.backends.llm.prompt_logprobs import read_head

    graph = onnx.load(str(folder / "model.onnx"))
    div = next(n for n in graph.graph.node if n.op_type == "Div" and n.output[0] == "logits.div")
    graph.graph.initializer.append(
        onnx.numpy_helper.from_array(np.array([7.0], np.float32), "other")
    )
    div.input[1] = "other"
    onnx.save_model(graph, str(tmp_path / "other.onnx"))
    with pytest.raises(ValueError, match="not a Gemm or MatMul"):
        read_head(tmp_path / "other.onnx")
