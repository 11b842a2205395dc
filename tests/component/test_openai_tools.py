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

from ge_serve.server.http.openai.tools import Tool, constraint

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "SHOW_PARAMS"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": SCHEMA}}
NAMED = {"type": "function", "function": {"name": "weather"}}
# Pydantic's schema of a nested model: the nested one in `$defs`, by `$ref`.
ITEM = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
ITEM_A = {
    "$defs": {"Item": ITEM},
    "type": "object",
    "properties": {"item": {"$ref": "#/$defs/Item"}},
}
ITEM_B = {
    "$defs": {"Item": {"type": "integer"}},
    "type": "object",
    "properties": {"item": {"$ref": "#/$defs/Item"}},
}


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
                "structured_outputs": {"json": SCHEMA},
            },
            "tool_choice",
            "You can only either use constraints for structured outputs or tools, not both.",
        ),
        (
            {"tools": [WEATHER], "tool_choice": NAMED, "guided_regex": "a+"},
            "tool_choice",
            "You can only either use constraints for structured outputs or tools, not both.",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "a", "parameters": ITEM_A}},
                    {"type": "function", "function": {"name": "b", "parameters": ITEM_B}},
                ],
                "tool_choice": "required",
            },
            "tools",
            "Tool definition 'Item' has multiple schemas, which is not supported.",
        ),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "a", "parameters": {"$defs": []}}}
                ],
                "tool_choice": "required",
            },
            "tools",
            "`$defs` in the parameters of tool 'a' must be an object, got list.",
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
    # The echo model writes no calls: none are made up, and vLLM's message then has no
    # `tool_calls` at all.
    assert "tool_calls" not in message and message["content"] == ""


async def test_required_hoists_the_tools_defs() -> None:
    draft7 = {
        "definitions": {"Zone": {"type": "integer"}},
        "type": "object",
        "properties": {"zone": {"$ref": "#/definitions/Zone"}},
    }
    tools = [
        Tool.model_validate({"type": "function", "function": {"name": n, "parameters": p}})
        # The same definition twice is one definition.
        for n, p in (("add", ITEM_A), ("put", ITEM_A), ("zone", draft7))
    ]
    forced = constraint(tools, "required")
    assert forced is not None
    schema = forced["json"]
    # vLLM's: at the root of the array schema, where "#/$defs/Item" points.
    assert schema["$defs"] == {"Item": ITEM} and schema["definitions"] == {
        "Zone": {"type": "integer"}
    }
    parameters = [item["properties"]["parameters"] for item in schema["items"]["anyOf"]]
    assert all("$defs" not in p and "definitions" not in p for p in parameters)
    assert parameters[0]["properties"] == {"item": {"$ref": "#/$defs/Item"}}
    # The request's tools are left as sent (the chat template gets them).
    assert tools[0].function.parameters == ITEM_A


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}},
        {"type": "json_object"},
    ],
)
async def test_a_named_choice_replaces_the_response_format(
    http: httpx.AsyncClient, response_format: dict[str, Any]
) -> None:
    # vLLM 0.34's adjust_request: the function's schema, response_format dropped.
    body = {
        "model": "textgen",
        "messages": HELLO,
        "tools": [WEATHER],
        "tool_choice": NAMED,
        "response_format": response_format,
    }
    answer = await http.post(CHAT, json=body)
    assert answer.status_code == 200, answer.text
    (call,) = answer.json()["choices"][0]["message"]["tool_calls"]
    sent = json.loads(call["function"]["arguments"])["sampling"]
    assert json.loads(sent["structured_outputs"]) == {"json": SCHEMA}


async def test_none_and_empty_tools_answer_text(http: httpx.AsyncClient) -> None:
    for fields in (
        {"tools": [WEATHER], "tool_choice": "none"},
        {"tools": [], "tool_choice": "auto"},
    ):
        answer = await http.post(CHAT, json={"model": "textgen", "messages": HELLO, **fields})
        assert answer.status_code == 200, answer.text
        message = answer.json()["choices"][0]["message"]
        assert "structured_outputs" not in json.loads(message["content"])["sampling"]
