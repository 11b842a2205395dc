"""Tool calling on /v1/chat/completions with the official `openai` client, against real
ge-serve processes:

- `tool_stream`, Triton's OpenAI front end's test model (tests/tool_parser_models/
  tool_stream_py) rewritten here: it streams a tool call in 8-character fragments, in
  Mistral's format, or Llama 3's where the prompt says LLAMA; "big-tool-args" makes the
  argument 2000 characters; ECHO answers the prompt itself (which shows what the chat
  template was given); TEXT FIRST writes "Sure. " before the call. Served with
  `--tool-call-parser mistral` and with `llama3`.
- `guided_echo`, a TensorRT-LLM-style model (guided_decoding_guide_type /
  guided_decoding_guide inputs, no sampling_parameters) that answers what it got.
- the tiny random-weight `llm` model (tests/llmrepo.py), whose answers are JSON only where
  a named `tool_choice` or "required" constrains them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from llmrepo import write_tiny_llm
from pymodels import write_model
from serverproc import ServerProcess, running_server

if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
else:
    openai = pytest.importorskip("openai", reason="the openai client is not installed (test extra)")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

TOOL_STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils

CHUNK = 8


def response(text):
    return pb_utils.InferenceResponse(
        [
            pb_utils.Tensor("text_output", np.array([[text.encode()]], dtype=object)),
            pb_utils.Tensor("num_input_tokens", np.array([[1]], dtype=np.int32)),
            pb_utils.Tensor("num_output_tokens", np.array([[1]], dtype=np.int32)),
        ]
    )


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            tensor = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            prompt = tensor.reshape(-1)[0].decode("utf-8")
            arg = "A" * (2000 if "big-tool-args" in prompt else 5)
            if "ECHO" in prompt:
                text = prompt
            elif "TEXT FIRST" in prompt:
                call = '{"name": "get_current_weather", "arguments": {"city": "Oslo"}}'
                tagged = "<|python_tag|>" + call if "LLAMA" in prompt else f"[TOOL_CALLS][{call}]"
                text = "Sure. " + tagged
            elif "LLAMA" in prompt:
                text = '{"name": "get_current_weather", "parameters": {"city": "' + arg + '"}}'
            else:
                text = (
                    '[TOOL_CALLS][{"name": "get_current_weather", '
                    '"arguments": {"city": "' + arg + '"}}]'
                )
            for start in range(0, len(text), CHUNK):
                sender.send(response(text[start : start + CHUNK]))
            sender.send(response(""), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Triton's config, with a chat template that prints the tools' names.
TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %}{{ t.function.name }},{% endfor %}\\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}"
    "{% if m.tool_calls %} CALLS:{{ m.tool_calls[0].function.arguments.city }}{% endif %}"
    "\\n{% endfor %}"
)
CONFIG = f"""
name: "tool_stream"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1, 1 ] }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1, 1 ] }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1, 1 ] optional: true }},
  {{ name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1, 1 ] optional: true }},
  {{ name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1, 1 ] optional: true }},
  {{ name: "temperature" data_type: TYPE_FP32 dims: [ 1, 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ 1, -1 ] }},
  {{ name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1, 1 ] }},
  {{ name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1, 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "chat_template_source" value: {{ string_value: "{TEMPLATE}" }} }}
"""

WEATHER: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": 0, "maximum": 24}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
ASK: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Weather in Paris?"}]


GUIDED_ECHO = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            got = {}
            for name in ("guided_decoding_guide_type", "guided_decoding_guide"):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    got[name] = tensor.as_numpy().reshape(-1)[0].decode("utf-8")
            text = json.dumps(got).encode()
            out = pb_utils.Tensor("text_output", np.array([[text]], dtype=object))
            request.get_response_sender().send(
                pb_utils.InferenceResponse([out]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""
GUIDED_CONFIG = f"""
name: "guided_echo"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1, 1 ] }},
  {{ name: "max_tokens" data_type: TYPE_INT32 dims: [ 1, 1 ] optional: true }},
  {{ name: "guided_decoding_guide_type" data_type: TYPE_STRING dims: [ 1, 1 ] optional: true }},
  {{ name: "guided_decoding_guide" data_type: TYPE_STRING dims: [ 1, 1 ] optional: true }}
]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ 1, -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "chat_template_source" value: {{ string_value: "{TEMPLATE}" }} }}
"""


def _repo(root: Path) -> Path:
    write_model(root, "tool_stream", TOOL_STREAM, CONFIG)
    write_model(root, "guided_echo", GUIDED_ECHO, GUIDED_CONFIG)
    return root


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = _repo(tmp_path_factory.mktemp("tools-mistral"))
    extra = ["--tool-call-parser", "mistral", "--max-tool-call-parse-bytes", "1024"]
    with running_server([repo], extra) as proc:
        yield proc


@pytest.fixture(scope="module")
def llama3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = _repo(tmp_path_factory.mktemp("tools-llama3"))
    write_tiny_llm(repo, parameters={"max_model_len": "512", "kv_cache_blocks": "128"})
    with running_server([repo], ["--tool-call-parser", "llama3"], timeout=120.0) as proc:
        yield proc


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")


def _stream(server: ServerProcess, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks of a streamed chat, as JSON."""
    chunks = []
    url = server.base_url + "/v1/chat/completions"
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line.removeprefix("data: ")))
    return chunks


