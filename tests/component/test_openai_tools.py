"""Tool calling's checks and refusals on /v1/chat/completions (server/http/openai/tools.py),
in vLLM's words, on a server without --tool-call-parser; and what a forced tool choice
sends a model that takes vLLM's sampling keys: tests/textgen.py's echo model, whose
SHOW_PARAMS answer is the JSON of what it got."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import error, openai_client

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "SHOW_PARAMS"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}
NAMED = {"type": "function", "function": {"name": "weather"}}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return textgen.write(tmp_path_factory.mktemp("openai-tools"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["textgen"]) as client:
        yield client


async def refused(http: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    return error(await http.post(CHAT, json={"model": "textgen", "messages": HELLO, **fields}))


async def test_auto_without_a_parser_is_refused(http: httpx.AsyncClient) -> None:
    for fields in ({"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "auto"}):
        found = await refused(http, **fields)
        assert found["param"] == "tool_choice"
        assert found["message"] == '"auto" tool choice requires --tool-call-parser to be set'


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"tool_choice": "required"},
            "tool_choice",
            "When using `tool_choice`, `tools` must be set.",
        ),
        (
            {"tools": [WEATHER], "tool_choice": "sometimes"},
            "tool_choice",
            "Invalid value for `tool_choice`: sometimes!",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
            "The tool `x` specified in `tool_choice` does not match any of the specified `tools`",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function"}},
            "tool_choice.function",
            "Invalid value for `function`: `None` in `tool_choice`!",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {}}},
            "tool_choice.function.name",
            "Expected field `name` in `function` in `tool_choice`!",
        ),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name", ""),
        ({"tools": [{"type": "retrieval", "function": {"name": "a"}}]}, "tools[0].type", ""),
        (
            {"tools": [{"type": "function", "function": {"name": "a", "parameters": []}}]},
            "tools[0].function.parameters",
            "",
        ),
        (
            {
                "tools": [WEATHER],
                "tool_choice": NAMED,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA},
                },
            },
            "tool_choice",
            "You can only either use constraints for structured outputs or tools, not both.",
        ),
        ({"functions": [{"name": "a"}]}, "functions", "legacy function calling"),
        ({"function_call": "auto"}, "function_call", "legacy function calling"),
    ],
)
async def test_bad_tool_fields_are_400_naming_them(
    http: httpx.AsyncClient, fields: dict[str, Any], param: str, words: str
) -> None:
    found = await refused(http, **fields)
    assert found["param"] == param and words in found["message"], found


async def test_a_named_choice_sends_the_functions_schema(http: httpx.AsyncClient) -> None:
    body = {"model": "textgen", "messages": HELLO, "tools": [WEATHER], "tool_choice": NAMED}
    answer = await http.post(CHAT, json=body)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    # The echo model's answer (what it got) is the call's arguments.
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "weather"
    sent = json.loads(call["function"]["arguments"])["sampling"]
    assert json.loads(sent["structured_outputs"]) == {"json": SCHEMA}
    assert choice["message"]["content"] == "" and choice["finish_reason"] == "stop"


async def test_required_sends_the_array_of_calls_schema(http: httpx.AsyncClient) -> None:
    body = {"model": "textgen", "messages": HELLO, "tools": [WEATHER], "tool_choice": "required"}
    answer = await http.post(CHAT, json=body)
    assert answer.status_code == 200, answer.text
    message = answer.json()["choices"][0]["message"]
    # The echo model writes no calls: none are made up.
    assert message["tool_calls"] == [] and message["content"] == ""


async def test_none_and_empty_tools_answer_text(http: httpx.AsyncClient) -> None:
    for fields in (
        {"tools": [WEATHER], "tool_choice": "none"},
        {"tools": [], "tool_choice": "auto"},
    ):
        answer = await http.post(CHAT, json={"model": "textgen", "messages": HELLO, **fields})
        assert answer.status_code == 200, answer.text
        message = answer.json()["choices"][0]["message"]
        assert "structured_outputs" not in json.loads(message["content"])["sampling"]
