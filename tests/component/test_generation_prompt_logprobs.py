"""The `llm` engine's prompt log probabilities (vLLM's `prompt_logprobs`) against a numpy
log-softmax of the reference's logits at every prompt position (tests/llama_reference.py):
the first response's `prompt_logprobs` output is vLLM's list, null for the first token,
then {token_id: {logprob, rank, decoded_token}} per prompt token, the token first. The
tiny model (tests/llmrepo.py), driven in process, its prefill cut into chunks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llmrepo
import numpy as np
import numpy.typing as npt
import onnx
import pytest
from recording_sink import RecordingSink

from ge_serve.backends.base import RequestContext
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

# 45 tokens: three prefill chunks of at most 16 (max_num_batched_tokens), 5 full blocks.
PROMPT = "The quick brown fox jumps over the lazy dog, twice"
CHUNKED = {"max_num_batched_tokens": "16"}


def engine(tmp_path: Path, hidden: bool = True) -> GenerationScheduler:
    folder = llmrepo.write_tiny_llm(tmp_path, "m", CHUNKED)
    if not hidden:  # a graph built before the output existed
        path = folder / "1" / "model.onnx"
        graph = onnx.load(str(path))
        kept = [o for o in graph.graph.output if o.name != "hidden_states"]
        del graph.graph.output[:]
        graph.graph.output.extend(kept)
        onnx.save_model(graph, str(path))
    with (folder / "config.pbtxt").open("a") as config:
        config.write('output { name: "prompt_logprobs" data_type: TYPE_STRING dims: [ -1 ] }\n')
    return llmrepo.engine_of(folder)


async def ask(scheduler: GenerationScheduler, sampling: dict[str, Any]) -> RecordingSink:
    sink = RecordingSink()
    inputs: dict[str, Any] = {
        "text_input": np.array([PROMPT.encode()], dtype=object),
        "max_tokens": np.array([2], np.int32),
        "stream": np.array([True]),
        "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=object),
    }
    await scheduler.submit(WorkItem(inputs, 1, context=RequestContext(responses=sink)))
    await sink.until_final()
    return sink


def reference() -> npt.NDArray[np.float64]:
    """The reference's log-softmax at every prompt position."""
    import llama_reference

    model = llmrepo.tiny_model()
    logits = llama_reference.forward(model.weights, model.cfg, llmrepo.prompt_ids(PROMPT), first=0)
    peak = logits.max(-1, keepdims=True)
    result: npt.NDArray[np.float64] = (
        logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))
    )
    return result


def check(entries: list[Any], top: int) -> None:
    ids = llmrepo.prompt_ids(PROMPT)
    expected = reference()
    assert len(entries) == len(ids) > 32 and entries[0] is None
    for position, (token, entry) in enumerate(zip(ids[1:], entries[1:], strict=True)):
        row = expected[position]
        best = [int(i) for i in np.argsort(-row, kind="stable")[:top]]
        keys = [int(k) for k in entry]
        assert keys[0] == token, position
        assert [k for k in keys if k != token] == [b for b in best if b != token]
        rank = int(np.count_nonzero(row >= row[token]))
        assert entry[str(token)]["rank"] == (best.index(token) + 1 if token in best else rank)
        for key, value in entry.items():
            assert value["logprob"] == pytest.approx(row[int(key)], abs=1e-3)


async def test_prompt_logprobs_over_chunks_equal_the_reference(tmp_path: Path) -> None:
    scheduler = engine(tmp_path)
    try:
        sink = await ask(scheduler, {"temperature": 0, "ignore_eos": True, "prompt_logprobs": 2})
        assert sink.final and not sink.errors, sink.errors
        check(json.loads(sink.responses[0]["prompt_logprobs"][0]), 2)
        # The first response only.
        assert all("prompt_logprobs" not in r for r in sink.responses[1:])
    finally:
        await scheduler.close(1)


async def test_a_cached_prefix_is_computed_again_for_prompt_logprobs(tmp_path: Path) -> None:
    scheduler = engine(tmp_path)
    try:
        first = await ask(scheduler, {"temperature": 0})  # leaves the prompt's blocks cached
        assert not first.errors
        sink = await ask(scheduler, {"temperature": 0, "prompt_logprobs": 0})
        assert sink.final and not sink.errors, sink.errors
        check(json.loads(sink.responses[0]["prompt_logprobs"][0]), 0)
        hits = scheduler.generation_stats.prefix_cache_hits
        assert hits == 0
    finally:
        await scheduler.close(1)


@pytest.mark.parametrize(
    ("hidden", "sampling", "words"),
    [
        (False, {"prompt_logprobs": 1}, "its step graph has no 'hidden_states' output"),
        (True, {"prompt_logprobs": -2}, "prompt_logprobs must be non-negative or -1, got -2."),
        (
            True,
            {"prompt_logprobs": 21},
            "Requested prompt logprobs of 21, which is greater than max allowed: 20",
        ),
    ],
)
async def test_refusals(tmp_path: Path, hidden: bool, sampling: dict[str, Any], words: str) -> None:
    scheduler = engine(tmp_path, hidden)
    try:
        with pytest.raises(ServerError) as caught:
            await ask(scheduler, sampling)
        assert caught.value.code is ErrorCode.INVALID_ARG and words in str(caught.value)
        # Without prompt_logprobs the same model serves as before.
        sink = await ask(scheduler, {"temperature": 0})
        assert sink.final and not sink.errors
        assert "prompt_logprobs" not in sink.responses[0]
    finally:
        await scheduler.close(1)
