"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`), served
on the chat path as vLLM 0.34 serves it (server/http/openai/anthropic*.py).

Two models behind one server with --tool-call-parser hermes and --reasoning-parser
qwen3: the llm backend's tiny model (tests/llmrepo.py: real tokens, stop strings, a
tokenizer to count with), and `echo`, a Python model that answers its user's last
message as written (the whole prompt where that is "?prompt"), three characters a
piece, so that tags come split across pieces. Requests to the tiny model turn thinking
off (`thinking: disabled`, the template's `enable_thinking` false), since its text has
no thoughts for the qwen3 parser to read.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from anthropicrepo import CALL, WEATHER, write_models
from openai_inprocess import openai_client

from ge_serve.server.http.openai import anthropic
from ge_serve.server.http.openai.anthropic import MessagesRequest
from ge_serve.server.http.openai.schemas import ChatCompletionRequest
from ge_serve.server.http.openai.tools import ToolSettings

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

MESSAGES = "/v1/messages"
OFF = {"type": "disabled"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    folder: Path = tmp_path_factory.mktemp("anthropic")
    write_models(folder)
    tools = ToolSettings(parser="hermes", reasoning_parser="qwen3")
    async with openai_client(folder, ["echo", "tiny"], tools) as client:
        yield client


def _body(model: str, said: str, **fields: Any) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": said}],
        **fields,
    }


async def _message(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(MESSAGES, json=body)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def _events(http: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream's events, each its data, checked against its `event:` line."""
    response = await http.post(MESSAGES, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for frame in response.text.strip().split("\n\n"):
        head, data = frame.split("\n")
        found = json.loads(data.removeprefix("data: "))
        assert head == f"event: {found['type']}"
        events.append(found)
    return events


def _blocks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The content blocks the deltas build, as the message has them."""
    blocks: list[dict[str, Any]] = []
    raw = ""
    for found in events:
        if found["type"] == "content_block_start":
            assert found["index"] == len(blocks)
            blocks.append(dict(found["content_block"]))
            raw = ""
        elif found["type"] == "content_block_delta":
            block, delta = blocks[found["index"]], found["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                assert delta["type"] == "input_json_delta"
                raw += delta["partial_json"]
                block["input"] = json.loads(raw) if raw.endswith("}") else block["input"]
    return blocks


async def test_a_plain_message(http: httpx.AsyncClient) -> None:
    answer = await _message(http, _body("echo", "Hello there", thinking=OFF, metadata={}))
    assert answer["id"].startswith("msg_")
    del answer["id"]
    assert answer == {
        "type": "message",
        "role": "assistant",
        "model": "echo",
        "content": [{"type": "text", "text": "Hello there"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 1},
    }


async def test_the_system_prompt_and_blocks_reach_the_template(http: httpx.AsyncClient) -> None:
    body = _body("echo", "", thinking=OFF)
    body["system"] = [{"type": "text", "text": "Be brief."}]
    body["messages"] = [
        {"role": "user", "content": [{"type": "text", "text": "?prompt"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                          {"type": "text", "text": "Sure"}]},
        {"role": "user", "content": [{"type": "text", "text": "?prompt"}]},
    ]  # fmt: skip
    answer = await _message(http, body)
    assert answer["content"][0]["text"].startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n?prompt<|im_end|>\n"
        "<|im_start|>assistant\n[thought hm]Sure<|im_end|>\n"
        "<|im_start|>user\n?prompt<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_billing_headers_are_stripped_as_vllm_strips_them(http: httpx.AsyncClient) -> None:
    billing = "x-anthropic-billing-header: cc; "
    body = _body("echo", "?prompt", thinking=OFF, system=billing + "Be brief.")
    body["messages"] = [
        {"role": "system", "content": billing + "inline"},
        {"role": "system", "content": [{"type": "text", "text": billing}]},
        *body["messages"],
    ]
    answer = await _message(http, body)
    # A top-level string is kept whole; inline system messages and blocks lose the header.
    assert answer["content"][0]["text"].startswith(
        f"<|im_start|>system\n{billing}Be brief.<|im_end|>\n<|im_start|>user\n?prompt"
    )
    system = [{"type": "text", "text": billing}, {"type": "text", "text": "Hi."}]
    blocks = _body("echo", "?prompt", thinking=OFF, system=system)
    answer = await _message(http, blocks)
    assert answer["content"][0]["text"].startswith("<|im_start|>system\nHi.<|im_end|>\n")


async def test_a_tool_use_turn_and_its_result_reach_the_template(http: httpx.AsyncClient) -> None:
    body = _body("echo", "", thinking=OFF, tools=[WEATHER])
    body["messages"] = [
        {"role": "user", "content": "?prompt"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "20C"}]}]},
    ]  # fmt: skip
    text = (await _message(http, body))["content"][0]["text"]
    assert (
        '<|im_start|>assistant\n[call weather {"city": "Oslo"}]<|im_end|>\n'
        "<|im_start|>tool\n[toolu_1] Sunny\n20C<|im_end|>\n<|im_start|>assistant\n"
    ) in text


async def test_a_tool_use_answer_whole_and_streamed(http: httpx.AsyncClient) -> None:
    body = _body("echo", "Let me look." + CALL, thinking=OFF, tools=[WEATHER])
    answer = await _message(http, body)
    assert answer["stop_reason"] == "tool_use" and answer["stop_sequence"] is None
    text, call = answer["content"]
    assert text == {"type": "text", "text": "Let me look."}
    assert call["type"] == "tool_use" and call["id"]
    assert (call["name"], call["input"]) == ("weather", {"city": "Oslo"})
    events = await _events(http, body)
    partial = [
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    ]
    assert len(partial) > 1 and json.loads("".join(partial)) == {"city": "Oslo"}
    streamed = _blocks(events)
    assert streamed[0] == text
    assert {k: streamed[1][k] for k in ("type", "name", "input")} == {
        "type": "tool_use", "name": "weather", "input": {"city": "Oslo"},
    }  # fmt: skip
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


async def test_a_named_tool_is_a_tool_use(http: httpx.AsyncClient) -> None:
    choice = {"type": "tool", "name": "weather"}
    body = _body("echo", '{"city": "Bergen"}', thinking=OFF, tools=[WEATHER], tool_choice=choice)
    answer = await _message(http, body)
    assert answer["stop_reason"] == "tool_use"
    [call] = answer["content"]
    assert (call["type"], call["input"]) == ("tool_use", {"city": "Bergen"})


async def test_a_named_call_cut_by_a_stop_sequence_is_not_a_tool_use(
    http: httpx.AsyncClient,
) -> None:
    # The grammar writes `{"city": ...`; the stop string cuts the arguments short.
    choice = {"type": "tool", "name": "weather"}
    body = _body("tiny", "K", temperature=0, thinking=OFF, tools=[WEATHER], tool_choice=choice,
                 stop_sequences=["city"])  # fmt: skip
    answer = await _message(http, body)
    assert (answer["stop_reason"], answer["stop_sequence"]) == ("stop_sequence", "city")
    events = await _events(http, body)
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "city"}


async def test_thinking_blocks_whole_and_streamed(http: httpx.AsyncClient) -> None:
    body = _body("echo", "<think>Two and two.</think>It is 4.")
    answer = await _message(http, body)
    thinking, text = answer["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "Two and two."
    assert thinking["signature"]
    assert text == {"type": "text", "text": "It is 4."}
    events = await _events(http, body)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    blocks = _blocks(events)
    assert [b["type"] for b in blocks] == ["thinking", "text"]
    assert blocks[0]["thinking"] == "Two and two." and blocks[0]["signature"]
    assert blocks[1] == text
    # The thinking block's signature comes last, before its stop.
    stop = kinds.index("content_block_stop")
    assert events[stop - 1]["delta"]["type"] == "signature_delta"


async def test_streamed_events_in_order_join_to_the_whole(http: httpx.AsyncClient) -> None:
    body = _body("tiny", "K", max_tokens=3, temperature=0, thinking=OFF)
    whole = await _message(http, body)
    events = await _events(http, body)
    start = events[0]
    assert start["type"] == "message_start"
    message = start["message"]
    assert message["id"].startswith("msg_") and message["content"] == []
    assert (message["type"], message["role"], message["model"]) == ("message", "assistant", "tiny")
    assert message["stop_reason"] is None and message["stop_sequence"] is None
    kinds = [e["type"] for e in events]
    deltas = kinds.count("content_block_delta")
    assert kinds == [
        "message_start", "content_block_start", *["content_block_delta"] * deltas,
        "content_block_stop", "message_delta", "message_stop",
    ]  # fmt: skip
    assert _blocks(events) == whole["content"]
    assert events[-2]["delta"] == {"stop_reason": whole["stop_reason"], "stop_sequence": None}
    assert events[-2]["usage"] == whole["usage"]
    assert events[-1] == {"type": "message_stop"}


async def test_max_tokens_and_stop_sequences(http: httpx.AsyncClient) -> None:
    body = _body("tiny", "K", max_tokens=3, temperature=0, thinking=OFF)
    cut = await _message(http, body)
    text = cut["content"][0]["text"]
    assert (cut["stop_reason"], cut["stop_sequence"]) == ("max_tokens", None)
    assert len(text) == 3 and cut["usage"]["output_tokens"] == 3
    stop = text[1:]
    stopped = await _message(http, {**body, "stop_sequences": [stop]})
    assert stopped["content"] == [{"type": "text", "text": text[:1]}]
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", stop)
    events = await _events(http, {**body, "stop_sequences": [stop]})
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}


async def test_count_tokens_is_the_chat_prompts_count(http: httpx.AsyncClient) -> None:
    messages = [{"role": "user", "content": "How many?"}]
    chat = await http.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "system", "content": "Count."}, *messages],
              "max_tokens": 1},
    )  # fmt: skip
    assert chat.status_code == 200, chat.text
    body = {"model": "tiny", "system": "Count.", "messages": messages}
    counted = await http.post("/v1/messages/count_tokens", json=body)
    assert counted.status_code == 200, counted.text
    assert counted.json() == {"input_tokens": chat.json()["usage"]["prompt_tokens"]}


async def test_a_large_body_becomes_a_chat_request_off_the_loop(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[bool] = []
    convert = MessagesRequest.chat

    def recorded(self: MessagesRequest) -> ChatCompletionRequest:
        threads.append(threading.current_thread() is threading.main_thread())
        return convert(self)

    monkeypatch.setattr(MessagesRequest, "chat", recorded)
    await _message(http, _body("echo", "Hi", thinking=OFF))
    large = _body("echo", "Hi", thinking=OFF)
    large["messages"][0]["content"] = [{"type": "text", "text": "x" * 99}] * 1000  # ~ 100 kB
    await _message(http, large)
    assert threads == [True, False]  # on the loop's thread only while small


async def test_count_tokens_counts_past_the_context_up_to_its_bound(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The tiny model's context is 256 tokens: vLLM counts such a conversation (a client
    # asks before it compacts one), which /v1/messages would refuse.
    messages = [{"role": "user", "content": "Hi"}] * 257
    counted = await http.post(
        "/v1/messages/count_tokens", json={"model": "tiny", "messages": messages}
    )
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] > 256
    answered = await http.post(MESSAGES, json={**_body("tiny", "Hi"), "messages": messages})
    assert "257 messages" in _error(answered, 400, "invalid_request_error")
    # The bound itself (65,536 messages: bodies past this client's 1 MiB) made small.
    assert anthropic.COUNTED_MESSAGES == 65536
    monkeypatch.setattr(anthropic, "COUNTED_MESSAGES", 300)
    huge = [{"role": "user", "content": "Hi"}] * 301
    refused = await http.post("/v1/messages/count_tokens", json={"model": "tiny", "messages": huge})
    message = _error(refused, 400, "invalid_request_error")
    assert "301 messages; count_tokens counts at most 300" in message


def _error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    found = response.json()
    assert found["type"] == "error" and set(found["error"]) == {"type", "message"}
    assert found["error"]["type"] == kind
    message: str = found["error"]["message"]
    return message


async def test_errors_are_anthropics(http: httpx.AsyncClient) -> None:
    body = _body("echo", "Hi")
    del body["max_tokens"]
    missing = await http.post(MESSAGES, json=body)
    assert "max_tokens" in _error(missing, 400, "invalid_request_error")
    unknown = await http.post(MESSAGES, json=_body("nope", "Hi"))
    assert "nope" in _error(unknown, 404, "not_found_error")
    role = _body("echo", "Hi")
    role["messages"][0]["role"] = "tool"
    assert "messages[0].role" in _error(await http.post(MESSAGES, json=role), 400,
                                        "invalid_request_error")  # fmt: skip
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    pictured = _body("echo", "Hi")
    pictured["messages"][0]["content"] = [image]
    assert "Image" in _error(await http.post(MESSAGES, json=pictured), 400,
                             "invalid_request_error")  # fmt: skip
    unknown_block = _body("echo", "Hi")
    unknown_block["messages"][0]["content"] = [{"type": "video"}]
    assert "messages[0].content[0].type" in _error(await http.post(MESSAGES, json=unknown_block),
                                                   400, "invalid_request_error")  # fmt: skip
    hosted = _body("echo", "Hi", tools=[{"type": "web_search_20250305", "name": "web_search"}])
    assert "not supported" in _error(await http.post(MESSAGES, json=hosted), 400,
                                     "invalid_request_error")  # fmt: skip
    bad_json = await http.post(MESSAGES, content=b"{", headers={"content-type": "application/json"})
    _error(bad_json, 400, "invalid_request_error")
    no_tokenizer = await http.post("/v1/messages/count_tokens", json=_body("echo", "Hi"))
    assert "tokenizer" in _error(no_tokenizer, 400, "invalid_request_error")
    wrong_method = await http.get(MESSAGES)
    _error(wrong_method, 405, "invalid_request_error")


@pytest.mark.parametrize(
    ("content", "named"),
    [([{"type": "tool_use", "id": "t", "name": "weather", "input": [1]}],
      "'messages[0].content[0].input'"),
     ([{"type": "text", "text": "Hi"}, {"type": "text", "text": 5}],
      "'messages[0].content[1].text'"),
     ([{"type": "tool_result", "tool_use_id": "t", "content": [3]}],
      "'messages[0].content[0].content[0]'"),
     ([{"type": "text"}], "Missing required parameter: 'messages[0].content[0].text'"),
     ([{"type": "text", "text": ""}], "'messages': no message has content")],
)  # fmt: skip
async def test_a_wrong_field_of_a_block_is_named(
    http: httpx.AsyncClient, content: list[dict[str, Any]], named: str
) -> None:
    body = _body("echo", "Hi")
    body["messages"][0]["content"] = content
    for path in (MESSAGES, "/v1/messages/count_tokens"):
        response = await http.post(path, json=body)
        assert named in _error(response, 400, "invalid_request_error")


async def test_anthropic_headers_are_accepted(http: httpx.AsyncClient) -> None:
    headers = {"x-api-key": "key", "anthropic-version": "2023-06-01"}
    response = await http.post(MESSAGES, json=_body("echo", "Hi", thinking=OFF), headers=headers)
    assert response.status_code == 200 and response.json()["content"][0]["text"] == "Hi"


async def test_the_anthropic_sdk_reads_the_answers(http: httpx.AsyncClient) -> None:
    # Untyped: the SDK (2.x) speaks over httpx2, not httpx; it gets the same application.
    anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed")
    import httpx2

    inprocess: Any = http._transport  # openai_client's ASGI transport, to its application
    transport = httpx2.ASGITransport(app=inprocess.app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://test") as own:
        client = anthropic.AsyncAnthropic(base_url="http://test", api_key="k", http_client=own)
        await _sdk_answers(client, anthropic)


async def _sdk_answers(client: Any, anthropic: Any) -> None:
    said = "<think>Hm.</think>Looking." + CALL
    asked: dict[str, Any] = {
        "model": "echo",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": said}],
        "tools": [WEATHER],
    }
    whole = await client.messages.create(**asked)
    assert [block.type for block in whole.content] == ["thinking", "text", "tool_use"]
    assert whole.stop_reason == "tool_use" and whole.content[2].input == {"city": "Oslo"}
    async with client.messages.stream(**asked) as stream:
        final = await stream.get_final_message()
    assert [block.type for block in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[0].thinking == "Hm." and final.content[1].text == "Looking."
    assert final.content[2].input == {"city": "Oslo"} and final.stop_reason == "tool_use"
    counted = await client.messages.count_tokens(model="tiny", messages=asked["messages"])
    assert counted.input_tokens > 0
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.create(**{**asked, "model": "nope"})


async def test_a_thinking_budget_needs_the_llm_engine(http: httpx.AsyncClient) -> None:
    # vLLM's mapping makes it chat's `thinking_token_budget`, which only the `llm` engine
    # is told how to enforce (a Python model would get keys it does not know).
    thinking = {"type": "enabled", "budget_tokens": 1024}
    body = _body("echo", "Hi", max_tokens=1100, thinking=thinking)
    response = await http.post(MESSAGES, json=body)
    assert "needs a model of the 'llm' backend" in _error(response, 400, "invalid_request_error")
