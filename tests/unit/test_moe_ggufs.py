"""GGUFs of mixtures of experts (examples/smollm/llama_moe.py), written here: Qwen3-MoE's
(renormalized top-k weights, a norm on each Q and K head), OLMoE's (weights not
renormalized, Q's and K's norms over all their heads), Granite MoE's (its multipliers,
rows stored permuted; and Granite MoE Shared's shared expert), Qwen2-MoE's (biases on Q,
K and V, weights not renormalized, a shared expert gated by a sigmoid) and Mixtral's (a
LLaMA GGUF with experts); each graph computed
against Hugging Face's sparse MoE block in numpy, through the paged cache. Experts the
GGUF stores as Q4_0 blocks run on onnxruntime's QMoE as they are; Q8_0 ones on fp32."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from ggufwriter import byte_level_spec, read_back, write_gguf
from llama_reference import forward
from smollm import (
    CachedSeq,
    PagedCache,
    build_module,
    gguf_model,
    llama_onnx,
    llama_weights,
    session_for,
    tiny_config,
)

pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")

IDS = [5, 17, 200, 33, 9, 45, 250]
# An expert's size is the GGUF's feed-forward length (Qwen3-MoE's and Qwen2-MoE's, their
# own key).
MOE = {"num_experts": 6, "experts_used": 2, "expert_size": 64, "intermediate_size": 64}
GRANITE = {"embedding_scale": 12.0, "residual_scale": 0.375, "logit_scale": 4.0,
           "attention_scale": 0.0625}  # fmt: skip
QWEN2 = {"qkv_bias": True, "expert_norm": False, "shared_expert_size": 32,
         "shared_expert_gate": True}  # fmt: skip
# ERNIE 4.5's: a dense first layer (of its own size), experts chosen with a bias, a shared
# expert.
ERNIE = {"dense_layers": (0,), "intermediate_size": 96, "expert_selection_bias": True,
         "shared_expert_size": 32}  # fmt: skip


def stepped(model: Any, cfg: Any | None = None) -> npt.NDArray[np.float32]:
    """The graph's logits for IDS (prefill) and then 71 and 8 (decode steps), stacked."""
    cfg = cfg or model.cfg
    return steps(llama_onnx().build_step_graph(model.weights, cfg, experts=model.experts), cfg)


def steps(graph: Any, cfg: Any) -> npt.NDArray[np.float32]:
    """`graph`'s logits for IDS and then 71 and 8, stacked."""
    cache, seq = PagedCache(session_for(graph), cfg, 8, 4), CachedSeq()
    got = [cache.step([seq], [IDS])[0]]
    got += [cache.step([seq], [[token]])[0] for token in (71, 8)]
    return np.stack(got)


def reference(model: Any, cfg: Any | None = None) -> npt.NDArray[np.floating[Any]]:
    """Hugging Face's forward on the weights the GGUF holds (its blocks dequantized)."""
    weights = dict(model.weights) | {n: b.dequantize() for n, b in model.experts.items()}
    return forward(weights, cfg or model.cfg, [*IDS, 71, 8], first=6)


@pytest.mark.parametrize(
    ("arch", "options", "extra"),
    [
        ("qwen3moe", {"qk_norm": True, "head_size": 32}, {}),
        ("olmoe", {"qk_norm": True, "qk_norm_whole": True, "expert_norm": False}, {}),
        ("granitemoe", GRANITE, GRANITE),
        ("granitemoe", GRANITE | {"shared_expert_size": 32}, GRANITE),  # Granite MoE Shared's
        ("granite", GRANITE | {"shared_expert_size": 32}, GRANITE),  # a Granite with experts
        ("qwen2moe", QWEN2, {}),
        ("ernie4_5-moe", ERNIE, {}),
        ("llama", {}, {}),  # Mixtral's
    ],
)  # fmt: skip
def test_a_mixture_of_experts_gguf_computes_the_sparse_moe_block(
    tmp_path: Path, arch: str, options: dict[str, Any], extra: dict[str, Any]
) -> None:
    spec = byte_level_spec("qwen2")
    cfg = tiny_config(vocab_size=len(spec.tokens), **(MOE | options))
    write_gguf(tmp_path / "m.gguf", cfg, spec, extra, arch)
    model = read_back(tmp_path / "m.gguf", cfg)
    assert model.experts == {}  # fp32 experts: onnxruntime's MoE
    np.testing.assert_allclose(stepped(model), reference(model), atol=2e-4)
    # The router matters: every expert the same would not tell a wrong choice apart.
    same = dataclasses.replace(cfg, experts_used=cfg.num_experts)
    assert np.abs(stepped(model, same) - stepped(model)).max() > 1e-2
    if cfg.shared_expert_gate:  # and so does the shared expert's gate
        open_gate = dataclasses.replace(cfg, shared_expert_gate=False)
        weights = {n: w for n, w in model.weights.items() if "shared_expert_gate" not in n}
        ungated = dataclasses.replace(model, weights=weights, cfg=open_gate)
        assert np.abs(stepped(ungated) - stepped(model)).max() > 1e-2
    if cfg.expert_selection_bias:  # and so does the bias the experts are chosen with
        unbiased = dict(model.weights)
        unbiased["model.layers.1.mlp.router.selection.bias"] = np.zeros(6, np.float32)
        plain = dataclasses.replace(model, weights=unbiased)
        np.testing.assert_allclose(stepped(plain), reference(plain), atol=2e-4)
        assert np.abs(stepped(plain) - stepped(model)).max() > 1e-2


