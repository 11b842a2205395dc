"""A thinking model's thoughts apart from its answer (--reasoning-parser,
server/http/openai/reasoning.py), as vLLM 0.34's deepseek_r1 and qwen3 parsers give them
on /v1/chat/completions and /v1/responses.

The stand-in `thinker` answers with its user's last message as written (with its
`sampling_parameters` where that is "?sampling"), streamed three characters a piece, so
that `<think>` and `</think>` come split across pieces; its chat template is Qwen3's
shape (ChatML, and a closed `<think></think>` where thinking is off).
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

CHAT = "/v1/chat/completions"

THINKER = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            prompt = scalar(request, "text_input", b"").decode("utf-8")
            stream = bool(scalar(request, "stream", False))
            raw = scalar(request, "sampling_parameters", b"")
            sampling = json.loads(raw) if raw else {}
            said = prompt.rsplit("<|im_start|>user\\n", 1)[-1].split("<|im_end|>", 1)[0]
            if said == "?sampling":  # what the model was given, its `</` as `<\\/`
                said = (raw.decode("utf-8") if raw else "{}").replace("</", "<\\/")
            pieces = [said[at : at + 3] for at in range(0, len(said), 3)]
            limit = int(sampling.get("max_tokens") or 1000)
            reason = "length" if len(pieces) > limit else "stop"
            pieces = pieces[:limit]
            sender = request.get_response_sender()
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            if not stream:
                sender.send(self.response("".join(pieces), reason, len(pieces)), flags=final)
                continue
            for index, piece in enumerate(pieces):
                last = index == len(pieces) - 1
                found = self.response(piece, reason if last else "None", 1)
                sender.send(found, flags=final if last else 0)
            if not pieces:
                sender.send(self.response("", reason, 0), flags=final)
        return None

    def response(self, text, reason, count):
        return pb_utils.InferenceResponse(
            [
                pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
                pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)),
                pb_utils.Tensor("num_input_tokens", np.array([7], np.int32)),
                pb_utils.Tensor("num_output_tokens", np.array([count], np.int32)),
            ]
        )
"""

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}"
)

CONFIG = f"""
name: "thinker"
backend: "python"
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }}
]
output [
  {{ name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "finish_reason" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "num_output_tokens" data_type: TYPE_INT32 dims: [ 1 ] }}
]
parameters {{ key: "chat_template_source" value {{ string_value: {json.dumps(TEMPLATE)} }} }}
"""

# TensorRT-LLM's interface: guided decoding inputs, no `sampling_parameters`.
GUIDED_CONFIG = (
    CONFIG.replace('name: "thinker"', 'name: "guided"')
    .replace("sampling_parameters", "guided_decoding_guide_type")
    .replace("input [", 'input [\n  { name: "guided_decoding_guide" data_type: TYPE_STRING '
             "dims: [ 1 ] optional: true },")
)  # fmt: skip

