"""RoPE scalings a GGUF names by `rope.scaling.type` (examples/smollm/gguf_model.py),
written here: YaRN read as Hugging Face's `_compute_yarn_parameters` defines it (a divisor
per frequency, a magnitude on cos and sin) and computed by the graph as the reference
computes it; `longrope`, which current converters write for Phi-3.5 and Phi-4-mini, read
from its factor tensors; the YaRN variants the graph does not compute refused."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ggufwriter import FACTORS, byte_level_spec, spm_spec, write_gguf
from llama_reference import forward
from smollm import (
    CachedSeq,
    PagedCache,
    gguf_model,
    llama_onnx,
    llama_weights,
    session_for,
    tiny_config,
)

pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")

YARN = {"rope_scaling_type": "yarn", "rope_scaling_factor": 4.0, "rope_scaling_orig_ctx_len": 32}


def hugging_face_yarn(
    dim: int, base: float, factor: float, original: int, fast: float = 32, slow: float = 1
) -> tuple[tuple[float, ...], float]:
    """transformers' _compute_yarn_parameters, as each frequency's divisor and the
    attention factor."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = float(max(math.floor(correction_dim(fast)), 0))
    high = float(min(math.ceil(correction_dim(slow)), dim - 1))
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    extrapolated = 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    interpolated = extrapolated / factor
    inv_freq = interpolated * (1 - extrapolation) + extrapolated * extrapolation
    return tuple(float(v) for v in extrapolated / inv_freq), 0.1 * math.log(factor) + 1.0


def test_yarn_divides_each_frequency_and_scales_cos_and_sin(tmp_path: Path) -> None:
    """A Qwen2 GGUF with YaRN (factor 4 over an original 32 positions): the config's
    divisors and magnitude are Hugging Face's, and the graph's logits past the original
    context are the reference's with them (not those without)."""
    spec = byte_level_spec("qwen2")
    plain = tiny_config(vocab_size=len(spec.tokens), rope_theta=500.0)
    write_gguf(tmp_path / "y.gguf", plain, spec, YARN, "qwen2")
    cfg = gguf_model().read_gguf(tmp_path / "y.gguf").cfg
    divisors, magnitude = hugging_face_yarn(plain.head_dim, 500.0, 4.0, 32)
    np.testing.assert_allclose(cfg.rope_freq_factors, divisors, rtol=1e-6)
    assert 1.0 in divisors and 4.0 in divisors  # both ends of the ramp, and a slope between
    assert any(1.0 < d < 4.0 for d in divisors)
    assert cfg.rope_attention_factor == pytest.approx(magnitude, rel=1e-6)
    weights = llama_weights().random_weights(plain, seed=3)
    ids = [int(i) for i in np.random.default_rng(1).integers(0, len(spec.tokens), 40)]
    graph = llama_onnx().build_step_graph(weights, cfg)
    got = PagedCache(session_for(graph), cfg, 8, 8).step([CachedSeq()], [ids])[0]
    np.testing.assert_allclose(got, forward(weights, cfg, ids)[-1], atol=1e-4, rtol=0)
    assert np.abs(got - forward(weights, plain, ids)[-1]).max() > 1e-2
    # The model's own betas and attention factor where the GGUF has them.
    own = YARN | {"rope_scaling_yarn_beta_slow": 0.25, "rope_scaling_yarn_attn_factor": 1.5}
    write_gguf(tmp_path / "b.gguf", plain, spec, own, "qwen2")
    betas = gguf_model().read_gguf(tmp_path / "b.gguf").cfg
    np.testing.assert_allclose(
        betas.rope_freq_factors, hugging_face_yarn(16, 500.0, 4.0, 32, slow=0.25)[0], rtol=1e-6
    )
    assert betas.rope_freq_factors != cfg.rope_freq_factors
    assert betas.rope_attention_factor == 1.5
    # A log multiplier m (Ministral 3's mscale_all_dim): the magnitude is Hugging Face's
    # get_mscale(factor) / get_mscale(factor, m) there; llama.cpp reads it for no other of
    # these architectures.
    logged = YARN | {"rope_scaling_yarn_log_mul": 0.5}
    for arch, want in (("mistral3", (1 + 0.1 * math.log(4.0)) / (1 + 0.05 * math.log(4.0))),
                       ("qwen2", magnitude)):  # fmt: skip
        write_gguf(tmp_path / "m.gguf", plain, spec, logged, arch)
        got = gguf_model().read_gguf(tmp_path / "m.gguf").cfg.rope_attention_factor
        assert got == pytest.approx(want, rel=1e-6), arch
    # A factor of 0 is none, as llama.cpp reads it.
    write_gguf(tmp_path / "z.gguf", plain, spec, YARN | {"rope_scaling_factor": 0.0}, "qwen2")
    zero = gguf_model().read_gguf(tmp_path / "z.gguf").cfg
    assert set(zero.rope_freq_factors or ()) == {1.0} and zero.rope_attention_factor == 1.0
    # No original context: the whole context's (256 positions), as both read it.
    bare = {"rope_scaling_type": "yarn", "rope_scaling_factor": 4.0}
    write_gguf(tmp_path / "n.gguf", plain, spec, bare, "qwen2")
    whole = gguf_model().read_gguf(tmp_path / "n.gguf").cfg
    np.testing.assert_allclose(
        whole.rope_freq_factors, hugging_face_yarn(16, 500.0, 4.0, 256)[0], rtol=1e-6
    )


