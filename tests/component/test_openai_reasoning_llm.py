"""Structured outputs with --reasoning-parser over the `llm` engine's tiny model
(tests/llmrepo.py): the grammar constrains only what follows `</think>`, as vLLM's
structured-output manager does. The random model never writes `</think>`, so its
thoughts are never constrained; a prompt whose thoughts are closed constrains from the
first token."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import pytest
import pytest_asyncio
from openai_inprocess import openai_client

from ge_serve.server.http.openai.tools import ToolSettings

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

PATTERN = r"[a-c]{2,5}-\d{3}"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-reasoning-llm")
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = ToolSettings(reasoning_parser="deepseek_r1")
    async with openai_client(repo, ["tiny"], settings) as client:
        yield client


async def choice(http: httpx.AsyncClient, said: str, **fields: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": said}], **fields}
    response = await http.post("/v1/chat/completions", json=body | {"temperature": 0})
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()["choices"][0]
    return found


async def test_thoughts_that_never_end_are_not_constrained(http: httpx.AsyncClient) -> None:
    free = await choice(http, "Hello", max_tokens=24)
    assert free["finish_reason"] == "length" and free["message"]["reasoning"]
    assert not re.fullmatch(PATTERN, free["message"]["reasoning"])
    for constraint in (
        {"structured_outputs": {"regex": PATTERN}},
        {"response_format": {"type": "json_object"}},
    ):
        found = await choice(http, "Hello", max_tokens=24, **constraint)
        assert found["message"] == free["message"], constraint
        assert found["finish_reason"] == "length"


async def test_a_prompt_that_closed_its_thoughts_is_constrained_at_once(
    http: httpx.AsyncClient,
) -> None:
    # vLLM's is_reasoning_end on the prompt: its last of `<think>` / `</think>` is the end.
    found = await choice(
        http, "<think>x</think>", max_tokens=24, structured_outputs={"regex": PATTERN}
    )
    # deepseek_r1 reads an answer without `</think>` as all thoughts.
    assert re.fullmatch(PATTERN, found["message"]["reasoning"]), found
    assert found["finish_reason"] == "stop"


async def test_streams_choices_and_responses_wait_for_the_thoughts_too(
    http: httpx.AsyncClient,
) -> None:
    # The `llm` engine is the model that takes `structured_outputs_after`, on every path.
    free = (await choice(http, "Hello", max_tokens=24))["message"]["reasoning"]
    constrained = {"structured_outputs": {"regex": PATTERN}, "max_tokens": 24}
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], **constrained}
    many = await http.post("/v1/chat/completions", json=body | {"n": 2, "seed": 1})
    assert many.status_code == 200, many.text
    assert all(c["message"]["reasoning"] for c in many.json()["choices"]), many.json()
    parts = []
    stream = body | {"stream": True, "temperature": 0}
    async with http.stream("POST", "/v1/chat/completions", json=stream) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                parts.append(json.loads(line[6:])["choices"][0]["delta"].get("reasoning") or "")
    assert "".join(parts) == free
    answer = await http.post(
        "/v1/responses",
        json={"model": "tiny", "input": "Hello", "max_output_tokens": 24, "temperature": 0,
              "text": {"format": {"type": "json_object"}}},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["output"][0]["type"] == "reasoning"