# The tags split: "<th" "ink" ">Le" ... "</t" "hin" "k>".
THOUGHTFUL = "<think>Let me see.</think>It is 4."
WEATHER = {
    "type": "function",
    "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}},
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-reasoning")
    write_model(folder, "thinker", THINKER, CONFIG)
    write_model(folder, "guided", THINKER, GUIDED_CONFIG)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def r1(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = ToolSettings(parser="hermes", reasoning_parser="deepseek_r1")
    async with openai_client(repo, ["thinker", "guided"], settings) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def qwen3(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["thinker"], ToolSettings(reasoning_parser="qwen3")) as client:
        yield client


def client_of(http: httpx.AsyncClient) -> Any:
    openai = pytest.importorskip("openai", reason="the openai client is not installed")
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http)


async def message(http: httpx.AsyncClient, said: str, **fields: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": said}]
    response = await http.post(CHAT, json={"model": "thinker", "messages": messages, **fields})
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()["choices"][0]["message"]
    return found


async def streamed(http: httpx.AsyncClient, said: str, **fields: Any) -> list[dict[str, Any]]:
    """The deltas of a streamed answer, and its closing chunk's finish reason last."""
    messages = [{"role": "user", "content": said}]
    body = {"model": "thinker", "messages": messages, "stream": True, **fields}
    deltas = []
    async with http.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                deltas.append(choice["delta"])
                if choice["finish_reason"]:
                    deltas.append({"finish_reason": choice["finish_reason"]})
    return deltas


def joined(deltas: list[dict[str, Any]], key: str) -> str | None:
    parts = [d[key] for d in deltas if d.get(key) is not None]
    return "".join(parts) if parts else None


async def test_the_thoughts_are_apart_from_the_answer(r1: httpx.AsyncClient) -> None:
    answer = await client_of(r1).chat.completions.create(
        model="thinker", messages=[{"role": "user", "content": THOUGHTFUL}]
    )
    found = answer.choices[0].message
    assert found.content == "It is 4."
    assert (found.model_extra or {})["reasoning"] == "Let me see."
    assert "reasoning_content" not in (found.model_extra or {})  # vLLM 0.34's: deprecated


async def test_deepseek_r1_thoughts_opened_by_the_template(r1: httpx.AsyncClient) -> None:
    # No `<think>`: the answer began in its thoughts.
    found = await message(r1, "Hmm, two and two.</think>Four.")
    assert (found["reasoning"], found["content"]) == ("Hmm, two and two.", "Four.")
    # No `</think>`: all of it is thoughts (cut short, say), and there is no content.
    found = await message(r1, "<think>Still thinking")
    assert (found["reasoning"], found["content"]) == ("Still thinking", None)


async def test_streamed_tags_split_across_pieces(r1: httpx.AsyncClient) -> None:
    deltas = await streamed(r1, THOUGHTFUL)
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert joined(deltas, "reasoning") == "Let me see."
    assert joined(deltas, "content") == "It is 4."
    assert not any("<" in (d.get("reasoning") or "") + (d.get("content") or "") for d in deltas)
    # The thoughts come first, as the model wrote them.
    kinds = [next(iter(d)) for d in deltas[1:-1] if d]
    assert kinds == sorted(kinds, key=lambda kind: kind != "reasoning")
    assert deltas[-1] == {"finish_reason": "stop"}


async def test_streamed_without_an_end(r1: httpx.AsyncClient) -> None:
    deltas = await streamed(r1, "<think>Still </thin")
    assert joined(deltas, "reasoning") == "Still </thin"
    assert joined(deltas, "content") in (None, "")


async def test_include_reasoning_false_drops_the_thoughts(r1: httpx.AsyncClient) -> None:
    found = await message(r1, THOUGHTFUL, include_reasoning=False)
    assert found["content"] == "It is 4."
    assert found.get("reasoning") is None
    deltas = await streamed(r1, THOUGHTFUL, include_reasoning=False)
    assert joined(deltas, "reasoning") is None
    assert joined(deltas, "content") == "It is 4."
    response = await r1.post(
        CHAT,
        json={"model": "thinker", "messages": [{"role": "user", "content": "x"}],
              "include_reasoning": "no"},
    )  # fmt: skip
    assert error(response)["param"] == "include_reasoning"


async def test_tool_calls_are_read_after_the_thoughts(r1: httpx.AsyncClient) -> None:
    call = '<tool_call>{"name": "weather", "arguments": {}}</tool_call>'
    said = f"<think>I should call <tool_call> it.</think>{call}"
    found = await message(r1, said, tools=[WEATHER])
    assert found["reasoning"] == "I should call <tool_call> it."
    assert [c["function"]["name"] for c in found["tool_calls"]] == ["weather"]
    assert found["content"] is None
    deltas = await streamed(r1, said, tools=[WEATHER])
    assert joined(deltas, "reasoning") == "I should call <tool_call> it."
    calls = [c for d in deltas for c in d.get("tool_calls", ())]
    assert [c["function"]["name"] for c in calls if "id" in c] == ["weather"]
    assert "".join(c["function"]["arguments"] for c in calls) == "{}"
    assert deltas[-1] == {"finish_reason": "tool_calls"}


def given(text: str | None) -> dict[str, Any]:
    """The `sampling_parameters` the thinker was given, from its answer's text."""
    assert text is not None
    found: dict[str, Any] = json.loads(text)
    return found


async def test_structured_outputs_after_the_thoughts_need_an_llm_model(
    r1: httpx.AsyncClient,
) -> None:
    # The key that makes the grammar wait for `</think>` is the `llm` engine's own: a
    # Python model on Triton's vLLM backend's interface (SamplingParams(**params)) would
    # fail on it, so its constraining field is refused rather than the key sent.
    cases: list[tuple[dict[str, Any], str]] = [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"structured_outputs": {"regex": "a+"}}, "structured_outputs"),
        ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
        ({"structured_outputs": {"regex": "a+"}, "n": 2}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a+"}, "stream": True}, "structured_outputs"),
    ]
    messages = [{"role": "user", "content": "?sampling"}]
    for fields, param in cases:
        body = {"model": "thinker", "messages": messages, **fields}
        found = error(await r1.post(CHAT, json=body))
        assert found["param"] == param, fields
        assert "need a model of the 'llm' backend" in found["message"], found
    body = {"model": "thinker", "input": "?sampling", "text": {"format": {"type": "json_object"}}}
    found = error(await r1.post("/v1/responses", json=body))
    assert found["param"] == "text" and "'llm' backend" in found["message"]
    # Unconstrained, the same model answers, and is never given the key.
    found = given((await message(r1, "?sampling"))["reasoning"])
    assert "structured_outputs_after" not in found


async def test_structured_outputs_without_open_thoughts_constrain_from_the_start(
    r1: httpx.AsyncClient, qwen3: httpx.AsyncClient
) -> None:
    closed = {"chat_template_kwargs": {"enable_thinking": False}}
    constrained = {"structured_outputs": {"regex": "a+"}}
    # qwen3 with thinking off: all content; deepseek_r1 whose prompt ends its thoughts
    # (vLLM's is_reasoning_end on the prompt): all thoughts, as its split reads it.
    found = given((await message(qwen3, "?sampling", **closed, **constrained))["content"])
    assert "structured_outputs_after" not in found and "structured_outputs" in found
    found = given((await message(r1, "?sampling", **closed, **constrained))["reasoning"])
    assert "structured_outputs_after" not in found and "structured_outputs" in found
    # Unconstrained, or a client's own: not given (an unknown field, ignored as vLLM does).
    found = given((await message(r1, "?sampling", structured_outputs_after="x"))["reasoning"])
    assert "structured_outputs_after" not in found


async def test_a_model_without_sampling_parameters_is_refused(r1: httpx.AsyncClient) -> None:
    # Its guided decoding inputs would constrain the thoughts too.
    messages = [{"role": "user", "content": "x"}]
    body = {"model": "guided", "messages": messages, "response_format": {"type": "json_object"}}
    found = error(await r1.post(CHAT, json=body))
    assert found["param"] == "response_format"
    assert "need a model of the 'llm' backend" in found["message"]
    body = {"model": "guided", "input": "x", "text": {"format": {"type": "json_object"}}}
    found = error(await r1.post("/v1/responses", json=body))
    assert found["param"] == "text" and "'sampling_parameters'" in found["message"]
    unconstrained = {"model": "guided", "messages": messages}
    assert (await r1.post(CHAT, json=unconstrained)).status_code == 200


async def test_completions_are_not_parsed(r1: httpx.AsyncClient) -> None:
    response = await r1.post(
        "/v1/completions", json={"model": "thinker", "prompt": f"<|im_start|>user\n{THOUGHTFUL}"}
    )
    assert response.json()["choices"][0]["text"] == THOUGHTFUL


async def test_qwen3(qwen3: httpx.AsyncClient) -> None:
    found = await message(qwen3, "<think>a<think>b</think>c</think>d")
    assert (found["reasoning"], found["content"]) == ("ab", "cd")
    found = await message(qwen3, "no end")
    assert (found["reasoning"], found["content"]) == ("no end", None)
    # A call ends the thoughts: it is content.
    found = await message(qwen3, "thinking<tool_call>x")
    assert (found["reasoning"], found["content"]) == ("thinking", "<tool_call>x")
    deltas = await streamed(qwen3, "<think>a<think>b</think>c</think>d")
    assert (joined(deltas, "reasoning"), joined(deltas, "content")) == ("ab", "cd")


async def test_qwen3_without_thinking_is_all_content(qwen3: httpx.AsyncClient) -> None:
    # The template closes the thoughts in the prompt, as Qwen3's does.
    kwargs = {"enable_thinking": False}
    found = await message(qwen3, "plain </think> answer", chat_template_kwargs=kwargs)
    assert (found["reasoning"], found["content"]) == (None, "plain  answer")


async def test_responses_reasoning_item(r1: httpx.AsyncClient) -> None:
    answer = await client_of(r1).responses.create(model="thinker", input=THOUGHTFUL)
    kinds = [item.type for item in answer.output]
    assert kinds == ["reasoning", "message"]
    thoughts = answer.output[0]
    assert thoughts.type == "reasoning"
    assert [(part.type, part.text) for part in thoughts.content or ()] == [
        ("reasoning_text", "Let me see.")
    ]
    assert answer.output_text == "It is 4."


async def test_responses_streamed_reasoning_events(r1: httpx.AsyncClient) -> None:
    stream = await client_of(r1).responses.create(model="thinker", input=THOUGHTFUL, stream=True)
    kinds, deltas, done = [], [], None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.reasoning_text.delta":
            deltas.append(event.delta)
        if event.type == "response.completed":
            done = event.response
    assert "".join(deltas) == "Let me see."
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    assert done is not None
    assert [item.type for item in done.output] == ["reasoning", "message"]
    assert done.output_text == "It is 4."


# --- mistral: Magistral's `[THINK]`, a control token ---------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def magistral(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = ToolSettings(parser="mistral", reasoning_parser="mistral")
    async with openai_client(repo, ["thinker"], settings) as client:
        yield client


MISTRAL_THOUGHTS = "[THINK]Let me see.[/THINK]It is 4."


async def test_mistral_thoughts_are_apart_from_the_answer(magistral: httpx.AsyncClient) -> None:
    found = await message(magistral, MISTRAL_THOUGHTS)
    assert (found["reasoning"], found["content"]) == ("Let me see.", "It is 4.")
    # A model that does not think answers with content alone (vLLM's: not thoughts, as
    # deepseek_r1 would read it).
    found = await message(magistral, "Four.")
    assert (found.get("reasoning"), found["content"]) == (None, "Four.")
    deltas = await streamed(magistral, MISTRAL_THOUGHTS)
    assert joined(deltas, "reasoning") == "Let me see."
    assert joined(deltas, "content") == "It is 4."
    assert not any("[" in (d.get("reasoning") or "") + (d.get("content") or "") for d in deltas)


async def test_mistral_thoughts_are_decoded_with_their_tags(magistral: httpx.AsyncClient) -> None:
    # `[THINK]` is a control token: an engine that skips special tokens when it decodes
    # would leave the tags out of the text, and the thoughts would read as the answer.
    sent = given((await message(magistral, "?sampling"))["content"])
    assert sent["skip_special_tokens"] is False


async def test_mistral_calls_after_the_thoughts(magistral: httpx.AsyncClient) -> None:
    said = '[THINK]I should call it.[/THINK][TOOL_CALLS]weather[ARGS]{"city": "Oslo"}'
    found = await message(magistral, said, tools=[WEATHER])
    assert found["reasoning"] == "I should call it."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in found["tool_calls"]] == [
        ("weather", '{"city": "Oslo"}')
    ]
    deltas = await streamed(magistral, said, tools=[WEATHER])
    assert joined(deltas, "reasoning") == "I should call it."
    assert deltas[-1] == {"finish_reason": "tool_calls"}


