"""One-token steps on the GGUF's blocks of every type the build reads (Q4_0, Q4_1, Q4_K,
Q8_0, Q6_K), with fp32 or int8 activations, against the fp32 graph on the same weights
(examples/smollm/llama_linear.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
import pytest
from smollm import (
    CachedSeq,
    PagedCache,
    llama_onnx,
    llama_weights,
    q4_1_weights,
    session_for,
    tiny_config,
)

from ge_serve.backends.llm.prompt_logprobs import read_head


def first_step(session: Any, cfg: Any, prompt: list[int]) -> npt.NDArray[np.float32]:
    """The logits of a prompt's one step from an empty cache."""
    logits: npt.NDArray[np.float32] = PagedCache(session, cfg, 8, 4).step([CachedSeq()], [prompt])
    return logits


def kernel_bits(graph: onnx.ModelProto) -> list[int]:
    """The bits of each MatMulNBits in the one-token branch, in graph order."""
    (switch,) = [n for n in graph.graph.node if n.op_type == "If" and n.output[0] != "logits"]
    then = next(a.g for a in switch.attribute if a.name == "then_branch")
    return [a.i for n in then.node if n.op_type == "MatMulNBits" for a in n.attribute
            if a.name == "bits"]  # fmt: skip


def assert_one_token_steps(
    graph: onnx.ModelProto, weights: dict[str, Any], cfg: Any, int8: bool, seed: int
) -> None:
    """`graph`'s one-token steps answer as the fp32 graph on `weights` does: to fp32
    rounding, or with int8 activations to their rounding (far less than the distance
    to other weights' answer, far more than fp32 rounding)."""
    switch = session_for(graph)
    fp32 = session_for(llama_onnx().build_step_graph(weights, cfg))
    other = llama_onnx().build_step_graph(llama_weights().random_weights(cfg, seed=seed), cfg)
    for prompt in ([7], [42]):
        got, want = first_step(switch, cfg, prompt), first_step(fp32, cfg, prompt)
        if not int8:
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)
        else:
            far = first_step(session_for(other), cfg, prompt)
            assert 1e-3 < np.abs(got - want).max() < 0.2 * np.abs(want - far).max()


def test_int8_activations_round_one_token_steps_and_read_the_heads_q8_0_blocks(
    tmp_path: Path,
) -> None:
    """With int8 activations a one-token step computes on the Q4_1 blocks and the head's
    Q8_0 blocks, as llama.cpp does (its activations rounded to 8 bits: close to the exact
    answer, not equal); a step of more tokens stays on the fp32 weights. The blocks hold
    other weights than the fp32 ones, so each step shows which it ran on."""
    gguf = pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import _load

    cfg = tiny_config(tie_word_embeddings=False)
    weights = llama_weights().random_weights(cfg, seed=3)
    other, blocks = q4_1_weights(cfg, llama_weights().random_weights(cfg, seed=4))
    q8 = gguf.GGMLQuantizationType.Q8_0
    data = gguf.quants.quantize(other["lm_head.weight"], q8)
    head = _load("llama_linear").q8_from_gguf(data)
    other["lm_head.weight"] = gguf.quants.dequantize(data, q8)
    np.testing.assert_array_equal(head.dequantize(), other["lm_head.weight"])
    on_blocks = {**weights, **{name: other[name] for name in [*blocks, "lm_head.weight"]}}
    build = llama_onnx().build_step_graph
    model = build(weights, cfg, blocks, int8_activations=True, head=head)
    onnx.checker.check_model(model, full_check=True)
    # The prompt's log probabilities read the fp32 head through the head's If.
    onnx.save_model(model, str(tmp_path / "model.onnx"))
    np.testing.assert_array_equal(read_head(tmp_path / "model.onnx")[0], weights["lm_head.weight"])
    levels = {
        a.i
        for n in model.graph.node
        if n.op_type == "If"
        for branch in n.attribute
        for node in branch.g.node
        if node.op_type == "MatMulNBits"
        for a in node.attribute
        if a.name == "accuracy_level"
    }
    assert levels == {4}
    switch, exact = session_for(model), session_for(build(on_blocks, cfg))
    fp32 = session_for(build(weights, cfg))
    for prompt in ([7], [300 - 1]):
        got = PagedCache(switch, cfg, 8, 4).step([CachedSeq()], [prompt])
        want = PagedCache(exact, cfg, 8, 4).step([CachedSeq()], [prompt])
        # int8 rounding moves the logits (far more than fp32 rounding would), a little
        # beside the distance to the fp32 weights' answer.
        far = PagedCache(fp32, cfg, 8, 4).step([CachedSeq()], [prompt])
        assert 1e-3 < np.abs(got - want).max() < 0.2 * np.abs(want - far).max()
    got = PagedCache(switch, cfg, 8, 4).step([CachedSeq()], [[7, 8, 9]])
    want = PagedCache(fp32, cfg, 8, 4).step([CachedSeq()], [[7, 8, 9]])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="int8 activations"):
        build(weights, cfg, blocks, head=head)
    with pytest.raises(ValueError, match="head's blocks"):
        small = _load("llama_linear").Q80Blocks(head.q[:5], head.scale[:5], head.minimum[:5])
        build(weights, cfg, blocks, int8_activations=True, head=small)