@pytest.mark.parametrize(
    ("arch", "options", "extra"),
    [
        ("qwen3moe", {"qk_norm": True}, {}),
        ("olmoe", {"qk_norm": True, "qk_norm_whole": True, "expert_norm": False}, {}),
        # Its residual multiplier rides on fc2's scales (and the shared expert's weights).
        ("granitemoe", {"residual_scale": 0.375, "logit_scale": 4.0}, GRANITE),
        ("granitemoe", {"residual_scale": 0.375, "logit_scale": 4.0, "shared_expert_size": 32},
         GRANITE),
        ("qwen2moe", QWEN2, {}),
        ("ernie4_5-moe", ERNIE, {}),
    ],
)  # fmt: skip
def test_experts_stored_as_q4_0_run_on_their_blocks_as_they_are(
    tmp_path: Path, arch: str, options: dict[str, Any], extra: dict[str, Any]
) -> None:
    spec = byte_level_spec("qwen2")
    granite = {"embedding_scale": 12.0, "attention_scale": 0.0625} if extra else {}
    cfg = tiny_config(vocab_size=len(spec.tokens), **(MOE | options | granite))
    write_gguf(tmp_path / "q.gguf", cfg, spec, extra, arch, quant="Q4_0")
    model = gguf_model().read_gguf(tmp_path / "q.gguf")
    assert sorted(model.experts) == sorted(
        f"model.layers.{i}.mlp.experts.{k}_proj.weight"
        for i in range(2)
        if i not in cfg.dense_layers
        for k in ("gate", "up", "down")
    )
    assert not any(".experts." in name for name in model.weights)  # no fp32 copy
    graph = llama_onnx().build_step_graph(model.weights, model.cfg, experts=model.experts)
    assert {n.op_type for n in graph.graph.node} >= {"QMoE"}
    np.testing.assert_allclose(stepped(model), reference(model), atol=2e-4)
    if cfg.shared_expert_size:  # the shared expert's Q4_0 projections on their blocks too
        kept = gguf_model().read_gguf(tmp_path / "q.gguf", fp32_projections=False)
        blocks = kept.projection_blocks()
        assert blocks is not None
        assert "model.layers.1.mlp.shared_expert.down_proj.weight" in blocks
        build = llama_onnx().build_step_graph
        for only in (False, True):  # one-token steps on them; every step (--low-memory)
            graph = build(kept.weights, kept.cfg, blocks, blocks_only=only, experts=kept.experts)
            assert any("layers.1.mlp.shared_expert.down" in n for n in on_blocks(graph.graph))
            np.testing.assert_allclose(steps(graph, kept.cfg), reference(model), atol=2e-4)
    # Q8_0 experts run on fp32 (QMoE's 8-bit path rounds).
    write_gguf(tmp_path / "e.gguf", cfg, spec, extra, arch, quant="Q8_0")
    eight = gguf_model().read_gguf(tmp_path / "e.gguf")
    assert eight.experts == {} and "model.layers.1.mlp.experts.up_proj.weight" in eight.weights
    np.testing.assert_allclose(stepped(eight), reference(eight), atol=2e-4)