def _weather_call(message: Any) -> dict[str, Any]:
    """The message's one call's arguments, checked to be the weather call."""
    (call,) = message.tool_calls
    assert isinstance(call, openai.types.chat.ChatCompletionMessageToolCall)
    assert call.type == "function" and call.id
    assert call.function.name == "get_current_weather"
    arguments: dict[str, Any] = json.loads(call.function.arguments)
    return arguments


@pytest.mark.parametrize("parser", ["mistral", "llama3"])
def test_auto_tool_calls_are_parsed(request: pytest.FixtureRequest, parser: str) -> None:
    server: ServerProcess = request.getfixturevalue(parser)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "LLAMA weather" if parser == "llama3" else "weather"}
    ]
    with _client(server) as client:
        chat = client.chat.completions.create(
            model="tool_stream", messages=messages, tools=[WEATHER, TIME]
        )
    choice = chat.choices[0]
    assert _weather_call(choice.message) == {"city": "AAAAA"}
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content


@pytest.mark.parametrize("parser", ["mistral", "llama3"])
def test_streamed_auto_tool_calls(request: pytest.FixtureRequest, parser: str) -> None:
    server: ServerProcess = request.getfixturevalue(parser)
    prompt = "LLAMA weather" if parser == "llama3" else "weather"
    body = {
        "model": "tool_stream",
        "messages": [{"role": "user", "content": prompt}],
        "tools": [WEATHER],
    }
    chunks = _stream(server, body)
    calls = [c for chunk in chunks for c in chunk["choices"][0]["delta"].get("tool_calls", [])]
    assert calls and calls[0]["index"] == 0 and calls[0]["id"] and calls[0]["type"] == "function"
    assert calls[0]["function"] == {"name": "get_current_weather", "arguments": ""}
    # vLLM's: the arguments follow in pieces as the model writes them (8 characters a
    # response here), joined the unstreamed answer's.
    assert all(set(c) == {"index", "function"} and c["index"] == 0 for c in calls[1:])
    assert len(calls) > 3
    arguments = "".join(c["function"]["arguments"] for c in calls)
    with _client(server) as client:
        whole = client.chat.completions.create(**body)  # type: ignore[call-overload]
    assert arguments == whole.choices[0].message.tool_calls[0].function.arguments
    assert json.loads(arguments) == {"city": "AAAAA"}
    # No text of the call leaks as content.
    assert not "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert reasons == ["tool_calls"]


def test_a_stream_past_the_parse_limit_ends_with_length(mistral: ServerProcess) -> None:
    body = {
        "model": "tool_stream",
        "messages": [{"role": "user", "content": "big-tool-args"}],
        "tools": [WEATHER],
    }
    reasons = [c["choices"][0]["finish_reason"] for c in _stream(mistral, body)]
    assert [r for r in reasons if r] == ["length"]
    # Without tools, no parse, no limit: the whole text.
    del body["tools"]
    chunks = _stream(mistral, body)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert len(text) > 2000 and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_tools_reach_the_template_and_none_answers_text(mistral: ServerProcess) -> None:
    with _client(mistral) as client:
        chat = client.chat.completions.create(
            model="tool_stream",
            messages=[{"role": "user", "content": "ECHO"}],
            tools=[WEATHER, TIME],
            tool_choice="none",
        )
    message = chat.choices[0].message
    assert message.content is not None
    assert message.content.startswith("TOOLS:get_current_weather,get_time,")
    assert not message.tool_calls and chat.choices[0].finish_reason == "stop"


