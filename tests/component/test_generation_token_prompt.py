"""A prompt given as token ids: the `llm` engine's optional input `input_ids` (TensorRT-LLM's
name; INT32 or INT64 [-1]), what /v1/completions' token prompts and a client with its own
tokenizer send. The ids are the prompt's tokens as given (no tokenizer call, no special
tokens added, as vLLM takes a token prompt), so greedy answers equal those of the text
they encode; a request carries exactly one of `text_input` and `input_ids`, and an id
outside the tokenizer's is refused in vLLM's words. The tiny model (tests/llmrepo.py: a
byte-level tokenizer of 257 tokens under 320 logits), driven in process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llmrepo
import numpy as np
import pytest
from google.protobuf import text_format
from recording_sink import RecordingSink

from ge_serve.backends.base import ModelSpec, RequestContext
from ge_serve.backends.llm.backend import LlmBackend
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = pytest.mark.timeout(120)

PROMPT = "The quick brown fox"
TOKENS = 12
TEXT_REQUIRED = 'input { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }'
TEXT_OPTIONAL = 'input { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] optional: true }'
GREEDY = json.dumps({"temperature": 0}).encode()


def write(tmp_path: Path, data_type: str = "TYPE_INT32", text: str = TEXT_OPTIONAL) -> Path:
    """The tiny model with `input_ids` of `data_type` declared beside `text_input`."""
    folder = llmrepo.write_tiny_llm(tmp_path, "m", {"max_num_batched_tokens": "16"})
    path = folder / "config.pbtxt"
    config = path.read_text().replace(TEXT_REQUIRED, text)
    path.write_text(
        config
        + f'input {{ name: "input_ids" data_type: {data_type} dims: [ -1 ] optional: true }}\n'
        + 'output { name: "prompt_logprobs" data_type: TYPE_STRING dims: [ -1 ] }\n'
    )
    return folder


def load(folder: Path) -> None:
    text = (folder / "config.pbtxt").read_text()
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    LlmBackend().load(ModelSpec(folder.name, 1, config, folder, folder / "1" / "model.onnx"))


def prompt_input(prompt: str | list[int], dtype: Any = np.int32) -> dict[str, Any]:
    if isinstance(prompt, str):
        return {"text_input": np.array([prompt.encode()], dtype=object)}
    return {"input_ids": np.array(prompt, dtype=dtype)}


async def ask(
    engine: GenerationScheduler, given: dict[str, Any], sampling: bytes = GREEDY, **more: Any
) -> dict[str, Any]:
    """The one response of a non-streamed request with the inputs `given` (and `more`)."""
    sink = RecordingSink()
    inputs = {
        **given,
        "max_tokens": np.array([TOKENS], np.int32),
        "sampling_parameters": np.array([sampling], dtype=object),
        **more,
    }
    await engine.submit(WorkItem(inputs, 1, context=RequestContext(responses=sink)))
    await sink.until_final()
    assert not sink.errors, sink.errors
    (response,) = sink.responses
    return response


async def refused(engine: GenerationScheduler, given: dict[str, Any]) -> str:
    with pytest.raises(ServerError) as caught:
        await ask(engine, given)
    assert caught.value.code is ErrorCode.INVALID_ARG
    return caught.value.message


@pytest.mark.parametrize("data_type", ["TYPE_INT32", "TYPE_INT64"])
async def test_ids_answer_as_the_text_they_encode(tmp_path: Path, data_type: str) -> None:
    engine = llmrepo.engine_of(write(tmp_path, data_type))
    dtype = np.int32 if data_type == "TYPE_INT32" else np.int64
    ids = llmrepo.prompt_ids(PROMPT)
    try:
        by_text = await ask(engine, prompt_input(PROMPT))
        by_ids = await ask(engine, prompt_input(ids, dtype))
        expected = llmrepo.reference_greedy(PROMPT, TOKENS)
        assert by_ids["output_ids"].tolist() == by_text["output_ids"].tolist() == expected
        # Not excluded, the answer repeats the prompt: the ids decoded.
        assert by_ids["text_output"][0] == by_text["text_output"][0]
        assert by_ids["text_output"][0].decode().startswith(PROMPT)
        assert int(by_ids["num_input_tokens"][0]) == len(ids)
    finally:
        await engine.close(1)


async def test_ids_are_taken_as_given_and_echoed_with_special_tokens(tmp_path: Path) -> None:
    engine = llmrepo.engine_of(write(tmp_path))
    eos = llmrepo.tiny_model().eos_id
    # The EOS id inside the prompt stays a prompt token; its echo keeps it, as vLLM's
    # decoding of a token prompt does.
    ids = [eos, *llmrepo.prompt_ids("Hi"), eos]
    echoed = f"{llmrepo.EOS_TOKEN}Hi{llmrepo.EOS_TOKEN}".encode()
    try:
        answer = await ask(engine, prompt_input(ids))
        assert int(answer["num_input_tokens"][0]) == len(ids)
        excluded = await ask(engine, prompt_input(ids), exclude_input_in_output=np.array([True]))
        assert answer["text_output"][0] == echoed + excluded["text_output"][0]
    finally:
        await engine.close(1)


async def test_prompt_logprobs_of_ids_equal_those_of_the_text(tmp_path: Path) -> None:
    engine = llmrepo.engine_of(write(tmp_path))
    sampling = json.dumps({"temperature": 0, "prompt_logprobs": 2}).encode()
    try:
        by_text = await ask(engine, prompt_input(PROMPT), sampling)
        by_ids = await ask(engine, prompt_input(llmrepo.prompt_ids(PROMPT)), sampling)
        found = json.loads(by_ids["prompt_logprobs"][0])
        assert len(found) == len(PROMPT) and found[0] is None and found[1]
        assert found == json.loads(by_text["prompt_logprobs"][0])
    finally:
        await engine.close(1)


async def test_bad_token_prompts_are_invalid_arg_in_vllms_words(tmp_path: Path) -> None:
    engine = llmrepo.engine_of(write(tmp_path, "TYPE_INT64"))
    ids = llmrepo.prompt_ids("hi")
    try:
        # vLLM's bound: the model's 320 logits (past the tokenizer's 257 ids).
        assert await refused(engine, prompt_input([*ids, llmrepo.VOCAB], np.int64)) == (
            f"Token id {llmrepo.VOCAB} is out of vocabulary"
        )
        assert await refused(engine, prompt_input([5, -1, 400], np.int64)) == (
            "Token id -1 is out of vocabulary"
        )
        # Past int32: compared as sent, never wrapped into the vocabulary.
        assert await refused(engine, prompt_input([2**32 + 5], np.int64)) == (
            f"Token id {2**32 + 5} is out of vocabulary"
        )
        assert await refused(engine, prompt_input([], np.int64)) == (
            "The decoder prompt cannot be empty: input_ids holds no token ids"
        )
        one = (
            "a request carries exactly one of the inputs 'text_input' (the prompt as text) "
            "and 'input_ids' (the prompt as token ids)"
        )
        both = {**prompt_input("hi"), **prompt_input(ids, np.int64)}
        assert await refused(engine, both) == f"{one}; it has both"
        assert await refused(engine, {}) == f"{one}; it has neither"
        # Ids of the longest prompt the context holds, plus one: the text's rule.
        long = await refused(engine, prompt_input([65] * 256, np.int64))
        assert long.startswith("This model's maximum context length is 256 tokens")
        # The engine still answers.
        assert (await ask(engine, prompt_input(ids, np.int64)))["output_ids"].size
    finally:
        await engine.close(1)


def test_input_ids_with_a_required_text_input_fail_the_load(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="input 'text_input' must be optional") as caught:
        load(write(tmp_path / "a", text=TEXT_REQUIRED))
    assert "'input_ids'" in str(caught.value)
    for data_type in ("TYPE_FP32", "TYPE_INT16"):
        with pytest.raises(ValueError, match="must be TYPE_INT32 or TYPE_INT64 with dims"):
            load(write(tmp_path / data_type, data_type))
