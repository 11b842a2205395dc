"""GGUFs of LLaMA's kin whose RoPE llama.cpp computes on adjacent pairs (their Q and K
rows stored so, examples/smollm), written here: SmolLM3's layers without RoPE (every
fourth), Granite's and MiniCPM's multipliers (embeddings, residual branches, attention
scale, logits; MiniCPM's llama.cpp defaults), ERNIE 4.5's dense models; their graphs
computed against the reference, and a Granite model's prompt log probabilities through
the engine. A GGUF tensor the graph has no place for is refused, not left out."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import llmrepo
import numpy as np
import numpy.typing as npt
import pytest
from ggufwriter import byte_level_spec, read_back, spm_spec, write_gguf
from llama_reference import forward
from recording_sink import RecordingSink
from smollm import (
    CachedSeq,
    PagedCache,
    gguf_model,
    llama_onnx,
    llama_weights,
    session_for,
    tiny_config,
)

from ge_serve.backends.base import RequestContext
from ge_serve.scheduler.work import WorkItem

pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")

GRANITE = {"embedding_scale": 12.0, "residual_scale": 0.375, "logit_scale": 4.0,
           "attention_scale": 0.0625}  # fmt: skip
IDS = [5, 17, 200, 33, 9, 45, 250]


def stepped(model: Any) -> npt.NDArray[np.float32]:
    """The graph's logits for IDS (prefill) and then 71 and 8 (decode steps), stacked."""
    graph = llama_onnx().build_step_graph(model.weights, model.cfg)
    cache, seq = PagedCache(session_for(graph), model.cfg, 8, 4), CachedSeq()
    got = [cache.step([seq], [IDS])[0]]
    got += [cache.step([seq], [[token]])[0] for token in (71, 8)]
    return np.stack(got)


def test_a_smollm3_gguf_leaves_every_fourth_layer_without_rope(tmp_path: Path) -> None:
    """SmolLM3's architecture: LLaMA's (Q and K rows stored permuted) with no RoPE in
    layers 3, 7, ... (llama.cpp's step of 4, Hugging Face's `no_rope_layers`)."""
    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(vocab_size=len(spec.tokens), num_layers=5, nope_layers=(3,))
    write_gguf(tmp_path / "s3.gguf", cfg, spec, arch="smollm3")
    model = read_back(tmp_path / "s3.gguf", cfg)
    weights = llama_weights().random_weights(cfg, seed=3)
    got = stepped(model)
    np.testing.assert_allclose(got, forward(weights, cfg, [*IDS, 71, 8], first=6), atol=1e-4)
    roped = dataclasses.replace(cfg, nope_layers=())
    assert np.abs(got[0] - forward(weights, roped, IDS)[-1]).max() > 1e-2


def test_a_granite_gguf_takes_its_multipliers(tmp_path: Path) -> None:
    """Granite's: the embeddings times embedding_scale, the attention's and the MLP's
    outputs times residual_scale, Q.K times attention.scale (not 1/sqrt(head)), the
    logits divided by logit_scale; each is felt."""
    spec = byte_level_spec("refact")
    plain = tiny_config(vocab_size=len(spec.tokens), num_layers=3)
    cfg = dataclasses.replace(plain, embedding_scale=12.0, residual_scale=0.375,
                              logit_scale=4.0, attention_scale=0.0625)  # fmt: skip
    write_gguf(tmp_path / "g.gguf", plain, spec, GRANITE, "granite")
    model = read_back(tmp_path / "g.gguf", cfg)
    weights = llama_weights().random_weights(cfg, seed=3)
    got = stepped(model)
    np.testing.assert_allclose(got, forward(weights, cfg, [*IDS, 71, 8], first=6), atol=1e-4)
    for key, default in (("embedding_scale", 1.0), ("residual_scale", 1.0),
                         ("attention_scale", None)):  # fmt: skip
        without = dataclasses.replace(cfg, **{key: default})
        assert np.abs(got[0] - forward(weights, without, IDS)[-1]).max() > 1e-2, key
    unscaled = forward(weights, dataclasses.replace(cfg, logit_scale=1.0), IDS)[-1]
    np.testing.assert_allclose(got[0] * 4.0, unscaled, atol=4e-4, rtol=0)
    # A Granite GGUF without its logit scale is refused, as llama.cpp requires one.
    write_gguf(tmp_path / "n.gguf", plain, spec, {"embedding_scale": 2.0}, "granite")
    with pytest.raises(ValueError, match=r"the GGUF has no granite\.logit_scale"):
        gguf_model().read_gguf(tmp_path / "n.gguf")


