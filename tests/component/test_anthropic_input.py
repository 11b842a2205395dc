"""What a Messages request (`POST /v1/messages`, `/v1/messages/count_tokens`) may not
silently lose, and the fields its refusals name: a refusal of chat's checks names the
Messages API's field (and `tool_choice` as sent); a tool's schema, an image in `system`
and a thinking budget below 1024 are 400s; a call whose arguments the model wrote as a
JSON string is the same `input` whole and streamed.

`echo` and the tiny model (tests/anthropicrepo.py), and `plain` (`echo` without
`sampling_parameters`), behind one server with --tool-call-parser hermes and no
--reasoning-parser.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from anthropicrepo import CONFIG, ECHO, WEATHER, write_models
from openai_inprocess import openai_client
from pymodels import write_model

from ge_serve.server.http.openai.tools import ToolSettings

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    folder: Path = tmp_path_factory.mktemp("anthropic-input")
    write_models(folder)
    # `echo` without `sampling_parameters`: nothing constrains its answer.
    sampling = (
        ' },\n  { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }'
    )
    assert sampling in CONFIG
    write_model(folder, "plain", ECHO, CONFIG.replace("echo", "plain").replace(sampling, " }"))
    tools = ToolSettings(parser="hermes")
    async with openai_client(folder, ["echo", "tiny", "plain"], tools) as client:
        yield client


def _body(model: str, said: str, **fields: Any) -> dict[str, Any]:
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": said}]}
    return body | fields


async def _refused(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> str:
    """The message of a 400 in Anthropic's shape."""
    response = await http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    message: str = error["message"]
    return message


@pytest.mark.parametrize(
    ("stops", "said"),
    [(["a"] * 100, "'stop_sequences': at most 64 strings, got 100"),
     (["a" * 2000], "'stop_sequences' strings must be at most 1024 characters long")],
)  # fmt: skip
async def test_the_engines_stop_limits_name_stop_sequences(
    http: httpx.AsyncClient, stops: list[str], said: str
) -> None:
    body = _body("tiny", "K", stop_sequences=stops)
    for stream in (False, True):
        assert await _refused(http, MESSAGES, body | {"stream": stream}) == said


async def test_a_budget_without_a_reasoning_parser_names_budget_tokens(
    http: httpx.AsyncClient,
) -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    message = await _refused(
        http, MESSAGES, _body("echo", "Hi", max_tokens=2000, thinking=thinking)
    )
    assert message.startswith("'thinking.budget_tokens' is set but reasoning_config")
    assert "thinking_token_budget" not in message


@pytest.mark.parametrize(
    ("choice", "said"),
    [({"type": "any"}, 'tool_choice {"type": "any"} is not supported by the model'),
     ({"type": "tool", "name": "weather"},
      'tool_choice {"type": "tool", "name": "weather"} is not supported by the model')],
)  # fmt: skip
async def test_a_forced_tool_a_model_cannot_constrain_names_the_choice_as_sent(
    http: httpx.AsyncClient, choice: dict[str, Any], said: str
) -> None:
    body = _body("plain", "Hi", tools=[WEATHER], tool_choice=choice)
    assert (await _refused(http, MESSAGES, body)).startswith(said)


async def test_a_tools_defs_refusal_names_its_input_schema(http: httpx.AsyncClient) -> None:
    tool = {"name": "w", "input_schema": {"type": "object", "$defs": 5}}
    body = _body("echo", "Hi", tools=[tool], tool_choice={"type": "any"})
    said = "`$defs` in the input_schema of tool 'w' must be an object, got int."
    assert await _refused(http, MESSAGES, body) == said


@pytest.mark.parametrize("schema", [{"type": "array"}, {"type": ["object", "null"]}])
async def test_a_tool_schema_that_is_no_object_is_refused(
    http: httpx.AsyncClient, schema: dict[str, Any]
) -> None:
    tool = {"name": "listing", "input_schema": schema}
    body = _body("echo", "Hi", tools=[tool], tool_choice={"type": "tool", "name": "listing"})
    for path in (MESSAGES, COUNT):
        message = await _refused(http, path, body)
        assert message.startswith("Invalid value for 'tools[0].input_schema': its type must be")


@pytest.mark.parametrize(
    "system",
    [[{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}],
     [{"type": "text", "text": "Be brief."}, {"type": "image"}]],
)  # fmt: skip
async def test_an_image_in_the_system_prompt_is_refused(
    http: httpx.AsyncClient, system: list[dict[str, Any]]
) -> None:
    for path in (MESSAGES, COUNT):
        message = await _refused(http, path, _body("tiny", "K", system=system))
        assert message.startswith("Image content is not supported")
    inline = _body("tiny", "K")
    inline["messages"].insert(0, {"role": "system", "content": system})
    assert (await _refused(http, MESSAGES, inline)).startswith("Image content is not supported")


async def test_count_tokens_takes_vllms_budget_rule(http: httpx.AsyncClient) -> None:
    body = _body("tiny", "K", thinking={"type": "enabled", "budget_tokens": 100})
    del body["max_tokens"]  # count_tokens has none
    said = await _refused(http, COUNT, body)
    assert said == "thinking.budget_tokens must be at least 1024"
    assert said == await _refused(http, MESSAGES, body | {"max_tokens": 8})
    body["thinking"] = {"type": "enabled"}
    assert "'thinking.budget_tokens'" in await _refused(http, COUNT, body)
    body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    counted = await http.post(COUNT, json=body)  # no max_tokens to stay below
    assert counted.status_code == 200, counted.text


def _streamed_input(text: str) -> tuple[list[str], Any]:
    """The tool_use block's input_json_delta pieces, and their JSON joined."""
    pieces = []
    for frame in text.strip().split("\n\n"):
        found = json.loads(frame.split("\n")[1].removeprefix("data: "))
        delta = found.get("delta", {})
        if found["type"] == "content_block_delta" and delta["type"] == "input_json_delta":
            pieces.append(delta["partial_json"])
    return pieces, json.loads("".join(pieces))


@pytest.mark.parametrize(
    ("arguments", "given"),
    [('"{\\"city\\": \\"Oslo\\"}"', {"city": "Oslo"}),  # OpenAI's form: a JSON string
     ('"Oslo"', {}), ("[1, 2]", {}), ('{"city": "Oslo"}', {"city": "Oslo"})],
)  # fmt: skip
async def test_a_calls_input_is_the_same_whole_and_streamed(
    http: httpx.AsyncClient, arguments: str, given: dict[str, Any]
) -> None:
    said = f'<tool_call>{{"name": "weather", "arguments": {arguments}}}</tool_call>'
    body = _body("echo", said, max_tokens=64, tools=[WEATHER])
    whole = await http.post(MESSAGES, json=body)
    assert whole.status_code == 200, whole.text
    [call] = whole.json()["content"]
    assert (call["type"], call["input"]) == ("tool_use", given)
    streamed = await http.post(MESSAGES, json=body | {"stream": True})
    assert streamed.status_code == 200, streamed.text
    pieces, found = _streamed_input(streamed.text)
    assert found == given
    assert len(pieces) > 1 if arguments.startswith("{") else len(pieces) == 1  # held whole