def test_a_replayed_tool_call_renders(mistral: ServerProcess) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "ECHO"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "abcdefghi",
                    "type": "function",
                    "function": {"name": "get_current_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "abcdefghi", "content": "sunny"},
    ]
    with _client(mistral) as client:
        chat = client.chat.completions.create(
            model="tool_stream", messages=messages, tools=[WEATHER], tool_choice="none"
        )
    assert "CALLS:Oslo" in (chat.choices[0].message.content or "")
    assert "tool: sunny" in (chat.choices[0].message.content or "")


def test_forcing_a_model_without_sampling_keys_is_400(mistral: ServerProcess) -> None:
    body = {
        "model": "tool_stream",
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_current_weather"}},
    }
    refused = httpx.post(mistral.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "tool_choice" and error["code"] == "unsupported_parameter"


def test_a_named_tool_choice_constrains_the_arguments(llama3: ServerProcess) -> None:
    # The weights are random: only the constraint makes the arguments the tool's JSON.
    with _client(llama3) as client:
        for seed in range(3):
            chat = client.chat.completions.create(
                model="tiny_llm",
                messages=ASK,
                tools=[WEATHER, TIME],
                tool_choice={"type": "function", "function": {"name": "get_current_weather"}},
                max_tokens=100,
                seed=seed,
            )
            choice = chat.choices[0]
            arguments = _weather_call(choice.message)
            assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
            # vLLM's: a forced function stops with "stop", and the content is empty.
            assert choice.finish_reason == "stop" and not choice.message.content


def test_a_named_tool_choice_streams_its_arguments(llama3: ServerProcess) -> None:
    body = {
        "model": "tiny_llm",
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_current_weather"}},
        "max_tokens": 100,
        "seed": 1,
    }
    chunks = _stream(llama3, body)
    calls = [c for chunk in chunks for c in chunk["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["function"]["name"] == "get_current_weather" and calls[0]["id"]
    assert {c["index"] for c in calls} == {0}
    arguments = json.loads("".join(c["function"]["arguments"] for c in calls))
    assert set(arguments) == {"city"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_required_tool_choice_calls_the_tools(llama3: ServerProcess) -> None:
    with _client(llama3) as client:
        for seed in range(3):
            chat = client.chat.completions.create(
                model="tiny_llm",
                messages=ASK,
                tools=[WEATHER, TIME],
                tool_choice="required",
                parallel_tool_calls=False,
                max_tokens=150,
                seed=seed,
            )
            choice = chat.choices[0]
            assert choice.finish_reason == "tool_calls", choice
            (call,) = choice.message.tool_calls or []
            assert isinstance(call, openai.types.chat.ChatCompletionMessageToolCall)
            arguments = json.loads(call.function.arguments)
            expected = {"get_current_weather": {"city"}, "get_time": {"zone"}}
            assert set(arguments) == expected[call.function.name]
    body = {
        "model": "tiny_llm",
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 150,
        "seed": 0,
    }
    chunks = _stream(llama3, body)
    calls = [c for chunk in chunks for c in chunk["choices"][0]["delta"].get("tool_calls", [])]
    # One call, streamed as it grows: a first delta names it, the rest add arguments.
    assert {c["index"] for c in calls} == {0} and calls[0]["id"]
    assert calls[0]["function"]["name"] in ("get_current_weather", "get_time")
    assert all("id" not in c for c in calls[1:])
    json.loads("".join(c["function"]["arguments"] for c in calls))
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("parser", ["mistral", "llama3"])
def test_text_before_a_call_streamed_and_not(request: pytest.FixtureRequest, parser: str) -> None:
    server: ServerProcess = request.getfixturevalue(parser)
    prompt = "TEXT FIRST" + (" LLAMA" if parser == "llama3" else "")
    body = {"model": "tool_stream", "messages": [{"role": "user", "content": prompt}]}
    with _client(server) as client:
        chat = client.chat.completions.create(**body, tools=[WEATHER])  # type: ignore[call-overload]
    message = chat.choices[0].message
    chunks = _stream(server, {**body, "tools": [WEATHER]})
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    calls = [c for chunk in chunks for c in chunk["choices"][0]["delta"].get("tool_calls", [])]
    reason = chunks[-1]["choices"][0]["finish_reason"]
    if parser == "llama3":
        # Triton's: a llama3 call only where the answer begins with one.
        assert message.content == content and content.startswith("Sure. <|python_tag|>{")
        assert message.tool_calls is None and not calls
        assert chat.choices[0].finish_reason == reason == "stop"
    else:
        # The text before [TOOL_CALLS] is the content, as written, both ways.
        assert message.content == content == "Sure. "
        assert _weather_call(message) == {"city": "Oslo"}
        assert [c["function"]["name"] for c in calls if "id" in c] == ["get_current_weather"]
        assert chat.choices[0].finish_reason == reason == "tool_calls"


def test_no_calls_no_tool_calls_field(mistral: ServerProcess) -> None:
    # vLLM's and OpenAI's: an answer without calls has no `tool_calls`, not [].
    body = {"model": "tool_stream", "messages": [{"role": "user", "content": "ECHO"}]}
    answer = httpx.post(
        mistral.base_url + "/v1/chat/completions", json={**body, "tools": [WEATHER]}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    assert "tool_calls" not in answer.json()["choices"][0]["message"]
    chunks = _stream(mistral, {**body, "tools": [WEATHER]})
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in chunks)


@pytest.mark.parametrize(
    "tool_choice", [{"type": "function", "function": {"name": "get_current_weather"}}, "required"]
)
def test_a_trtllm_model_gets_the_guided_decoding_inputs(
    mistral: ServerProcess, tool_choice: Any
) -> None:
    body = {"model": "guided_echo", "messages": ASK, "tools": [WEATHER], "tool_choice": tool_choice}
    answer = httpx.post(mistral.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    message = answer.json()["choices"][0]["message"]
    # A named function's answer is its arguments: here, what the model got.
    got = (
        json.loads(message["tool_calls"][0]["function"]["arguments"])
        if message.get("tool_calls")
        else None
    )
    if isinstance(tool_choice, dict):
        assert got is not None and got["guided_decoding_guide_type"] == "json_schema"
        # The schema with xgrammar's strict default written in (vLLM's default backend):
        # the model compiles it with whichever grammar backend it has.
        assert json.loads(got["guided_decoding_guide"]) == {
            **WEATHER["function"]["parameters"],
            "additionalProperties": False,
        }
    else:
        # "required": the array of calls (not read as calls: no calls, no content).
        assert got is None and message["content"] == ""
    formats = [
        ({"type": "json_object"}, "json", None),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}},
            "json_schema",
            {"type": "array"},
        ),
    ]
    for response_format, kind, guide in formats:
        body = {"model": "guided_echo", "messages": ASK, "response_format": response_format}
        answer = httpx.post(mistral.base_url + "/v1/chat/completions", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        got = json.loads(answer.json()["choices"][0]["message"]["content"])
        assert got["guided_decoding_guide_type"] == kind
        assert (
            json.loads(got["guided_decoding_guide"]) if guide else got.get("guided_decoding_guide")
        ) == guide
    body = {
        "model": "guided_echo",
        "messages": ASK,
        "structured_outputs": {"choice": ['a "b"', "c"]},
    }
    answer = httpx.post(mistral.base_url + "/v1/chat/completions", json=body, timeout=30)
    got = json.loads(answer.json()["choices"][0]["message"]["content"])
    assert got == {
        "guided_decoding_guide_type": "ebnf_grammar",
        "guided_decoding_guide": 'root ::= "a \\"b\\"" | "c"',
    }


def test_required_with_defs_calls_the_tool(llama3: ServerProcess) -> None:
    # Pydantic's nested models: `$defs` and "#/$defs/..." (vLLM hoists them to the root).
    item = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}},
        "required": ["name"],
        "additionalProperties": False,
    }
    tool = {
        "type": "function",
        "function": {
            "name": "add_item",
            "parameters": {
                "$defs": {"Item": item},
                "type": "object",
                "properties": {"item": {"$ref": "#/$defs/Item"}},
                "required": ["item"],
                "additionalProperties": False,
            },
        },
    }
    body = {
        "model": "tiny_llm",
        "messages": ASK,
        "tools": [tool],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 150,
        "seed": 0,
    }
    answer = httpx.post(llama3.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    (call,) = answer.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "add_item"
    assert set(json.loads(call["function"]["arguments"])["item"]) == {"name"}


def test_a_required_answer_cut_short_is_no_content(llama3: ServerProcess) -> None:
    body = {
        "model": "tiny_llm",
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 4,
        "seed": 0,
    }
    answer = httpx.post(llama3.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["message"]["content"] == "" and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "length"
    chunks = _stream(llama3, body)
    # Not the constrained JSON's beginning as content, as vLLM's.
    assert not "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert all("tool_calls" not in c["choices"][0]["delta"] for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