async def test_mistral_thoughts_on_the_responses_api(magistral: httpx.AsyncClient) -> None:
    body = {"model": "thinker", "input": MISTRAL_THOUGHTS}
    response = await magistral.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    output = response.json()["output"]
    (thought,) = [item for item in output if item["type"] == "reasoning"]
    assert [part["text"] for part in thought["content"]] == ["Let me see."]
    (said,) = [item for item in output if item["type"] == "message"]
    assert said["content"][0]["text"] == "It is 4."
    response = await magistral.post("/v1/responses", json={**body, "input": "?sampling"})
    (said,) = [item for item in response.json()["output"] if item["type"] == "message"]
    assert given(said["content"][0]["text"])["skip_special_tokens"] is False


# --- granite: Granite 3.2's and 3.3's phrases ------------------------------------------------


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def granite(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = ToolSettings(reasoning_parser="granite")
    async with openai_client(repo, ["thinker"], settings) as client:
        yield client


GRANITE_THOUGHTS = "Here is my thought process:\nTwo and two.\nHere is my response:\nFour."


async def test_granite_thoughts_are_apart_from_the_answer(granite: httpx.AsyncClient) -> None:
    kwargs = {"chat_template_kwargs": {"thinking": True}}
    found = await message(granite, GRANITE_THOUGHTS, **kwargs)
    assert (found["reasoning"], found["content"]) == ("\nTwo and two.\n", "\nFour.")
    # The phrases come split across the thinker's three-character pieces.
    deltas = await streamed(granite, GRANITE_THOUGHTS, **kwargs)
    assert (joined(deltas, "reasoning"), joined(deltas, "content")) == (
        "\nTwo and two.\n",
        "\nFour.",
    )
    found = await message(granite, "Four.")
    assert (found.get("reasoning"), found["content"]) == (None, "Four.")
    body = {"model": "thinker", "input": GRANITE_THOUGHTS}
    response = await granite.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    (thought,) = [item for item in response.json()["output"] if item["type"] == "reasoning"]
    assert [part["text"] for part in thought["content"]] == ["\nTwo and two.\n"]
