"""Streamed `"auto"` tool calls as they grow (server/http/openai/toolstream.py), as vLLM
0.34's hermes parser streams them: a first delta that names the call, then its arguments
in pieces, before the model ends.

The stand-in `echo` answers with its user's last message as written, streamed three
characters a piece, so that a call's tags and JSON come split across pieces.
"""

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
import textgen
from openai_inprocess import openai_client
from pymodels import write_model

from ge_serve.server.http.openai.tools import ToolSettings

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHAT = "/v1/chat/completions"

ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "text_input")
            prompt = tensor.as_numpy().reshape(-1)[0].decode("utf-8")
            said = prompt.rsplit("<|im_start|>user\\n", 1)[-1].split("<|im_end|>", 1)[0]
            pieces = [said[at : at + 3] for at in range(0, len(said), 3)]
            sender = request.get_response_sender()
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            for index, piece in enumerate(pieces):
                last = index == len(pieces) - 1
                found = self.response(piece, "stop" if last else "None")
                sender.send(found, flags=final if last else 0)
        return None

    def response(self, text, reason):
        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
                pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)),
                pb_utils.Tensor("num_input_tokens", np.array([7], np.int32)),
                pb_utils.Tensor("num_output_tokens", np.array([1], np.int32)),
            ]
        )
"""

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
)

CONFIG = f"""
name: "echo"
backend: "python"
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "finish_reason" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] }}
]
parameters {{ key: "chat_template_source" value {{ string_value: {json.dumps(TEMPLATE)} }} }}
"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
# SmolLM2's and Qwen's shape; the second call written without spaces, as a model may.
CALLS = (
    "Let me look.<tool_call>\n"
    '{"name": "weather", "arguments": {"city": "Oslo", "days": [1, 2], "note": "fjord ÿ"}}\n'
    "</tool_call>\n<tool_call>\n"
    '{"name":"weather","arguments":{"city":"Bergen","unit":null}}\n</tool_call>'
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def hermes(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    folder: Path = tmp_path_factory.mktemp("openai-tool-stream")
    write_model(folder, "echo", ECHO, CONFIG)
    # The same, with the input that takes structured outputs: "required" can be asked of it.
    constrained = CONFIG.replace('"echo"', '"echo_constrained"').replace(
        "\n]\noutput",
        ',\n  { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }'
        "\n]\noutput",
        1,
    )
    assert "sampling_parameters" in constrained
    write_model(folder, "echo_constrained", ECHO, constrained)
    models = ["echo", "echo_constrained"]
    async with openai_client(folder, models, ToolSettings(parser="hermes")) as client:
        yield client


def _body(said: str, **fields: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": said}]
    return {"model": "echo", "messages": messages, "tools": [WEATHER], **fields}


async def _choices(http: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The streamed choices of the chunks, in order."""
    found = []
    async with http.stream("POST", CHAT, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                found.append(json.loads(line[6:])["choices"][0])
    return found


async def test_a_call_is_streamed_as_it_grows(hermes: httpx.AsyncClient) -> None:
    whole = await hermes.post(CHAT, json=_body(CALLS))
    assert whole.status_code == 200, whole.text
    message = whole.json()["choices"][0]["message"]
    choices = await _choices(hermes, _body(CALLS))
    deltas = [c["delta"] for c in choices]
    content = "".join(d.get("content") or "" for d in deltas)
    assert content == message["content"] == "Let me look."
    calls = [(i, c) for i, d in enumerate(deltas) for c in d.get("tool_calls", ())]
    # Each call's first delta names it, once; the next add to its arguments only.
    firsts = [c for _, c in calls if "id" in c]
    assert [(c["index"], c["type"], c["function"]["name"]) for c in firsts] == [
        (0, "function", "weather"),
        (1, "function", "weather"),
    ]
    assert all(c["function"]["arguments"] == "" for c in firsts)
    assert firsts[0]["id"] != firsts[1]["id"]
    for index, whole_call in enumerate(message["tool_calls"]):
        pieces = [c["function"]["arguments"] for _, c in calls if c["index"] == index]
        assert len(pieces) > 3  # in pieces, as the model writes them
        assert "".join(pieces) == whole_call["function"]["arguments"]
    assert all(set(c) == {"index", "function"} for _, c in calls if "id" not in c)
    # The arguments come before the model ends, not on its last chunk.
    assert calls[0][0] < len(deltas) - 10
    reasons = [c["finish_reason"] for c in choices]
    assert reasons[-1] == "tool_calls" and not any(reasons[:-1])


async def test_the_openai_stream_helper_gathers_the_calls(hermes: httpx.AsyncClient) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is not installed")
    client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=hermes)
    argument_deltas = []
    async with client.chat.completions.stream(
        model="echo", messages=[{"role": "user", "content": CALLS}], tools=[WEATHER]
    ) as stream:
        async for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                argument_deltas.append((event.index, event.arguments_delta))
        final = await stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls is not None and [c.function.name for c in calls] == ["weather", "weather"]
    assert [json.loads(c.function.arguments) for c in calls] == [
        {"city": "Oslo", "days": [1, 2], "note": "fjord ÿ"},
        {"city": "Bergen", "unit": None},
    ]
    assert len([d for d in argument_deltas if d[0] == 0]) > 3
    assert final.choices[0].finish_reason == "tool_calls"


async def test_without_parallel_calls_the_first_streams_alone(hermes: httpx.AsyncClient) -> None:
    choices = await _choices(hermes, _body(CALLS, parallel_tool_calls=False))
    calls = [c for choice in choices for c in choice["delta"].get("tool_calls", ())]
    assert {c["index"] for c in calls} == {0}
    joined = "".join(c["function"]["arguments"] for c in calls)
    assert json.loads(joined)["city"] == "Oslo"


# A "required" answer: the array of calls its structured outputs allow.
REQUIRED = (
    '[{"name": "weather", "parameters": {"city": "Oslo", "note": "fjord \\u00ff"}}, '
    '{"name":"weather","parameters":{"city":"Bergen"}}]'
)


async def test_required_calls_are_streamed_as_they_grow(hermes: httpx.AsyncClient) -> None:
    body = _body(REQUIRED, model="echo_constrained", tool_choice="required")
    whole = await hermes.post(CHAT, json=body)
    assert whole.status_code == 200, whole.text
    message = whole.json()["choices"][0]["message"]
    assert [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]] == [
        {"city": "Oslo", "note": "fjord ÿ"},
        {"city": "Bergen"},
    ]
    choices = await _choices(hermes, body)
    deltas = [c["delta"] for c in choices]
    calls = [(i, c) for i, d in enumerate(deltas) for c in d.get("tool_calls", ())]
    firsts = [c for _, c in calls if "id" in c]
    assert [(c["index"], c["function"]) for c in firsts] == [
        (0, {"name": "weather", "arguments": ""}),
        (1, {"name": "weather", "arguments": ""}),
    ]
    for index, whole_call in enumerate(message["tool_calls"]):
        pieces = [c["function"]["arguments"] for _, c in calls if c["index"] == index]
        assert len(pieces) > 3 and "".join(pieces) == whole_call["function"]["arguments"]
    # The first call is sent before the model ends, not gathered at its end.
    assert calls[0][0] < len(deltas) - 10
    assert not "".join(d.get("content") or "" for d in deltas)
    assert choices[-1]["finish_reason"] == "tool_calls"
    # Without parallel calls, the first only.
    choices = await _choices(hermes, {**body, "parallel_tool_calls": False})
    indexes = {c["index"] for ch in choices for c in ch["delta"].get("tool_calls", ())}
    assert indexes == {0}


async def test_a_required_answer_that_is_no_calls_streams_none(hermes: httpx.AsyncClient) -> None:
    body = _body("no calls here", model="echo_constrained", tool_choice="required")
    choices = await _choices(hermes, body)
    assert not any("tool_calls" in c["delta"] for c in choices)
    assert not "".join(c["delta"].get("content") or "" for c in choices)
    assert choices[-1]["finish_reason"] == "stop"


async def test_a_broken_call_before_its_name_is_content(hermes: httpx.AsyncClient) -> None:
    said = "Hm <tool_call>{broken}</tool_call>"
    choices = await _choices(hermes, _body(said))
    assert "".join(c["delta"].get("content") or "" for c in choices) == said
    assert not any("tool_calls" in c["delta"] for c in choices)
    assert choices[-1]["finish_reason"] == "stop"


async def test_responses_stream_the_arguments_in_pieces(hermes: httpx.AsyncClient) -> None:
    body = {"model": "echo", "input": CALLS, "tools": [{"type": "function", "name": "weather"}]}
    events = []
    async with hermes.stream("POST", "/v1/responses", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    pieces = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    done = [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"]
    assert len(pieces) > 6 and "".join(pieces) == "".join(done)
    assert [json.loads(a)["city"] for a in done] == ["Oslo", "Bergen"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mistral(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    folder: Path = tmp_path_factory.mktemp("openai-tool-stream-mistral")
    write_model(folder, "echo", ECHO, CONFIG)
    textgen.write_templated(folder, "engine", "{% for m in messages %}{{ m.content }}{% endfor %}")
    models = ["echo", "engine"]
    async with openai_client(folder, models, ToolSettings(parser="mistral")) as client:
        yield client


def _sent(answer: httpx.Response) -> dict[str, Any]:
    """The sampling keys `textgen` was sent (SHOW_PARAMS)."""
    assert answer.status_code == 200, answer.text
    if answer.headers["content-type"].startswith("text/event-stream"):
        chunks = [json.loads(line[6:]) for line in answer.text.split("\n") if "data: {" in line]
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    else:
        text = answer.json()["choices"][0]["message"]["content"]
    shown: dict[str, Any] = json.loads(text)["sampling"]
    return shown


@pytest.mark.parametrize("stream", [False, True])
async def test_mistral_calls_keep_the_special_tokens_they_are_written_with(
    mistral: httpx.AsyncClient, stream: bool
) -> None:
    """`[TOOL_CALLS]` is a control token in Mistral's tokenizers: an engine that skips
    special tokens when it decodes would write the calls without it, and none would be
    read. As vLLM's mistral parser: kept where the answer may call a tool."""
    body = _body("SHOW_PARAMS", model="engine", stream=stream)
    assert _sent(await mistral.post(CHAT, json=body))["skip_special_tokens"] is False
    # The client's own value gives way, as vLLM's adjust_request overrides it.
    kept = {**body, "skip_special_tokens": True}
    assert _sent(await mistral.post(CHAT, json=kept))["skip_special_tokens"] is False
    # No tools, or none to call: the answer's text as the client asked.
    for plain in ({**body, "tool_choice": "none"}, {k: v for k, v in body.items() if k != "tools"}):
        assert "skip_special_tokens" not in _sent(await mistral.post(CHAT, json=plain))


async def test_mistral_calls_keep_their_special_tokens_on_the_responses_api(
    mistral: httpx.AsyncClient,
) -> None:
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    tool = {"type": "function", "name": "weather", "parameters": parameters}
    body = {"model": "engine", "input": "SHOW_PARAMS", "tools": [tool]}
    answer = await mistral.post("/v1/responses", json=body)
    assert answer.status_code == 200, answer.text
    (said,) = [item for item in answer.json()["output"] if item["type"] == "message"]
    assert json.loads(said["content"][0]["text"])["sampling"]["skip_special_tokens"] is False


# Mistral's tokenizer v11+ models (Small 3.2, Magistral, Devstral): a call is
# `[TOOL_CALLS]name[ARGS]{...}`, as vLLM's mistral parser reads it.
MISTRAL_CALLS = (
    'Let me look.[TOOL_CALLS]weather[ARGS]{"city": "Zürich", "when": {"days": [1, 2]}}'
    '[TOOL_CALLS]weather[ARGS]{"city":"Bergen","unit":null}'
)


async def test_mistral_v11_calls_whole_and_streamed(mistral: httpx.AsyncClient) -> None:
    whole = await mistral.post(CHAT, json=_body(MISTRAL_CALLS))
    assert whole.status_code == 200, whole.text
    choice = whole.json()["choices"][0]
    message = choice["message"]
    assert message["content"] == "Let me look." and choice["finish_reason"] == "tool_calls"
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("weather", '{"city": "Zürich", "when": {"days": [1, 2]}}'),
        ("weather", '{"city":"Bergen","unit":null}'),
    ]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in message["tool_calls"])
    choices = await _choices(mistral, _body(MISTRAL_CALLS))
    deltas = [c["delta"] for c in choices]
    assert "".join(d.get("content") or "" for d in deltas) == "Let me look."
    calls = [c for d in deltas for c in d.get("tool_calls", ())]
    firsts = [c for c in calls if "id" in c]
    assert [(c["index"], c["function"]) for c in firsts] == [
        (0, {"name": "weather", "arguments": ""}),
        (1, {"name": "weather", "arguments": ""}),
    ]
    assert all(len(c["id"]) == 9 and c["id"].isalnum() for c in firsts)
    for index, whole_call in enumerate(message["tool_calls"]):
        pieces = [c["function"]["arguments"] for c in calls if c["index"] == index]
        assert len(pieces) > 3 and "".join(pieces) == whole_call["function"]["arguments"]
    assert choices[-1]["finish_reason"] == "tool_calls"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tiny(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    folder: Path = tmp_path_factory.mktemp("openai-tool-stream-llm")
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    llmrepo.write_tiny_llm(folder, "ids")  # declares `output_ids`
    async with openai_client(folder, ["tiny", "ids"], ToolSettings(parser="hermes")) as client:
        yield client


async def test_a_held_token_has_a_chunk_with_its_logprobs(tiny: httpx.AsyncClient) -> None:
    # The byte-level tiny model writes one character a token, here forced to a call;
    # a token whose text the parser holds (part of "<tool_call>") is a chunk of its own
    # with an empty delta and its logprobs, as vLLM sends one for every output.
    said = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    regex = re.escape(said)
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [WEATHER],
        "structured_outputs": {"regex": regex},
        "logprobs": True,
        "temperature": 0,
        "max_tokens": 200,
    }
    choices = await _choices(tiny, body)
    per_chunk = [len((c["logprobs"] or {}).get("content") or ()) for c in choices[1:]]
    assert choices[-1]["finish_reason"] == "tool_calls"
    tokens = sum(per_chunk)
    assert tokens >= len(said) and per_chunk[:-1] == [1] * (len(per_chunk) - 1)
    assert {} in [c["delta"] for c in choices]
    calls = [c for choice in choices for c in choice["delta"].get("tool_calls", ())]
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Oslo"}'


async def test_a_held_token_has_a_chunk_with_its_ids(tiny: httpx.AsyncClient) -> None:
    # As with logprobs: vLLM sends a chunk for every output where `return_token_ids` is
    # asked, so each token's id comes on a chunk of its own, held text or not.
    said = '<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
    body = {
        "model": "ids",
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [WEATHER],
        "structured_outputs": {"regex": re.escape(said)},
        "return_token_ids": True,
        "temperature": 0,
        "max_tokens": 200,
    }
    choices = await _choices(tiny, body)
    per_chunk = [len(c.get("token_ids") or ()) for c in choices[1:]]
    assert choices[-1]["finish_reason"] == "tool_calls"
    assert per_chunk[:-1] == [1] * (len(per_chunk) - 1) and sum(per_chunk) >= len(said)
    assert {} in [c["delta"] for c in choices]
    whole = await tiny.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200, whole.text
    assert [i for c in choices for i in c.get("token_ids") or ()] == whole.json()["choices"][0][
        "token_ids"
    ]