def on_blocks(graph: Any) -> set[str]:
    """The names of the MatMulNBits nodes of `graph` and of the graphs inside it."""
    found = {n.name for n in graph.node if n.op_type == "MatMulNBits"}
    for node in graph.node:
        for inner in (a.g for a in node.attribute if a.type == a.GRAPH):
            found |= on_blocks(inner)
    return found


def test_a_mixture_with_tensors_its_architecture_does_not_read_is_refused(
    tmp_path: Path,
) -> None:
    # llama.cpp reads no shared expert for Qwen3-MoE, nor for Granite MoE without its size.
    spec = byte_level_spec("qwen2")
    cfg = tiny_config(vocab_size=len(spec.tokens), **MOE)
    tensor = {"blk.0.ffn_up_shexp.weight": np.zeros((32, 64), np.float32)}
    for arch, extra in (("qwen3moe", {}), ("granitemoe", GRANITE)):
        write_gguf(tmp_path / "t.gguf", cfg, spec, extra, arch, tensors=tensor)
        with pytest.raises(ValueError, match=r"blk\.0\.ffn_up_shexp\.weight, which the graph"):
            gguf_model().read_gguf(tmp_path / "t.gguf")
    # A shared expert's size with none of its tensors: read, and the build says which
    # weights are lacking (llama.cpp refuses it at its load).
    sized = GRANITE | {"expert_shared_feed_forward_length": 32}
    write_gguf(tmp_path / "s.gguf", cfg, spec, sized, "granitemoe")
    model = gguf_model().read_gguf(tmp_path / "s.gguf")
    assert model.cfg.shared_expert_size == 32
    with pytest.raises(ValueError, match=r"weights lack \['model\.layers\.0\.mlp\.shared_exp"):
        llama_onnx().build_step_graph(model.weights, model.cfg)
    # No experts used and no expert size: the config's own refusal, not a division.
    none_used = {"expert_used_count": 0, "expert_feed_forward_length": 0}
    write_gguf(tmp_path / "u.gguf", cfg, spec, none_used, "qwen2moe")
    with pytest.raises(ValueError, match="a mixture needs 1 to all of its experts"):
        gguf_model().read_gguf(tmp_path / "u.gguf")


def test_an_ernie_mixture_llama_cpp_would_not_load_is_refused(tmp_path: Path) -> None:
    spec = byte_level_spec("qwen2")
    cfg = tiny_config(vocab_size=len(spec.tokens), **(MOE | ERNIE))
    # A mixture every other layer: llama.cpp loads experts for every layer after the
    # dense ones, and would find no dense MLP in the others.
    write_gguf(tmp_path / "s.gguf", cfg, spec, {"interleave_moe_layer_step": 2}, "ernie4_5-moe")
    with pytest.raises(ValueError, match="ernie4_5-moe with a mixture every 2 layers"):
        gguf_model().read_gguf(tmp_path / "s.gguf")
    # Its experts' size, which llama.cpp reads as one value or one per layer.
    one_value = gguf_model()._one_value
    assert one_value(64, "ernie4_5-moe", 2) == one_value([64, 64], "ernie4_5-moe", 2) == 64
    with pytest.raises(ValueError, match=r"experts of sizes \[32, 64\] is not supported"):
        one_value([64, 32], "ernie4_5-moe", 2)
    with pytest.raises(ValueError, match="3 experts' sizes for 2 layers"):
        one_value([64, 64, 64], "ernie4_5-moe", 2)
    # A selection bias on some mixture layers only (llama.cpp takes each layer's as
    # optional); another architecture's is a tensor nothing reads.
    some = dataclasses.replace(cfg, num_layers=3, expert_selection_bias=False)
    write_gguf(tmp_path / "c.gguf", some, spec, arch="ernie4_5-moe",
               tensors={"blk.2.exp_probs_b.bias": np.zeros((1, 6), np.float32)})  # fmt: skip
    with pytest.raises(ValueError, match="with a selection bias on some of its layers only"):
        gguf_model().read_gguf(tmp_path / "c.gguf")
    qwen = tiny_config(vocab_size=len(spec.tokens), qk_norm=True, **MOE)
    write_gguf(tmp_path / "q.gguf", qwen, spec, arch="qwen3moe",
               tensors={"blk.1.exp_probs_b.bias": np.zeros((1, 6), np.float32)})  # fmt: skip
    with pytest.raises(ValueError, match=r"blk\.1\.exp_probs_b\.bias, which the graph"):
        gguf_model().read_gguf(tmp_path / "q.gguf")