def test_a_granite_gguf_whose_rope_switch_is_off_has_no_rope(tmp_path: Path) -> None:
    """Granite's `rope.scaling.finetuned` false: no layer takes RoPE (llama.cpp's switch)."""
    spec = byte_level_spec("refact")
    plain = tiny_config(vocab_size=len(spec.tokens), num_layers=3)
    write_gguf(tmp_path / "g.gguf", plain, spec, GRANITE | {"rope_scaling_finetuned": False},
               "granite")  # fmt: skip
    assert gguf_model().read_gguf(tmp_path / "g.gguf").cfg.nope_layers == (0, 1, 2)


def test_a_minicpm_gguf_takes_its_multipliers_or_their_defaults(tmp_path: Path) -> None:
    """MiniCPM's: Granite's multipliers; where the GGUF has none, MiniCPM 2B's (embeddings
    times 12, residual branches times 1.4/sqrt(layers), logits divided by hidden/256)."""
    spec = spm_spec({"\u2581": -1.0, "a": -2.0})
    plain = tiny_config(vocab_size=len(spec.tokens), num_layers=4)
    write_gguf(tmp_path / "m.gguf", plain, spec, arch="minicpm")
    model = gguf_model().read_gguf(tmp_path / "m.gguf")
    assert (model.cfg.embedding_scale, model.cfg.logit_scale) == (12.0, 0.25)
    assert model.cfg.residual_scale == pytest.approx(0.7)
    weights = llama_weights().random_weights(plain, seed=3)
    want = forward(weights, model.cfg, [*IDS, 71, 8], first=6)
    np.testing.assert_allclose(stepped(model), want, atol=1e-4, rtol=0)
    own = {"embedding_scale": 2.0, "residual_scale": 0.5, "logit_scale": 3.0}
    write_gguf(tmp_path / "o.gguf", plain, spec, own, "minicpm")
    told = gguf_model().read_gguf(tmp_path / "o.gguf").cfg
    assert (told.embedding_scale, told.residual_scale, told.logit_scale) == (2.0, 0.5, 3.0)
    # A scale of 0 is none, as llama.cpp reads it.
    zeros = own | {"embedding_scale": 0.0, "residual_scale": 0.0}
    write_gguf(tmp_path / "z.gguf", plain, spec, zeros, "minicpm")
    zero = gguf_model().read_gguf(tmp_path / "z.gguf").cfg
    assert (zero.embedding_scale, zero.residual_scale) == (1.0, 1.0)


@pytest.mark.parametrize("arch", ["llama", "smollm3", "granite"])
def test_q_and_k_biases_are_read_in_the_rows_order(tmp_path: Path, arch: str) -> None:
    """LLaMA's kin with biases on Q, K and V (a llamafied Qwen, Granite's attention_bias):
    the converter permutes the Q and K biases as it does their weights' rows, and both are
    read back into rotate-half's order."""
    spec = byte_level_spec("refact")
    cfg = tiny_config(vocab_size=len(spec.tokens), qkv_bias=True)
    extra = GRANITE if arch == "granite" else {}
    write_gguf(tmp_path / "b.gguf", cfg, spec, extra, arch)
    model = gguf_model().read_gguf(tmp_path / "b.gguf")
    weights = llama_weights().random_weights(cfg, seed=3)
    for name in ("q_proj.bias", "k_proj.bias", "q_proj.weight"):
        np.testing.assert_array_equal(model.weights[f"model.layers.1.self_attn.{name}"],
                                      weights[f"model.layers.1.self_attn.{name}"])  # fmt: skip
    want = forward(weights, model.cfg, [*IDS, 71, 8], first=6)
    np.testing.assert_allclose(stepped(model), want, atol=1e-4, rtol=0)


def test_an_ernie_gguf_reads_its_rows_and_head_size(tmp_path: Path) -> None:
    """ERNIE 4.5's dense architecture (0.3B): LLaMA's, with heads wider than hidden / heads
    and a SentencePiece vocabulary."""
    spec = spm_spec({"\u2581": -1.0, "a": -2.0})
    cfg = tiny_config(vocab_size=len(spec.tokens), head_size=32)
    write_gguf(tmp_path / "e.gguf", cfg, spec, arch="ernie4_5")
    model = read_back(tmp_path / "e.gguf", cfg)
    weights = llama_weights().random_weights(cfg, seed=3)
    want = forward(weights, cfg, [*IDS, 71, 8], first=6)
    np.testing.assert_allclose(stepped(model), want, atol=1e-4, rtol=0)