def test_longrope_is_read_from_its_factor_tensors(tmp_path: Path) -> None:
    """`rope.scaling.type` longrope (Phi-3.5's and Phi-4-mini's converters write it): the
    short and long factors come from their tensors; without them it is refused."""
    spec = spm_spec({"\u2581": -1.0, "a": -2.0})
    cfg = tiny_config(vocab_size=len(spec.tokens), rope_freq_factors=FACTORS,
                      max_position_embeddings=128)  # fmt: skip
    factors: dict[str, Any] = {
        "rope_factors_short.weight": np.asarray(FACTORS, np.float32),
        "rope_factors_long.weight": np.asarray([2 * f for f in FACTORS], np.float32),
    }
    extra = {"rope_scaling_type": "longrope", "rope_scaling_orig_ctx_len": 32}
    write_gguf(tmp_path / "l.gguf", cfg, spec, extra, "phi3", factors)
    model = gguf_model().read_gguf(tmp_path / "l.gguf")
    assert model.cfg.rope_freq_factors == FACTORS
    assert model.config_for(64).rope_freq_factors == tuple(2 * f for f in FACTORS)
    # Without an original context, llama.cpp takes the whole context's: the long factors
    # are never taken.
    write_gguf(tmp_path / "w.gguf", cfg, spec, {"rope_scaling_type": "longrope"}, "phi3",
               factors)  # fmt: skip
    whole = gguf_model().read_gguf(tmp_path / "w.gguf")
    assert whole.config_for(128).rope_freq_factors == FACTORS
    bare = tiny_config(vocab_size=len(spec.tokens))
    write_gguf(tmp_path / "n.gguf", bare, spec, extra, "phi3")
    with pytest.raises(ValueError, match="'longrope' without rope_factors_short"):
        gguf_model().read_gguf(tmp_path / "n.gguf")


@pytest.mark.parametrize(
    ("extra", "arch", "words"),
    [
        (YARN | {"rope_scaling_yarn_ext_factor": 0.5}, "llama", "extrapolation factor"),
        (YARN | {"rope_scaling_orig_ctx_len": 0}, "llama",
         "original_context_length 0 is not a count"),
        (YARN | {"rope_scaling_yarn_beta_slow": 0.0}, "llama", "YaRN needs positive betas"),
        (YARN | {"rope_scaling_factor": -2.0}, "llama", "factor -2.0 is not a positive"),
    ],
    ids=["extrapolation", "no-original", "beta", "negative"],
)  # fmt: skip
def test_a_yarn_the_graph_does_not_compute_is_refused(
    tmp_path: Path, extra: dict[str, Any], arch: str, words: str
) -> None:
    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(vocab_size=len(spec.tokens))
    write_gguf(tmp_path / "r.gguf", cfg, spec, extra, arch)
    with pytest.raises(ValueError, match=words):
        gguf_model().read_gguf(tmp_path / "r.gguf")


def test_gemma3s_local_layers_take_the_ggufs_attn_factor_but_not_yarns(tmp_path: Path) -> None:
    """llama.cpp's Gemma 3: the global layers' cos and sin take YaRN's magnitude times the
    GGUF's attn_factor, the local layers' (unscaled, at their own base) the attn_factor
    alone. The graph computes both as the reference does."""
    spec = byte_level_spec("llama-bpe")
    plain = tiny_config(vocab_size=len(spec.tokens), num_layers=6, head_size=32,
                        qk_norm=True, sandwich_norms=True)  # fmt: skip
    extra = YARN | {"sliding_window": 4, "rope_scaling_attn_factors": 1.25}
    write_gguf(tmp_path / "g3.gguf", plain, spec, extra, "gemma3")
    cfg = gguf_model().read_gguf(tmp_path / "g3.gguf").cfg
    assert cfg.sliding_layers == (0, 1, 2, 3, 4) and cfg.sliding_rope_attention_factor == 1.25
    assert cfg.rope_attention_factor == pytest.approx(1.25 * (1 + 0.1 * math.log(4.0)))
    weights = llama_weights().random_weights(plain, seed=3)
    ids = [int(i) for i in np.random.default_rng(2).integers(0, len(spec.tokens), 12)]
    graph = llama_onnx().build_step_graph(weights, cfg)
    got = PagedCache(session_for(graph), cfg, 8, 4).step([CachedSeq()], [ids])[0]
    np.testing.assert_allclose(got, forward(weights, cfg, ids)[-1], atol=1e-4, rtol=0)
