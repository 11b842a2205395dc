"""Generative models for tests: a tiny random-weight LLaMA served by the `llm` backend.

The step graph comes from the example's graph writer (examples/smollm/llama_onnx.py), the
weights are random (seeded), and the tokenizer is byte-level BPE with no merges: every
byte one token, so any text round-trips and the vocabulary stays small; with `think`,
`<think>` and `</think>` are added tokens too (257 and 258), as a thinking model's are
(the thinking budget needs them). The numpy reference (tests/llama_reference.py) gives
the greedy continuation the server must match.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import smollm
from google.protobuf import text_format
from recording_sink import RecordingSink

from ge_serve.backends.base import ModelSpec, RequestContext
from ge_serve.backends.llm.backend import MODEL_KEY, LlmBackend
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.work import WorkItem

EOS_TOKEN = "<|endoftext|>"
THINK_TOKENS = ["<think>", "</think>"]  # added with `think`: ids 257 and 258
VOCAB = 320  # 256 byte tokens, the EOS token, `think`'s tokens, and unused rows
BLOCK_SIZE = 8


@dataclass(frozen=True)
class TinyModel:
    cfg: Any
    weights: Mapping[str, npt.NDArray[np.float32]]
    eos_id: int
    # The projections' Q4_1 blocks, for the GGUF build's graph (one-token steps on them).
    blocks: Mapping[str, Any] | None = None


@cache
def tiny_model(seed: int = 0) -> TinyModel:
    cfg = smollm.tiny_config(vocab_size=VOCAB, max_position_embeddings=2048)
    return TinyModel(cfg, smollm.llama_weights().random_weights(cfg, seed=seed), eos_id=256)


@cache
def q4_1_tiny_model() -> TinyModel:
    """`tiny_model` with its projections stored as Q4_1, as the GGUF build's graph is."""
    model = tiny_model()
    weights, blocks = smollm.q4_1_weights(model.cfg, dict(model.weights))
    return TinyModel(model.cfg, weights, model.eos_id, blocks)


@cache
def slow_model() -> TinyModel:
    """Wider and deeper than `tiny_model`, random too: its steps take milliseconds even on a
    fast host, so a generation of a thousand tokens or more outlasts a deadline of a second
    (tests of what the server does to the generations still running then)."""
    cfg = smollm.tiny_config(
        vocab_size=VOCAB, max_position_embeddings=2048, hidden_size=512,
        intermediate_size=1024, num_layers=8, num_heads=8, num_kv_heads=2,
    )  # fmt: skip
    return TinyModel(cfg, smollm.llama_weights().random_weights(cfg, seed=0), eos_id=256)


