"""A response's `output` items sent back as the next request's `input` (POST
/v1/responses), as the OpenAI Agents SDK and pydantic-ai send every earlier item: its
`reasoning` item (with --reasoning-parser), `message` and `function_call` items, as vLLM
0.34 takes them (responses/utils.py `_construct_message_from_response_item`): the
thoughts become the assistant message's `reasoning`, which the chat template is given as
`reasoning` and `reasoning_content` (so on chat too).

The stand-in `echo` answers its user's last message as written, streamed three
characters a piece; to "?prompt" it answers `<think>echo</think>` and then the prompt it
was given, each `<` written `[` (so that no parser reads the echoed tags). Its template
prints an assistant's thoughts, calls and content, and a tool message's call id.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from openai_inprocess import error, openai_client
from pymodels import write_model

from ge_serve.server.http.openai.tools import ToolSettings

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

ECHO = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            prompt = prompt.reshape(-1)[0].decode("utf-8")
            stream = pb_utils.get_input_tensor_by_name(request, "stream")
            stream = stream is not None and bool(stream.as_numpy().reshape(-1)[0])
            said = prompt.rsplit("<|im_start|>user\\n", 1)[-1].split("<|im_end|>", 1)[0]
            if said == "?prompt":
                said = "<think>echo</think>" + prompt.replace("<", "[")
            pieces = [said[at : at + 3] for at in range(0, len(said), 3)] or [""]
            sender = request.get_response_sender()
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            if not stream:
                sender.send(self.response(said, "stop"), flags=final)
                continue
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
            ]
        )
"""

# Qwen3's shape: ChatML, an assistant's thoughts in <think> (both of vLLM's names printed,
# to show both arrive), its calls as hermes <tool_call>s, the call a tool message answers.
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}{{ '\\n' }}"
    "{% if m['reasoning'] is defined %}<think>{{ m['reasoning'] }}|"
    "{{ m['reasoning_content'] }}</think>{% endif %}"
    "{{ m['content'] }}"
    "{% for c in m['tool_calls'] or [] %}<tool_call>{{ c['function'] | tojson }}"
    "</tool_call>{% endfor %}"
    "{% if m['tool_call_id'] %} FOR {{ m['tool_call_id'] }}{% endif %}"
    "<|im_end|>{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\\n' }}{% endif %}"
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
  {{ name: "finish_reason" data_type: TYPE_STRING dims: [ 1 ] }}
]
parameters {{ key: "chat_template_source" value {{ string_value: {json.dumps(TEMPLATE)} }} }}
"""

WEATHER = {
    "type": "function",
    "name": "weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
# The first answer: thoughts, then a call (hermes).
THINK_AND_CALL = (
    '<think>I need the tool.</think><tool_call>{"name": "weather", "arguments": '
    '{"city": "Rome"}}</tool_call>'
)
RESPONSES = "/v1/responses"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-responses-replay")
    write_model(folder, "echo", ECHO, CONFIG)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = ToolSettings(parser="hermes", reasoning_parser="qwen3")
    async with openai_client(repo, ["echo"], settings) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plain(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    """No parsers: reasoning items are taken all the same, as vLLM takes them."""
    async with openai_client(repo, ["echo"]) as client:
        yield client


def client_of(http: httpx.AsyncClient) -> Any:
    openai = pytest.importorskip("openai", reason="the openai client is not installed")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http)


def echoed(prompt: str) -> str:
    """The echo's answer to "?prompt", as a parser leaves its content."""
    return prompt.replace("<", "[")


def replayed_prompt(call_id: str) -> str:
    """The prompt of the second turn: the first turn's thoughts and call, then the tool's
    answer, rendered by the template."""
    return (
        f"<|im_start|>user\n{THINK_AND_CALL}<|im_end|>\n"
        "<|im_start|>assistant\n<think>I need the tool.|I need the tool.</think>"
        '<tool_call>{"name": "weather", "arguments": {"city": "Rome"}}</tool_call><|im_end|>\n'
        f"<|im_start|>tool\nsunny FOR {call_id}<|im_end|>\n"
        "<|im_start|>user\n?prompt<|im_end|>\n<|im_start|>assistant\n"
    )


