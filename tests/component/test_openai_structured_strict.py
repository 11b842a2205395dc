"""A JSON schema on /v1 (a named tool_choice, response_format json_schema, vLLM's
`structured_outputs`, the Responses API's text.format) allows only the properties it
declares where it does not say `additionalProperties`, as vLLM's default backend
(xgrammar's strict_mode) reads it: the tiny random model (tests/llmrepo.py), free to
write a key of its own, opens one at once and seldom ends it, cut by max_tokens."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import pytest
import pytest_asyncio
from openai_inprocess import openai_client

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

# LangChain's bind_tools schema: no additionalProperties; its one property optional.
PARAMETERS = {"type": "object", "properties": {"a": {"type": "boolean"}}}
ASK = [{"role": "user", "content": "Hi"}]
SEEDS = range(4)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-structured-strict")
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["tiny"]) as client:
        yield client


async def post(http: httpx.AsyncClient, path: str, **fields: Any) -> dict[str, Any]:
    body = {"model": "tiny", "max_tokens": 80, "temperature": 1.0, **fields}
    response = await http.post(path, json=body)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def test_a_named_tools_arguments_have_its_properties_only(http: httpx.AsyncClient) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": PARAMETERS}}
    named = {"type": "function", "function": {"name": "f"}}
    for seed in SEEDS:
        answer = await post(
            http, "/v1/chat/completions", messages=ASK, tools=[tool], tool_choice=named, seed=seed
        )
        choice = answer["choices"][0]
        (call,) = choice["message"]["tool_calls"]
        arguments = json.loads(call["function"]["arguments"])
        assert set(arguments) <= {"a"} and choice["finish_reason"] == "stop", (seed, arguments)


async def test_a_json_schema_answer_has_its_properties_only(http: httpx.AsyncClient) -> None:
    formats: list[dict[str, Any]] = [
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": PARAMETERS},
            }
        },
        # Triton's frontend sends the option false: the same reading.
        {"structured_outputs": {"json": PARAMETERS, "disable_additional_properties": False}},
    ]
    for fields in formats:
        for seed in SEEDS:
            answer = await post(http, "/v1/chat/completions", messages=ASK, seed=seed, **fields)
            choice = answer["choices"][0]
            content = json.loads(choice["message"]["content"])
            assert set(content) <= {"a"} and choice["finish_reason"] == "stop", (seed, content)


async def test_the_responses_text_format_has_its_properties_only(
    http: httpx.AsyncClient,
) -> None:
    text = {"format": {"type": "json_schema", "name": "x", "schema": PARAMETERS}}
    for seed in SEEDS:
        response = await http.post(
            "/v1/responses",
            json={
                "model": "tiny",
                "input": "Hi",
                "max_output_tokens": 80,
                "seed": seed,
                "text": text,
            },
        )
        assert response.status_code == 200, response.text
        found = response.json()
        content = json.loads(found["output"][-1]["content"][0]["text"])
        assert set(content) <= {"a"} and found["status"] == "completed", (seed, content)