async def test_a_granite_models_prompt_logprobs_take_its_logit_scale(tmp_path: Path) -> None:
    """The head outside the graph (prompt log probabilities) gives the logits the graph
    gives: the logit scale is in the final norm's weights, before `hidden_states`."""
    tiny = llmrepo.tiny_model()
    cfg = dataclasses.replace(tiny.cfg, logit_scale=0.25, residual_scale=0.5)
    folder = llmrepo.write_tiny_llm(tmp_path, "m", model=dataclasses.replace(tiny, cfg=cfg))
    with (folder / "config.pbtxt").open("a") as config:
        config.write('output { name: "prompt_logprobs" data_type: TYPE_STRING dims: [ -1 ] }\n')
    scheduler = llmrepo.engine_of(folder)
    prompt = "The quick brown fox"
    try:
        sink = RecordingSink()
        sampling = {"temperature": 0, "prompt_logprobs": 0, "logprobs": 0}
        inputs: dict[str, Any] = {
            "text_input": np.array([prompt.encode()], dtype=object),
            "max_tokens": np.array([1], np.int32),
            "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=object),
        }
        await scheduler.submit(WorkItem(inputs, 1, context=RequestContext(responses=sink)))
        await sink.until_final()
    finally:
        await scheduler.close(1)
    ids = llmrepo.prompt_ids(prompt)
    logits = forward(tiny.weights, cfg, ids, first=0)
    peak = logits.max(-1, keepdims=True)
    want = logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))
    entries = json.loads(sink.responses[0]["prompt_logprobs"][0])
    for position, (token, entry) in enumerate(zip(ids[1:], entries[1:], strict=True)):
        assert entry[str(token)]["logprob"] == pytest.approx(want[position, token], abs=1e-3)
    unscaled = dataclasses.replace(cfg, logit_scale=1.0)
    plain = forward(tiny.weights, unscaled, ids, first=0)
    assert np.abs(plain - logits).max() > 1.0  # the scale is felt


def test_a_tensor_the_graph_has_no_place_for_is_refused(tmp_path: Path) -> None:
    """A bias on the output projection (Granite's optional one) or a tensor of a kind the
    graph does not know is refused by name; it would otherwise be left out silently."""
    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(vocab_size=len(spec.tokens))
    bias = {"blk.0.attn_output.bias": np.ones(cfg.hidden_size, np.float32)}
    write_gguf(tmp_path / "b.gguf", cfg, spec, GRANITE, "granite", bias)
    with pytest.raises(ValueError, match=r"holds blk\.0\.attn_output\.bias, which the graph"):
        gguf_model().read_gguf(tmp_path / "b.gguf")
    other = {"blk.0.ffn_gate_inp.weight": np.ones((4, cfg.hidden_size), np.float32)}
    write_gguf(tmp_path / "m.gguf", cfg, spec, tensors=other)
    with pytest.raises(ValueError, match=r"holds blk\.0\.ffn_gate_inp\.weight, which the graph"):
        gguf_model().read_gguf(tmp_path / "m.gguf")


def test_an_olmo2_gguf_norms_after_and_over_all_heads(tmp_path: Path) -> None:
    """OLMo 2's: no norm before the attention and the MLP, one after each, Q's and K's
    norms over all their heads at once (weights of heads x head size), rotate-half RoPE."""
    spec = byte_level_spec("dbrx")
    cfg = tiny_config(vocab_size=len(spec.tokens), tie_word_embeddings=False,
                      qk_norm=True, qk_norm_whole=True, pre_norms=False,
                      sandwich_norms=True)  # fmt: skip
    write_gguf(tmp_path / "o.gguf", cfg, spec, arch="olmo2")
    model = read_back(tmp_path / "o.gguf", cfg)
    weights = llama_weights().random_weights(cfg, seed=3)
    assert weights["model.layers.0.self_attn.q_norm.weight"].shape == (64,)
    want = forward(weights, cfg, [*IDS, 71, 8], first=6)
    np.testing.assert_allclose(stepped(model), want, atol=1e-4, rtol=0)
    per_head = dict(weights)
    for i in range(cfg.num_layers):  # each head's share of the whole norm, normed alone
        for c in "qk":
            name = f"model.layers.{i}.self_attn.{c}_norm.weight"
            per_head[name] = per_head[name][: cfg.head_dim]
    apart = dataclasses.replace(cfg, qk_norm_whole=False)
    assert np.abs(want[0] - forward(per_head, apart, IDS)[-1]).max() > 1e-2