def test_a_config_of_experts_the_graph_cannot_compute_is_refused() -> None:
    for values in ({"experts_used": 0}, {"experts_used": 7}, {"expert_size": 0}):
        with pytest.raises(ValueError, match="a mixture needs 1 to all of its experts"):
            tiny_config(**(MOE | values)).validate()
    shared: list[dict[str, Any]] = [{"shared_expert_size": 32}, {"shared_expert_gate": True}]
    for values in shared:
        with pytest.raises(ValueError, match="a shared expert needs a mixture of experts"):
            tiny_config(**values).validate()
    shared = [{"shared_expert_size": -1}, {"shared_expert_gate": True}]
    for values in shared:
        with pytest.raises(ValueError, match="a shared expert of size"):
            tiny_config(**(MOE | values)).validate()
    with pytest.raises(ValueError, match="a selection bias or dense layers need a mixture"):
        tiny_config(dense_layers=(0,)).validate()
    with pytest.raises(ValueError, match="2 dense layers of 2: a mixture keeps some"):
        tiny_config(**(MOE | {"dense_layers": (0, 1)})).validate()
    unnormed = {"expert_selection_bias": True, "expert_norm": False}
    with pytest.raises(ValueError, match="a selection bias with weights not renormalized"):
        tiny_config(**(MOE | unnormed)).validate()


def test_an_experts_size_is_read_where_llama_cpp_reads_it(tmp_path: Path) -> None:
    # Qwen3-MoE's from its own key (its feed-forward length is the dense one's); the
    # others' from the feed-forward length, whatever else the GGUF says (Qwen2-MoE's below).
    spec = byte_level_spec("qwen2")
    qwen = tiny_config(vocab_size=len(spec.tokens), **(MOE | {"intermediate_size": 96}))
    write_gguf(tmp_path / "q.gguf", qwen, spec, {"feed_forward_length": 96}, "qwen3moe")
    assert read_back(tmp_path / "q.gguf", qwen).cfg.expert_size == 64
    mixtral = tiny_config(vocab_size=len(spec.tokens), **MOE)
    write_gguf(tmp_path / "m.gguf", mixtral, spec, {"expert_feed_forward_length": 32}, "llama")
    assert read_back(tmp_path / "m.gguf", mixtral).cfg.expert_size == 64
    # Qwen2-MoE's experts as Qwen3-MoE's; its shared expert's size is its own key's, or,
    # where that is 0 or absent, the feed-forward length's.
    size = MOE | QWEN2 | {"intermediate_size": 96}
    qwen2 = tiny_config(vocab_size=len(spec.tokens), **size)
    write_gguf(tmp_path / "w.gguf", qwen2, spec, {"feed_forward_length": 96}, "qwen2moe")
    assert read_back(tmp_path / "w.gguf", qwen2).cfg.shared_expert_size == 32
    whole = dataclasses.replace(qwen2, shared_expert_size=96)
    unsized = {"feed_forward_length": 96, "expert_shared_feed_forward_length": 0}
    # Its gate as llama.cpp declares it, [hidden] (the converter writes [1, hidden]).
    gate = "model.layers.0.mlp.shared_expert_gate.weight"
    flat = {"blk.0.ffn_gate_inp_shexp.weight": llama_weights().random_weights(whole, 3)[gate][0]}
    write_gguf(tmp_path / "u.gguf", whole, spec, unsized, "qwen2moe", tensors=flat)
    assert read_back(tmp_path / "u.gguf", whole).cfg.shared_expert_size == 96


def test_what_llama_cpp_reads_of_these_mixtures_is_what_is_read(tmp_path: Path) -> None:
    # llama.cpp's rope types (llama_model_rope_type): NORM for LLaMA's and Granite's, so
    # their Q and K rows are stored permuted; NEOX for Qwen3-MoE's and OLMoE's.
    permuted = gguf_model().PERMUTED
    assert {"llama", "granitemoe", "ernie4_5-moe"} <= permuted
    assert not {"qwen3moe", "olmoe", "qwen2moe"} & permuted
    # llama.cpp reads no expert_weights_scale for them: a GGUF that gives one answers as
    # one without it.
    spec = byte_level_spec("qwen2")
    cfg = tiny_config(vocab_size=len(spec.tokens), qk_norm=True, **MOE)
    write_gguf(tmp_path / "s.gguf", cfg, spec, {"expert_weights_scale": 2.5}, "qwen3moe")
    model = read_back(tmp_path / "s.gguf", cfg)
    np.testing.assert_allclose(stepped(model), reference(model), atol=2e-4)


