"""The LLaMA step graph (examples/smollm/llama_onnx.py) on tiny random weights: it is
standard ONNX with the engine's contract, and through a paged KV cache (blocks out of
order, left-padded batches, chunked prefill) its logits equal the numpy reference's
full-sequence forward pass at every step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from llama_reference import forward, greedy
from smollm import (
    CachedSeq,
    PagedCache,
    llama_onnx,
    llama_weights,
    q4_1_weights,
    session_for,
    tiny_config,
    tiny_model_folder,
)

ATOL = 1e-4
# A free list that hands a sequence blocks out of order and never in a row.
SHUFFLED = [7, 3, 12, 1, 9, 5, 2, 14, 10, 11, 4, 6, 8, 13, 15]
CONFIGS = {
    "gqa-tied": {},
    "mha-untied": {"num_kv_heads": 4, "tie_word_embeddings": False},
    # The GGUF build's graph: one-token steps on Q4_1 blocks (MatMulNBits), the others on
    # the same weights in fp32 (an If). Every test below runs single-token decode steps.
    "gqa-tied-q4_1": {},
}

pytest.importorskip("tokenizers", reason="tokenizers is not installed (the test extra)")


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def tiny(request: pytest.FixtureRequest) -> tuple[Any, dict[str, Any], Any]:
    cfg = tiny_config(**CONFIGS[request.param])
    weights = llama_weights().random_weights(cfg, seed=1)
    blocks = None
    if request.param.endswith("q4_1"):
        pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
        weights, blocks = q4_1_weights(cfg, weights)
    return cfg, weights, session_for(llama_onnx().build_step_graph(weights, cfg, blocks))


def _close(logits: np.ndarray, cfg: Any, weights: dict[str, Any], ids: list[int]) -> None:
    expected = forward(weights, cfg, ids)[-1]
    np.testing.assert_allclose(logits, expected, atol=ATOL, rtol=0)


def test_the_graph_is_standard_onnx_with_the_contract() -> None:
    cfg = tiny_config()
    model = llama_onnx().build_step_graph(llama_weights().random_weights(cfg), cfg)
    onnx.checker.check_model(model, full_check=True)
    assert {op.domain for op in model.opset_import} == {""}
    assert {node.domain for node in model.graph.node} == {""}

    def dims(value: onnx.ValueInfoProto) -> list[str | int]:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    inputs = {v.name: dims(v) for v in model.graph.input}
    outputs = {v.name: dims(v) for v in model.graph.output}
    kv_in, kv_out = ["num_blocks", "block_size", 2, 16], ["tokens", 2, 16]
    group = {
        "input_ids": ["batch", "q"],
        "positions": ["batch", "q"],
        "block_table": ["batch", "blocks"],
        "attention_mask": ["batch", "q", "past_and_q"],
    }
    assert inputs == {
        **group,
        **{f"chunk_{name}": [f"chunk_{d}" for d in shape] for name, shape in group.items()},
        **{f"{kind}_cache_{i}": kv_in for i in range(2) for kind in ("key", "value")},
    }
    assert outputs == {
        "logits": ["rows", 300],
        "hidden_states": ["tokens", 64],
        **{f"{kind}_{i}": kv_out for i in range(2) for kind in ("key", "value")},
    }
    # The second group defaults to no rows: a caller may feed the first group alone.
    defaults = {t.name: list(t.dims) for t in model.graph.initializer if t.name in inputs}
    assert defaults == {
        "chunk_input_ids": [0, 1],
        "chunk_positions": [0, 1],
        "chunk_block_table": [0, 1],
        "chunk_attention_mask": [0, 1, 1],
    }


def test_prefill_then_decode_through_blocks_out_of_order(tiny: Any) -> None:
    cfg, weights, session = tiny
    cache = PagedCache(session, cfg, num_blocks=16, block_size=4, free_order=SHUFFLED)
    seq = CachedSeq()
    ids = [5, 17, 200, 33, 9, 45, 101]
    logits = cache.step([seq], [ids])
    _close(logits[0], cfg, weights, ids)
    for _ in range(8):  # across two more block boundaries
        ids.append(int(logits[0].argmax()))
        logits = cache.step([seq], [ids[-1:]])
        _close(logits[0], cfg, weights, ids)
    assert seq.blocks == SHUFFLED[:4]


def test_chunked_prefill_equals_one_prefill(tiny: Any) -> None:
    cfg, weights, session = tiny
    cache = PagedCache(session, cfg, num_blocks=16, block_size=4, free_order=SHUFFLED)
    seq, ids = CachedSeq(), list(range(40, 51))
    for start in range(0, len(ids), 3):
        logits = cache.step([seq], [ids[start : start + 3]])
        _close(logits[0], cfg, weights, ids[: start + 3])


def test_a_batch_of_rows_with_different_pasts_and_left_padding(tiny: Any) -> None:
    cfg, weights, session = tiny
    cache = PagedCache(session, cfg, num_blocks=32, block_size=4, free_order=SHUFFLED)
    rows = [CachedSeq(), CachedSeq(), CachedSeq()]
    prompts = [[5, 17, 200], [9, 45, 101, 7, 8, 9, 10, 11, 250, 3], [77]]
    logits = cache.step(rows, prompts)  # a batched prefill, left-padded to 10
    for r, ids in enumerate(prompts):
        _close(logits[r], cfg, weights, ids)
    # Decode and a prefill chunk in one step: q = 3, the decode rows padded to it.
    new = [[int(logits[0].argmax())], [int(logits[1].argmax())], [12, 13, 14]]
    logits = cache.step(rows, new)
    for r in range(3):
        prompts[r] += new[r]
        _close(logits[r], cfg, weights, prompts[r])
    for _ in range(3):
        new = [[int(row.argmax())] for row in logits]
        logits = cache.step(rows, new)
        for r in range(3):
            prompts[r] += new[r]
            _close(logits[r], cfg, weights, prompts[r])


def test_decode_rows_and_a_prefill_chunk_in_one_call(tiny: Any) -> None:
    """The second group (a prompt chunk, at its own q) beside decode rows (q = 1) in one
    call gives each row what it would get alone."""
    cfg, weights, session = tiny
    cache = PagedCache(session, cfg, num_blocks=32, block_size=4, free_order=SHUFFLED)
    decoding = [CachedSeq(), CachedSeq()]
    prompts = [[5, 17, 200, 4, 4], [9, 45]]
    logits = cache.step(decoding, prompts)
    joining, prompt = CachedSeq(), [30, 31, 32, 33, 34, 35, 36]
    for start in (0, 4):  # the joining prompt in two chunks, the others decoding
        new = [[int(row.argmax())] for row in logits[:2]]
        chunk = prompt[start : start + 4]
        logits = cache.step(decoding, new, [joining], [chunk])
        assert logits.shape == (3, cfg.vocab_size)
        for r in range(2):
            prompts[r] += new[r]
            _close(logits[r], cfg, weights, prompts[r])
        _close(logits[2], cfg, weights, prompt[: start + 4])
    # And a prompt alone, as the first group, with the second left at its default.
    late = CachedSeq()
    logits = cache.step([late], [[7, 8, 9]])
    _close(logits[0], cfg, weights, [7, 8, 9])


def test_a_fully_masked_padding_row_is_finite(tiny: Any) -> None:
    cfg, _, session = tiny
    feed: dict[str, np.ndarray] = {
        "input_ids": np.zeros((2, 3), np.int64),
        "positions": np.zeros((2, 3), np.int64),
        "block_table": np.zeros((2, 1), np.int64),
        "attention_mask": np.full((2, 3, 4 + 3), -1e9, np.float32),
    }
    pool = np.full((4, 4, cfg.num_kv_heads, cfg.head_dim), 1e3, np.float32)
    for i in range(cfg.num_layers):
        feed[f"key_cache_{i}"] = feed[f"value_cache_{i}"] = pool
    (logits,) = session.run(["logits"], feed)
    assert logits.shape == (2, cfg.vocab_size)
    assert np.isfinite(logits).all()


def test_greedy_through_the_cache_equals_the_reference(tiny: Any) -> None:
    cfg, weights, session = tiny
    cache = PagedCache(session, cfg, num_blocks=16, block_size=4, free_order=SHUFFLED)
    prompt, seq, out = [1, 60, 61, 62, 2, 1, 70], CachedSeq(), []
    logits = cache.step([seq], [prompt])
    for _ in range(10):
        out.append(int(logits[0].argmax()))
        logits = cache.step([seq], [out[-1:]])
    assert out == greedy(weights, cfg, prompt, 10)


def test_wrong_weights_are_refused_with_the_name() -> None:
    cfg = tiny_config()
    weights = llama_weights().random_weights(cfg)
    weights["model.layers.1.mlp.up_proj.weight"] = weights["model.layers.1.mlp.up_proj.weight"].T
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight is \(64, 96\)"):
        llama_onnx().build_step_graph(weights, cfg)
    del weights["model.norm.weight"]
    with pytest.raises(ValueError, match="lack"):
        llama_onnx().build_step_graph(weights, cfg)


def test_unpermute_undoes_llama_cpps_qk_permutation() -> None:
    """convert_hf_to_gguf.py's LlamaModel.permute, written out, then ours undoes it."""
    from smollm import gguf_model

    rng = np.random.default_rng(0)
    heads, head_dim, hidden = 3, 8, 5
    hf = rng.standard_normal((heads * head_dim, hidden)).astype(np.float32)
    permuted = hf.reshape(heads, 2, head_dim // 2, hidden).swapaxes(1, 2).reshape(hf.shape)
    np.testing.assert_array_equal(permuted[gguf_model().unpermute_order(len(hf), heads)], hf)


def test_the_tiny_model_folder_is_complete(tmp_path: Path) -> None:
    from google.protobuf import text_format

    from ge_serve.protos import model_config_pb2

    folder, cfg, _ = tiny_model_folder(tmp_path)
    config = text_format.Parse(
        (folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params == {
        "step_model": "model.onnx",
        "tokenizer": "tokenizer.json",
        "chat_template": "chat_template.jinja",
        "eos_token_ids": "2,0",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "max_model_len": "256",
    }
    for name in ("step_model", "tokenizer", "chat_template"):
        assert (folder / "1" / params[name]).is_file()
    assert config.backend == "llm" and config.max_batch_size == 0
    assert config.model_transaction_policy.decoupled
    assert [(i.name, i.optional) for i in config.input] == [
        ("text_input", True),
        ("input_ids", True),
        ("stream", True),
        ("sampling_parameters", True),
        ("exclude_input_in_output", True),
        ("max_tokens", True),
        ("return_output_ids", True),
        ("return_num_cached_tokens", True),
    ]
    assert [o.name for o in config.output] == [
        "text_output", "finish_reason", "num_input_tokens", "num_output_tokens",
        "logprobs", "cumulative_logprob", "prompt_logprobs", "output_ids",
        "num_cached_tokens",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="exceeds"):
        tiny_model_folder(tmp_path, name="too_long", max_model_len=cfg.max_position_embeddings + 1)


def test_a_graph_past_protobufs_limit_keeps_its_weights_beside_it(tmp_path: Path) -> None:
    """Weights past the inline limit (2 GB; 0 here) go to model.onnx.data: onnxruntime
    runs the graph from its path as the inline one, and the LM head of the prompt log
    probabilities is read from the data file alone."""
    import onnxruntime as ort
    from smollm import build_module, gguf_tokenizer, tiny_tokenizer_spec

    from ge_serve.backends.llm.prompt_logprobs import read_head

    cfg = tiny_config()
    weights = llama_weights().random_weights(cfg, seed=1)
    spec = tiny_tokenizer_spec(cfg.vocab_size)
    tokenizer = gguf_tokenizer().build_tokenizer(spec)
    write = build_module().write_model_folder
    graph = llama_onnx().build_step_graph(weights, cfg)
    inline = write(tmp_path / "inline", graph, tokenizer, cfg, spec, 64) / "1"
    split = write(tmp_path / "split", graph, tokenizer, cfg, spec, 64, inline_limit=0) / "1"
    assert not (inline / "model.onnx.data").exists()
    modes = [(split / name).stat().st_mode & 0o777 for name in ("model.onnx", "model.onnx.data")]
    assert modes[0] == modes[1]  # onnx made it its owner's alone
    stored = sum(w.nbytes for w in weights.values())
    assert (split / "model.onnx.data").stat().st_size >= stored
    assert (split / "model.onnx").stat().st_size < stored / 10
    runs = [
        PagedCache(ort.InferenceSession(str(folder / "model.onnx")), cfg, 8, 4).step(
            [CachedSeq()], [[5, 17, 200]]
        )
        for folder in (inline, split)
    ]
    np.testing.assert_array_equal(runs[0], runs[1])
    head = read_head(split / "model.onnx")[0]
    np.testing.assert_array_equal(head, weights["model.embed_tokens.weight"])
    stepped_out = onnx.load(str(split / "model.onnx"), load_external_data=False)
    for tensor in stepped_out.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../model.onnx.data"
    onnx.save_model(stepped_out, str(split / "model.onnx"))
    with pytest.raises(ValueError, match="outside the model folder"):
        read_head(split / "model.onnx")


def test_one_token_steps_run_on_the_blocks_and_the_others_on_fp32() -> None:
    """The If's choice: blocks that hold other weights than the fp32 ones (so each step
    shows which it ran on) give a one-token step, a first prompt token or a decode row
    after a past, the blocks' answer, and a step of more tokens the fp32 weights'."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    cfg = tiny_config()
    weights = llama_weights().random_weights(cfg, seed=3)
    other, blocks = q4_1_weights(cfg, llama_weights().random_weights(cfg, seed=4))
    on_blocks = {**weights, **{name: other[name] for name in blocks}}
    model = llama_onnx().build_step_graph(weights, cfg, blocks)
    onnx.checker.check_model(model, full_check=True)
    assert {op.domain for op in model.opset_import} == {"", "com.microsoft"}
    # The branches keep their weights in the outer graph (onnxruntime would hold a
    # second copy of a subgraph's own).
    (node,) = [n for n in model.graph.node if n.op_type == "If"]
    assert [len(a.g.initializer) for a in node.attribute] == [0, 0]
    switch = session_for(model)
    fp32 = session_for(llama_onnx().build_step_graph(weights, cfg))
    quantized = session_for(llama_onnx().build_step_graph(on_blocks, cfg))

    def cache(session: Any) -> PagedCache:
        return PagedCache(session, cfg, num_blocks=8, block_size=4, free_order=SHUFFLED)

    def same(session: Any, steps: list[list[list[int]]]) -> None:
        """Each step's logits from the switch graph equal `session`'s, from empty caches."""
        mine, theirs = cache(switch), cache(session)
        rows = [CachedSeq() for _ in steps[0]], [CachedSeq() for _ in steps[0]]
        for new in steps:
            got, want = mine.step(rows[0], new), theirs.step(rows[1], new)
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)

    same(quantized, [[[7]]])  # a one-token prompt
    # A one-token chunk with no rows beside it takes the fp32 branch: the one-token branch
    # holds the first group alone (the engine gives a lone one-token step as a row).
    got = cache(switch).step([], [], [CachedSeq()], [[7]])
    np.testing.assert_allclose(got, cache(fp32).step([CachedSeq()], [[7]]), atol=1e-5, rtol=0)
    same(fp32, [[[7, 8]]])  # two tokens: one row, or two rows of one
    same(fp32, [[[7], [9]]])
    same(fp32, [[[7, 8, 9, 10]], [[11, 12]]])
    # A decode row after a past the fp32 weights computed: the blocks' step on that past.
    mine, theirs = cache(switch), cache(quantized)
    seq = CachedSeq()
    mine.step([seq], [[7, 8, 9, 10, 11]])
    theirs.keys = [k.copy() for k in mine.keys]
    theirs.values = [v.copy() for v in mine.values]
    theirs.free = list(mine.free)
    twin = CachedSeq(list(seq.blocks), seq.length)
    got, want = mine.step([seq], [[12]]), theirs.step([twin], [[12]])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    for layer in range(cfg.num_layers):  # and the keys and values it wrote
        np.testing.assert_allclose(mine.keys[layer], theirs.keys[layer], atol=1e-5)
        np.testing.assert_allclose(mine.values[layer], theirs.values[layer], atol=1e-5)


def test_the_build_takes_the_blocks_unless_fp32_only(tmp_path: Path) -> None:
    """build.py writes the If graph where the GGUF has blocks of its projections (some
    or all), and with --fp32-only standard ONNX (what the NPU placement takes)."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    from smollm import _load, build_module, gguf_model, tiny_tokenizer_spec

    cfg = tiny_config()
    weights, blocks = q4_1_weights(cfg, llama_weights().random_weights(cfg))
    spec = tiny_tokenizer_spec(cfg.vocab_size)
    partial = dict(blocks)
    del partial["model.layers.1.mlp.down_proj.weight"]
    ms = {"", "com.microsoft"}
    cases = [(blocks, False, ms), (blocks, True, {""}), (partial, False, ms), ({}, False, {""})]
    for n, (stored, fp32_only, domains) in enumerate(cases):
        model = gguf_model().GgufModel(cfg, weights, spec, "tiny", stored)
        folder = build_module().build(tmp_path / str(n), "m", 64, model=model, fp32_only=fp32_only)
        graph = onnx.load(str(Path(folder) / "1" / "model.onnx"))
        assert {op.domain for op in graph.opset_import} == domains, (n, fp32_only)
    # --int8-activations: the head on the GGUF's Q8_0 table where it has one (an If of its
    # own), on the fp32 table where it has not; never beside --fp32-only.
    gguf = pytest.importorskip("gguf")
    table = weights["model.embed_tokens.weight"]
    head = _load("llama_linear").q8_from_gguf(
        gguf.quants.quantize(table, gguf.GGMLQuantizationType.Q8_0)
    )
    for n, found in enumerate((head, None)):
        model = gguf_model().GgufModel(cfg, weights, spec, "tiny", blocks, found)
        folder = build_module().build(tmp_path / f"int8-{n}", "m", 64, model=model,
                                      int8_activations=True)  # fmt: skip
        graph = onnx.load(str(Path(folder) / "1" / "model.onnx"))
        assert sum(node.op_type == "If" for node in graph.graph.node) == (2 if found else 1)
    with pytest.raises(ValueError, match="int8 activations"):
        build_module().build(tmp_path / "x", "m", 64, model=model, fp32_only=True,
                             int8_activations=True)  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        build_module().main(["--fp32-only", "--int8-activations"])
    assert exited.value.code == 2