async def post(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post(RESPONSES, json={"model": "echo", **body})
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def streamed(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    """The response a streamed answer completes with."""
    done = None
    async with http.stream(
        "POST", RESPONSES, json={"model": "echo", "stream": True, **body}
    ) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                if event["type"] == "response.completed":
                    done = event["response"]
    assert done is not None
    found: dict[str, Any] = done
    return found


def first_turn_items(output: list[dict[str, Any]]) -> str:
    """The first answer's items are the thoughts and the call; its call id."""
    assert [item["type"] for item in output] == ["reasoning", "function_call"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": "I need the tool."}]
    call_id: str = output[1]["call_id"]
    return call_id


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_output_items_sent_back_verbatim(server: httpx.AsyncClient, stream: bool) -> None:
    ask = streamed if stream else post
    first = await ask(server, input=THINK_AND_CALL, tools=[WEATHER])
    call_id = first_turn_items(first["output"])
    # Every item as it came (ids, statuses, null encrypted_content...), then the tool's.
    history = [{"role": "user", "content": THINK_AND_CALL}, *first["output"]]
    turn = [
        {"type": "function_call_output", "call_id": call_id, "output": "sunny"},
        {"role": "user", "content": "?prompt"},
    ]
    second = await ask(server, input=history + turn, tools=[WEATHER])
    (thoughts, message) = second["output"]
    assert thoughts["content"][0]["text"] == "echo"
    assert message["content"][0]["text"] == echoed(replayed_prompt(call_id))


async def test_the_openai_client_sends_the_output_back(server: httpx.AsyncClient) -> None:
    client = client_of(server)
    first = await client.responses.create(model="echo", input=THINK_AND_CALL, tools=[WEATHER])
    call = first.output[1]
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    # The client's own objects, as OpenAI's guides write it: `input += response.output`.
    history: list[Any] = [{"role": "user", "content": THINK_AND_CALL}, *first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
    second = await client.responses.create(
        model="echo", input=[*history, {"role": "user", "content": "?prompt"}], tools=[WEATHER]
    )
    assert second.output_text == echoed(replayed_prompt(call.call_id))
    # And the messages of that answer, sent back in turn: the thoughts join the message.
    third = await client.responses.create(
        model="echo",
        input=[
            {"role": "user", "content": "Hi"},
            *second.output,
            {"role": "user", "content": "?prompt"},
        ],
        tools=[WEATHER],
    )
    thought_and_said = f"<think>echo|echo</think>{second.output_text}"
    assert third.output_text == echoed(
        f"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n{thought_and_said}<|im_end|>\n"
        "<|im_start|>user\n?prompt<|im_end|>\n<|im_start|>assistant\n"
    )


async def test_reasoning_items_without_a_parser(plain: httpx.AsyncClient) -> None:
    # vLLM's reading: the first content part, else the first summary part; an item that
    # follows an assistant message joins it, one that follows its thoughts starts a turn.
    items = [
        {"role": "user", "content": "Q"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "S1"},
                                          {"type": "summary_text", "text": "S2"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A"}]},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "R"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"role": "user", "content": "?prompt"},
    ]  # fmt: skip
    found = await post(plain, input=items)
    expected = (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>S1|S1</think>A<|im_end|>\n"
        "<|im_start|>assistant\n<think>R|R</think><|im_end|>\n"
        "<|im_start|>assistant\n<think>|</think><|im_end|>\n"
        "<|im_start|>user\n?prompt<|im_end|>\n<|im_start|>assistant\n"
    )
    # No parser: the whole answer is the message's text.
    assert found["output"][0]["content"][0]["text"] == "<think>echo</think>" + echoed(expected)


async def test_chat_gives_an_assistants_thoughts_to_the_template(
    plain: httpx.AsyncClient,
) -> None:
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "A", "reasoning": "R"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "B", "reasoning_content": "old name"},
        {"role": "user", "content": "?prompt"},
    ]
    response = await plain.post(
        "/v1/chat/completions", json={"model": "echo", "messages": messages}
    )
    assert response.status_code == 200, response.text
    expected = (
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>R|R</think>A<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n<think>old name|old name</think>B<|im_end|>\n"
        "<|im_start|>user\n?prompt<|im_end|>\n<|im_start|>assistant\n"
    )
    content = response.json()["choices"][0]["message"]["content"]
    assert content == "<think>echo</think>" + echoed(expected)


async def test_unfinished_thoughts_last_are_continued(plain: httpx.AsyncClient) -> None:
    # vLLM's should_continue_final_message: a reasoning item `in_progress` last.
    items = [
        {"role": "user", "content": "?prompt"},
        {"type": "reasoning", "summary": [], "status": "in_progress",
         "content": [{"type": "reasoning_text", "text": "Hmm"}]},
    ]  # fmt: skip
    response = await plain.post(RESPONSES, json={"model": "echo", "input": items})
    # The prompt ends where the (empty) message's text would begin, after the thoughts.
    assert response.status_code == 200, response.text
    prompt = "<|im_start|>user\n?prompt<|im_end|>\n<|im_start|>assistant\n<think>Hmm|Hmm</think>"
    text = response.json()["output"][0]["content"][0]["text"]
    assert text == "<think>echo</think>" + echoed(prompt)


@pytest.mark.parametrize(
    ("item", "param", "words"),
    [
        (
            {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"},
            "input[1].encrypted_content",
            "Encrypted content is not supported.",
        ),
        (
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text"}]},
            "input[1].content[0].text",
            "Missing required parameter: 'input[1].content[0].text'",
        ),
        (
            {"type": "reasoning", "summary": "S"},
            "input[1].summary",
            "Invalid value for 'input[1].summary'",
        ),
    ],
    ids=["encrypted", "no_text", "bad_summary"],
)
async def test_what_is_refused(
    server: httpx.AsyncClient, item: dict[str, Any], param: str, words: str
) -> None:
    items = [{"role": "user", "content": "Q"}, item]
    found = error(await server.post(RESPONSES, json={"model": "echo", "input": items}))
    assert found["param"] == param
    assert found["message"].startswith(words)