def byte_tokenizer(think: bool = False, specials: Sequence[str] = ()) -> Any:
    """Byte-level BPE without merges: one token per byte, plus the EOS token (256), and
    with `think` the thoughts' tags (257 and 258); `specials`: special tokens after
    those (control tokens, as Mistral's `[THINK]` and `[TOOL_CALLS]` are)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {char: index for index, char in enumerate(alphabet)}
    vocab[EOS_TOKEN] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOS_TOKEN])
    if think:
        tokenizer.add_tokens(THINK_TOKENS)
    tokenizer.add_special_tokens(list(specials))
    return tokenizer


def write_tiny_llm(
    repo: Path,
    name: str = "tiny_llm",
    parameters: Mapping[str, str] | None = None,
    model: TinyModel | None = None,
    interface: bool = True,
    think: bool = False,
    specials: Sequence[str] = (),
) -> Path:
    """A model folder for the tiny model (or `model`); `parameters` add to or replace the
    engine's. `interface=False` writes a config as minimal as Triton's vLLM backend's
    samples: no inputs, no outputs, no transaction policy, left to auto-complete.
    `think`: its tokenizer has `<think>` and `</think>` as tokens, `specials` these
    special tokens (`byte_tokenizer`)."""
    import onnx

    model = model or tiny_model()
    folder = repo / name
    version = folder / "1"
    version.mkdir(parents=True, exist_ok=True)
    graph = smollm.llama_onnx().build_step_graph(model.weights, model.cfg, model.blocks)
    onnx.save_model(graph, str(version / "model.onnx"))
    byte_tokenizer(think, specials).save(str(version / "tokenizer.json"))
    (version / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}",
        encoding="utf-8",
    )
    values = {
        "step_model": "model.onnx",
        "tokenizer": "tokenizer.json",
        "chat_template": "chat_template.jinja",
        "eos_token_ids": str(model.eos_id),
        "eos_token": EOS_TOKEN,
        "max_model_len": "256",
        "kv_cache_blocks": "128",
        "kv_block_size": str(BLOCK_SIZE),
        "max_num_seqs": "32",
        "max_num_batched_tokens": "128",
        "intra_op_thread_count": "1",
        **(parameters or {}),
    }
    config = llm_config(name, values) if interface else minimal_llm_config(name, values)
    (folder / "config.pbtxt").write_text(config, encoding="utf-8")
    return folder


def llm_config(name: str, parameters: Mapping[str, str]) -> str:
    optional = (
        ("stream", "TYPE_BOOL"),
        ("sampling_parameters", "TYPE_STRING"),
        ("exclude_input_in_output", "TYPE_BOOL"),
        ("max_tokens", "TYPE_INT32"),
    )
    lines = [
        f'name: "{name}"',
        'backend: "llm"',
        "max_batch_size: 0",
        "model_transaction_policy { decoupled: true }",
        'input { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }',
        *(
            f'input {{ name: "{n}" data_type: {t} dims: [ 1 ] optional: true }}'
            for n, t in optional
        ),
        *(
            f'output {{ name: "{n}" data_type: {t} dims: [ -1 ] }}'
            for n, t in (
                ("text_output", "TYPE_STRING"),
                ("finish_reason", "TYPE_STRING"),
                ("num_input_tokens", "TYPE_INT32"),
                ("num_output_tokens", "TYPE_INT32"),
                ("output_ids", "TYPE_INT32"),
            )
        ),
        *(
            f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
            for k, v in parameters.items()
        ),
    ]
    return "\n".join(lines) + "\n"


def minimal_llm_config(name: str, parameters: Mapping[str, str]) -> str:
    lines = [
        f'name: "{name}"',
        'backend: "llm"',
        *(
            f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
            for k, v in parameters.items()
        ),
    ]
    return "\n".join(lines) + "\n"


def prompt_ids(text: str, think: bool = False) -> list[int]:
    return list(byte_tokenizer(think).encode(text).ids)


@cache
def _tiny_greedy(text: str, steps: int, think: bool, stop_at_eos: bool) -> tuple[int, ...]:
    """The tiny model's greedy decoding by the reference, once per session for each input
    (a pass per token; tests ask for the same prompts' answers again and again)."""
    import llama_reference

    model = tiny_model()
    stop = (model.eos_id,) if stop_at_eos else ()
    ids = prompt_ids(text, think)
    return tuple(llama_reference.greedy(model.weights, model.cfg, ids, steps, stop))


def reference_greedy(text: str, steps: int) -> list[int]:
    """The numpy reference's greedy continuation of `text` (stopping after EOS)."""
    return list(_tiny_greedy(text, steps, False, True))


def reference_ids(text: str, steps: int, think: bool = False) -> list[int]:
    """The reference's greedy tokens, EOS not excepted (for `ignore_eos` requests)."""
    return list(_tiny_greedy(text, steps, think, False))


def reference_mismatch(text: str, generated: Sequence[int], steps: int) -> str | None:
    """None when `generated` (a greedy request's `output_ids`, at most `steps` tokens) is
    the reference's greedy continuation of `text`, checked in one forward pass; else what
    differs. An answer that ended before `steps` must have ended on the reference's EOS."""
    import llama_reference

    model = tiny_model()
    ids = list(generated)
    if len(ids) < steps and (not ids or ids[-1] != model.eos_id):
        ids.append(model.eos_id)
    return llama_reference.greedy_mismatch(model.weights, model.cfg, prompt_ids(text), ids)


def reference_text(text: str, steps: int) -> str:
    """What the server must answer for a greedy request of `steps` tokens."""
    ids = [i for i in reference_greedy(text, steps) if i != tiny_model().eos_id]
    return answer_text(ids)


def answer_text(ids: Sequence[int], think: bool = False) -> str:
    """The text of generated `ids` as the server answers it: an answer cut inside a
    character ends without it (the random model often stops mid-character)."""
    return str(byte_tokenizer(think).decode(list(ids))).rstrip("\ufffd")


def reference_logprobs(
    prompt: str, generated: list[int], think: bool = False
) -> npt.NDArray[np.float64]:
    """The log-softmax of the numpy reference's logits at each generated position."""
    import llama_reference

    model = tiny_model()
    ids = prompt_ids(prompt, think) + generated
    logits = llama_reference.forward(
        model.weights, model.cfg, ids, first=len(ids) - 1 - len(generated)
    )
    logits = logits[: len(generated)]
    peak = logits.max(-1, keepdims=True)
    result: npt.NDArray[np.float64] = (
        logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))
    )
    return result


def engine_of(folder: Path) -> GenerationScheduler:
    """The model written in `folder` (version 1), loaded by the `llm` backend, with its
    engine running in this process (a test closes it)."""
    config = text_format.Parse(
        (folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    spec = ModelSpec(folder.name, 1, config, folder, folder / "1" / "model.onnx")
    return GenerationScheduler(LlmBackend().load(spec).extra[MODEL_KEY])


def rendered(messages: Sequence[Mapping[str, object]]) -> str:
    """What the tiny model's chat template makes of `messages`, written out by hand."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


async def greedy_reply(
    engine: GenerationScheduler, prompt: str, **sampling: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A non-streamed answer of an engine (greedy unless `sampling` says otherwise): its
    one response's outputs, and that response's parameters."""
    sink = RecordingSink()
    inputs = {
        "text_input": np.array([prompt.encode()], dtype=object),
        "exclude_input_in_output": np.array([True]),
        "sampling_parameters": np.array(
            [json.dumps({"temperature": 0} | sampling).encode()], dtype=object
        ),
    }
    await engine.submit(WorkItem(inputs, 1, context=RequestContext(responses=sink)))
    await sink.until_final()
    assert not sink.errors, sink.errors
    (response,) = sink.responses
    return response, dict(sink.sent[-1].parameters or {})


async def greedy_answer(
    engine: GenerationScheduler, prompt: str, **sampling: Any
) -> tuple[str, list[int], str]:
    """A non-streamed answer's text, tokens and finish reason (`greedy_reply`)."""
    response, _ = await greedy_reply(engine, prompt, **sampling)
    text = response["text_output"][0].decode()
    return text, [int(i) for i in response["output_ids"]], response["finish_reason"][0].decode()