def test_an_olmo3_gguf_has_local_layers_unscaled_beside_yarn(tmp_path: Path) -> None:
    """OLMo 3's: OLMo 2's with a sliding window in all but every fourth layer, whose RoPE
    is unscaled (the global layers take YaRN's divisors and magnitude)."""
    spec = byte_level_spec("dbrx")
    plain = tiny_config(vocab_size=len(spec.tokens), tie_word_embeddings=False, num_layers=5,
                        qk_norm=True, qk_norm_whole=True, pre_norms=False,
                        sandwich_norms=True, rope_theta=500.0)  # fmt: skip
    # Its local layers run at the global base whatever the GGUF says (llama.cpp's).
    extra = {"sliding_window": 3, "rope_scaling_type": "yarn", "rope_scaling_factor": 4.0,
             "rope_scaling_orig_ctx_len": 32, "rope_freq_base_swa": 10000.0}  # fmt: skip
    write_gguf(tmp_path / "o3.gguf", plain, spec, extra, "olmo2")
    model = gguf_model().read_gguf(tmp_path / "o3.gguf")
    cfg = model.cfg
    local = (cfg.sliding_window, cfg.sliding_layers, cfg.sliding_rope_theta)
    assert local == (3, (0, 1, 2, 4), 500.0) and cfg.sliding_rope_attention_factor == 1.0
    assert cfg.rope_freq_factors is not None and cfg.rope_attention_factor > 1.1
    weights = llama_weights().random_weights(plain, seed=3)
    ids = [5, 17, 200, 33, 9, 45, 250, 12, 99, 140]
    want = forward(weights, cfg, [*ids, 71, 8], first=len(ids) - 1)
    graph = llama_onnx().build_step_graph(model.weights, cfg)
    cache, seq = PagedCache(session_for(graph), cfg, 8, 4), CachedSeq()
    got = [cache.step([seq], [ids])[0]]
    got += [cache.step([seq], [[token]])[0] for token in (71, 8)]
    np.testing.assert_allclose(np.stack(got), want, atol=1e-4, rtol=0)
    # The local layers' unscaled RoPE is felt: with YaRN's there, another model.
    yarned = dataclasses.replace(cfg, sliding_rope_attention_factor=cfg.rope_attention_factor)
    assert np.abs(got[0] - forward(weights, yarned, ids)[-1]).max() > 1e-3


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"rope_dims": 0}, "RoPE needs an even number of dimensions up to head_dim 16, got 0"),
        ({"rope_dims": 7}, "got 7"),
        ({"nope_layers": (2,)}, r"layers without RoPE \(2,\) of 2"),
        ({"qk_norm_whole": True}, "qk_norm_whole needs qk_norm"),
        ({"pre_norms": False}, "without its pre-norms needs its output norms"),
        ({"sandwich_norms": True, "residual_scale": 0.5}, "would be normed away"),
        ({"logit_scale": 0.0}, "must be positive and finite"),
        ({"rope_attention_factor": float("inf")}, "must be positive and finite"),
        ({"rope_freq_factors": (1.0,) * 7 + (0.0,)}, "must be positive and finite"),
        ({"attention_temperature_scale": 0.1}, "needs its length"),
    ],
)
def test_a_config_the_graph_cannot_compute_is_refused(
    overrides: dict[str, object], words: str
) -> None:
    cfg = tiny_config(**overrides)
    with pytest.raises(ValueError, match=words):
        cfg.validate()


def test_an_architecture_not_read_is_refused_by_the_families_read(tmp_path: Path) -> None:
    spec = byte_level_spec("llama-bpe")
    cfg = tiny_config(vocab_size=len(spec.tokens))
    write_gguf(tmp_path / "f.gguf", cfg, spec, arch="falcon")
    with pytest.raises(ValueError) as refused:
        gguf_model().read_gguf(tmp_path / "f.gguf")
    assert str(refused.value) == (
        "only LLaMA, Qwen2, Qwen3, Gemma, Gemma 2, Gemma 3, Phi-3 (and 4-mini), SmolLM3, "
        "Granite, MiniCPM, ERNIE 4.5, Ministral 3, OLMo 2 (and 3), Qwen3 MoE, Qwen2 MoE "
        "(Qwen1.5-MoE), OLMoE, Granite MoE (and MoE Shared) and ERNIE 4.5 MoE GGUFs are "
        "supported, this one is 'falcon'"
    )