def test_build_refuses_a_mixture_for_the_npu_and_says_what_fp32_experts_take(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = byte_level_spec("qwen2")
    cfg = tiny_config(vocab_size=len(spec.tokens), qk_norm=True, **MOE)
    write_gguf(tmp_path / "e.gguf", cfg, spec, arch="qwen3moe", quant="Q8_0")
    build = build_module().build
    # Before any tensor is read (a large GGUF's experts would be dequantized first).
    with pytest.raises(ValueError, match="--fp32-only \\(placement npu\\) cannot build it"):
        build(tmp_path / "out", "m", gguf=tmp_path / "e.gguf", fp32_only=True)
    assert not (tmp_path / "out").exists()
    folder = build(tmp_path / "out", "m", gguf=tmp_path / "e.gguf", max_model_len=64)
    size = 2 * 3 * 6 * 64 * 64 * 4  # layers, projections, experts, 64 x 64 fp32
    said = capsys.readouterr().err
    assert f"they take fp32, {size / 2**30:.1f} GiB, to read and to serve" in said
    assert (folder / "1" / "model.onnx").is_file()


def test_int8_activations_round_what_q4_0_experts_multiply_in_one_token_steps(
    tmp_path: Path,
) -> None:
    spec = byte_level_spec("qwen2")
    cfg = tiny_config(vocab_size=len(spec.tokens), qk_norm=True, **MOE)
    write_gguf(tmp_path / "q.gguf", cfg, spec, arch="qwen3moe", quant="Q4_0")
    model = gguf_model().read_gguf(tmp_path / "q.gguf", fp32_projections=False)
    build = llama_onnx().build_step_graph

    def levels(graph: Any) -> dict[str, list[int]]:
        """Each If branch's QMoE nodes' accuracy levels (0 where unset)."""
        found: dict[str, list[int]] = {}
        for node in graph.graph.node:
            for branch in (a.g for a in node.attribute if a.type == a.GRAPH):
                found[branch.name] = [
                    next((a.i for a in n.attribute if a.name == "accuracy_level"), 0)
                    for n in branch.node
                    if n.op_type == "QMoE"
                ]
        return found

    def run(graph: Any) -> npt.NDArray[np.float32]:
        cache, seq = PagedCache(session_for(graph), model.cfg, 8, 4), CachedSeq()
        got = [cache.step([seq], [IDS])[0]]
        got += [cache.step([seq], [[token]])[0] for token in (71, 8)]
        return np.stack(got)

    exact = build(model.weights, model.cfg, model.blocks, experts=model.experts)
    rounded = build(model.weights, model.cfg, model.blocks, True, experts=model.experts)
    # Rounded where the dense projections round theirs: the one-token branch's.
    assert levels(exact) == {"one_token": [0, 0], "tokens": [0, 0]}
    assert levels(rounded) == {"one_token": [4, 4], "tokens": [0, 0]}
    want, got = reference(model), run(rounded)
    np.testing.assert_allclose(got[0], want[0], atol=2e-4)  # the prompt's step: exact
    assert 1e-4 < np.abs(got[1:] - want[1:]).max() < 0.1
    # The experts' rounding, not only the dense projections': without it, other logits.
    for node in rounded.graph.node:
        for branch in (a.g for a in node.attribute if a.type == a.GRAPH):
            for moe in (n for n in branch.node if n.op_type == "QMoE"):
                kept = [a for a in moe.attribute if a.name != "accuracy_level"]
                del moe.attribute[:]
                moe.attribute.extend(kept)
    assert np.abs(run(rounded)[1:] - got[1:]).max() > 1e-5
    # Every step with --low-memory, as the dense projections there.
    low = build(model.weights, model.cfg, model.blocks, True, blocks_only=True,
                experts=model.experts)  # fmt: skip
    assert [n.attribute for n in low.graph.node if n.op_type == "QMoE"] != []
    assert all(
        any(a.name == "accuracy_level" and a.i == 4 for a in n.attribute)
        for n in low.graph.node
        if n.op_type == "QMoE"
    )