@pytest.mark.parametrize("int8", [False, True], ids=["exact", "int8"])
def test_q4_0_and_q8_0_projections_serve_one_token_steps(int8: bool) -> None:
    """A GGUF mixing Q4_0, Q4_1 and Q8_0 projections (as quantizers mix types): the
    blocks read back are the GGUF's weights exactly; exact one-token steps compute on the
    4-bit ones and on fp32 where a projection's parts are Q8_0 (no fast 8-bit kernel on
    fp32 activations), to the dequantized weights' answer; with int8 activations the Q8_0
    ones take the 8-bit kernel too, close to that answer."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import gguf_model, quantized_weights, tiny_tokenizer_spec

    cfg = tiny_config()

    def kind(name: str) -> str:  # Q and K and V alike: one projection's parts share one
        return {"self_attn": "Q4_0", "mlp": "Q8_0"}[name.split(".")[3]] if ".o_" not in name \
            else "Q4_1"  # fmt: skip

    weights, blocks = quantized_weights(cfg, llama_weights().random_weights(cfg, seed=5), kind)
    for name, found in blocks.items():
        np.testing.assert_array_equal(found.dequantize(), weights[name], name)
    model = gguf_model().GgufModel(cfg, weights, tiny_tokenizer_spec(cfg.vocab_size), "t", blocks)
    usable = model.projection_blocks(int8)
    assert usable is not None
    eight = {n for n, b in usable.items() if type(b).__name__ == "Q80Blocks"}
    assert bool(eight) == int8 and all(".mlp." in n for n in eight)
    graph = llama_onnx().build_step_graph(weights, cfg, usable, int8_activations=int8)
    # Q, K, V (Q4_0), o (Q4_1) on 4 bits; gate-up and down (Q8_0) on 8 with int8 only.
    per_layer = [4, 4, 8, 8] if int8 else [4, 4]
    assert kernel_bits(graph) == per_layer * cfg.num_layers
    assert_one_token_steps(graph, weights, cfg, int8, seed=6)


def random_k_quant(
    rng: np.random.Generator, rows: int, cols: int, kind: str
) -> npt.NDArray[np.uint8]:
    """Random bytes of a Q4_K, Q5_K or Q6_K tensor [rows, cols] (gguf cannot quantize
    to them): its fp16 scales small enough that the weights stay about 1 / sqrt(cols)."""
    size, scales, top = {"Q4_K": (144, (0, 2), 63 * 15), "Q5_K": (176, (0, 2), 63 * 31),
                         "Q6_K": (210, (208,), 127 * 32)}[kind]  # fmt: skip
    data = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    for at in scales:
        small = rng.uniform(0, 2 / (top * np.sqrt(cols)), (rows, cols // 256))
        data[..., at : at + 2] = (
            small.astype(np.float16).view(np.uint8).reshape(rows, cols // 256, 2)
        )
    return data.reshape(rows, -1)


@pytest.mark.parametrize("int8", [False, True], ids=["exact", "int8"])
def test_k_quant_blocks_are_the_ggufs_weights_and_serve_one_token_steps(int8: bool) -> None:
    """Q4_K_M's mix: Q4_K projections (super-blocks of 256, 6-bit scales and mins per
    block of 32) and Q6_K ones (here V and down; 6-bit weights, int8 scales per block of
    16). The blocks read from bytes that gguf's own dequantizer reads are its weights
    exactly; a one-token step computes Q4_K on the 4-bit kernel, and Q6_K on the 8-bit one
    with int8 activations (V a kernel of its own beside Q and K's) or on fp32 without,
    answering what the fp32 graph does (to int8 rounding with int8 activations)."""
    gguf = pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import _load

    llama_onnx()  # and the modules it imports
    linear = _load("llama_linear")
    readers = {"Q4_K": linear.q4_k_from_gguf, "Q6_K": linear.q6_k_from_gguf}
    # Every projection's input a multiple of 256, as K-quants need.
    cfg = tiny_config(hidden_size=256, intermediate_size=512)
    weights = llama_weights().random_weights(cfg, seed=7)
    rng = np.random.default_rng(7)
    blocks = {}
    for name in llama_weights().linear_weight_names(cfg):
        kind = "Q6_K" if ("v_proj" in name or "down_proj" in name) else "Q4_K"
        rows, cols = weights[name].shape
        data = random_k_quant(rng, rows, cols, kind)
        weights[name] = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[kind])
        blocks[name] = readers[kind](data)
        np.testing.assert_array_equal(blocks[name].dequantize(), weights[name], name)
    graph = llama_onnx().build_step_graph(weights, cfg, blocks, int8_activations=int8)
    # Q and K, (V), o, gate-up, (down): the parenthesised on 8 bits with int8 only.
    assert kernel_bits(graph) == ([4, 8, 4, 4, 8] if int8 else [4, 4]) * cfg.num_layers
    assert_one_token_steps(graph, weights, cfg, int8, seed=8)


def test_five_bit_blocks_take_the_8_bit_kernel_with_int8_activations() -> None:
    """Q5_0 (d (q - 16)), Q5_1 (d q + m) and Q5_K (Q4_K's super-block with a fifth bit):
    the blocks read back are the GGUF's weights exactly; with int8 activations each
    projection takes the 8-bit kernel (a minimum in the zero point, what it leaves a term
    apart), near the fp32 answer; without, there is no kernel for them (all fp32)."""
    gguf = pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import _load, gguf_model, quantized_weights, tiny_tokenizer_spec

    llama_onnx()  # and the modules it imports
    linear = _load("llama_linear")
    cfg = tiny_config(hidden_size=256, intermediate_size=512)

    def kind(name: str) -> str:
        return "Q5_0" if "self_attn" in name and ".o_" not in name else "Q5_1"

    weights, blocks = quantized_weights(cfg, llama_weights().random_weights(cfg, seed=9), kind)
    rng = np.random.default_rng(9)
    for name in blocks:
        if ".mlp." in name:  # Q5_K: random bytes (gguf cannot quantize to it)
            rows, cols = weights[name].shape
            data = random_k_quant(rng, rows, cols, "Q5_K")
            weights[name] = gguf.quants.dequantize(data, gguf.GGMLQuantizationType.Q5_K)
            blocks[name] = linear.q5_k_from_gguf(data)
        np.testing.assert_array_equal(blocks[name].dequantize(), weights[name], name)
    model = gguf_model().GgufModel(cfg, weights, tiny_tokenizer_spec(cfg.vocab_size), "t", blocks)
    assert model.projection_blocks(False) is None
    usable = model.projection_blocks(True)
    graph = llama_onnx().build_step_graph(weights, cfg, usable, int8_activations=True)
    assert kernel_bits(graph) == [8, 8, 8, 8] * cfg.num_layers
    assert_one_token_steps(graph, weights, cfg, True, seed=10)


def test_a_gguf_of_mixed_types_reads_and_builds(tmp_path: Path) -> None:
    """A LLaMA GGUF written with gguf's own writer, its projections Q4_K, Q6_K, Q4_0, Q5_K
    and Q8_0 and its head Q6_K (llama.cpp's order and names): read_gguf gives blocks equal to
    its weights (Q and K rows unpermuted alike) and the head, and build.py's graph answers
    a one-token step as the fp32 graph on those weights, exactly, or to int8 rounding."""
    gguf = pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import build_module, gguf_model, tiny_tokenizer_spec

    cfg = tiny_config(hidden_size=256, intermediate_size=512, vocab_size=300)
    spec = tiny_tokenizer_spec(cfg.vocab_size)
    rng = np.random.default_rng(11)
    path = tmp_path / "mixed.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    fields: dict[str, Any] = {
        "name": "mixed", "context_length": cfg.max_position_embeddings,
        "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
        "block_count": cfg.num_layers, "head_count": cfg.num_heads,
        "head_count_kv": cfg.num_kv_heads, "rope_freq_base": cfg.rope_theta,
        "layer_norm_rms_eps": cfg.rms_norm_eps, "tokenizer_model": "gpt2",
        "tokenizer_pre": spec.pre, "token_list": spec.tokens, "token_types": spec.token_types,
        "token_merges": spec.merges, "bos_token_id": spec.bos_token_id,
        "eos_token_id": spec.eos_token_id, "chat_template": spec.chat_template,
    }  # fmt: skip
    for field, value in fields.items():  # gguf's writer has an add_<field> for each
        getattr(writer, f"add_{field}")(value)
    kinds = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_0",
             "ffn_gate": "Q8_0", "ffn_up": "Q8_0", "ffn_down": "Q5_K"}  # fmt: skip
    h, f, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    shapes = {"attn_q": (cfg.num_heads * d, h), "attn_k": (cfg.num_kv_heads * d, h),
              "attn_v": (cfg.num_kv_heads * d, h), "attn_output": (h, cfg.num_heads * d),
              "ffn_gate": (f, h), "ffn_up": (f, h), "ffn_down": (h, f)}  # fmt: skip

    def add(name: str, rows: int, cols: int, kind: str) -> None:
        if kind.endswith("_K"):
            data = random_k_quant(rng, rows, cols, kind)
        else:
            values = rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols)
            data = gguf.quants.quantize(values, gguf.GGMLQuantizationType[kind])
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[kind])

    add("token_embd.weight", cfg.vocab_size, h, "Q6_K")
    writer.add_tensor("output_norm.weight", np.ones(h, np.float32))
    for i in range(cfg.num_layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(h, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(h, np.float32))
        for kind, stored in kinds.items():
            add(f"blk.{i}.{kind}.weight", *shapes[kind], stored)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    model = gguf_model().read_gguf(path)
    assert model.head is not None and model.head.block == 16
    np.testing.assert_array_equal(
        model.head.dequantize(), model.weights["model.embed_tokens.weight"]
    )
    for name in llama_weights().linear_weight_names(cfg):
        np.testing.assert_array_equal(model.blocks[name].dequantize(), model.weights[name])
    fp32 = session_for(llama_onnx().build_step_graph(model.weights, cfg))
    for int8 in (False, True):
        folder = build_module().build(tmp_path / str(int8), "m", 64, gguf=path,
                                      int8_activations=int8)  # fmt: skip
        switch = session_for(onnx.load(str(Path(folder) / "1" / "model.onnx")))
        got = PagedCache(switch, cfg, 8, 4).step([CachedSeq()], [[7]])
        want = PagedCache(fp32, cfg, 8, 4).step([CachedSeq()], [[7]])
        if int8:
            assert 1e-3 < np.abs(got - want).max() < 0.05 * np.abs(want).max()
        else:
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)


def test_int8_activations_put_each_blocks_offset_on_the_rounded_activations() -> None:
    """With int8 activations a 4-bit block d q + m computes as llama.cpp's q4_1 x q8_1
    does: the kernel takes d (q - z) with z the integer nearest -m / d, on the
    activations rounded to 8 bits per block of 32, and only what is left of the minimum
    (m + z d) meets the exact activations. Were the whole minimum on the exact ones, the
    two roundings would not cancel (about twice the error on SmolLM2)."""
    gguf = pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import _load

    llama_onnx()  # and the modules it imports
    linear = _load("llama_linear")
    graph_module = _load("llama_attention")
    rng = np.random.default_rng(3)
    values = rng.standard_normal((48, 256)).astype(np.float32) / 16
    data = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q4_1)
    blocks = linear.from_gguf(data)
    g = graph_module.Graph()
    out = linear.q4_linear(g, "x", blocks, "p", linear.INT8_ACTIVATIONS)
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            g.nodes, "one", [onnx.helper.make_tensor_value_info("x", 1, [1, 256])],
            [onnx.helper.make_tensor_value_info(out, 1, None)], g.initializers,
        ),
        opset_imports=[onnx.helper.make_opsetid(domain, 1 if domain else 17)
                       for domain in ("", linear.DOMAIN)],
        ir_version=8,
    )  # fmt: skip
    x = rng.standard_normal((1, 256)).astype(np.float32)
    got = session_for(model).run(None, {"x": x})[0]
    # llama.cpp's rounding: each block of 32 to int8 on its largest magnitude.
    xb = x.reshape(1, -1, 32)
    step = np.abs(xb).max(-1, keepdims=True) / 127
    rounded = (np.round(xb / step) * step).reshape(1, -1)
    z, left = linear.zero_points(blocks)
    kernel = (blocks.q.astype(np.float32) - z[..., None]) * blocks.scale[..., None]
    want = rounded @ kernel.reshape(48, 256).T + xb.sum(-1) @ left.T
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, atol=2e-4 * scale, rtol=0)
    exact = x @ blocks.dequantize().T
    assert np.abs(got - exact).max() > 1e-3 * scale, "the activations are rounded"
