"""OpenAI's Responses API (`POST /v1/responses`) with the official `openai` client, over
the tiny random-weight `llm` model (tests/llmrepo.py), whose greedy answers the numpy
reference gives token for token: so an answer equal to the reference's continuation of a
prompt written out by hand shows the prompt the server rendered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import jsonschema
import llmrepo
import pytest
from llmrepo import prompt_ids, reference_greedy, reference_text, tiny_model, write_tiny_llm
from serverproc import ServerProcess, running_server

if TYPE_CHECKING:
    import openai
else:
    openai = pytest.importorskip("openai", reason="the openai client is not installed (test extra)")
pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# A chat template that prints an assistant's calls and a tool message's call id, so that
# the prompt of a replayed tool round shows what reached it (each line break printed by
# an expression: trim_blocks drops one that follows a block tag).
TOOL_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
    "{% for c in m['tool_calls'] or [] %}CALL {{ c['id'] }} {{ c['function']['name'] }} "
    "{{ c['function']['arguments'] | tojson }}{% endfor %}"
    "{% if m['tool_call_id'] %} FOR {{ m['tool_call_id'] }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
JSON_FORMAT: Any = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA}}


def status(prompt: str, steps: int) -> str:
    return "completed" if tiny_model().eos_id in reference_greedy(prompt, steps) else "incomplete"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("openai-responses")
    parameters = {"max_model_len": "1024", "kv_cache_blocks": "256"}
    write_tiny_llm(repo, parameters=parameters)
    tools = write_tiny_llm(repo, name="tiny_tools", parameters=parameters)
    (tools / "1" / "chat_template.jinja").write_text(TOOL_TEMPLATE, encoding="utf-8")
    with running_server([repo], timeout=120.0) as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused") as c:
        yield c


def test_a_string_input_with_instructions(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="tiny_llm",
        input="Hi there",
        instructions="Be brief",
        temperature=0,
        max_output_tokens=12,
        metadata={"k": "v"},
    )
    prompt = llmrepo.rendered(
        [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi there"}]
    )
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == reference_text(prompt, 12)
    assert response.status == status(prompt, 12)
    (message,) = response.output
    assert isinstance(message, openai.types.responses.ResponseOutputMessage)
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.content[0].type == "output_text"
    assert response.usage is not None
    assert response.usage.input_tokens == len(prompt_ids(prompt))
    total = response.usage.input_tokens + response.usage.output_tokens
    assert response.usage.total_tokens == total
    # The request's fields, echoed.
    assert response.model == "tiny_llm" and response.instructions == "Be brief"
    assert response.max_output_tokens == 12 and response.temperature == 0
    assert response.metadata == {"k": "v"} and response.tool_choice == "none"


def test_a_message_list_with_text_parts(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="tiny_llm",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Say"}]},
            {"role": "assistant", "content": "What?"},
            {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        ],
        temperature=0,
        max_output_tokens=10,
    )
    prompt = llmrepo.rendered(
        [
            {"role": "user", "content": "Say"},
            {"role": "assistant", "content": "What?"},
            {"role": "user", "content": "hello"},
        ]
    )
    assert response.output_text == reference_text(prompt, 10)


def test_the_token_limit_leaves_the_response_incomplete(client: openai.OpenAI) -> None:
    prompt = llmrepo.rendered([{"role": "user", "content": "Hi there"}])
    assert status(prompt, 3) == "incomplete"  # the reference does not stop in 3 tokens
    response = client.responses.create(
        model="tiny_llm", input="Hi there", temperature=0, max_output_tokens=3
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    message = response.output[0]
    assert isinstance(message, openai.types.responses.ResponseOutputMessage)
    assert message.status == "incomplete"
    assert response.usage is not None and response.usage.output_tokens == 3


def test_a_json_schema_format_gives_json_that_validates(client: openai.OpenAI) -> None:
    # Greedy: the format lets whitespace in anywhere (as vLLM's guidance backend does), and
    # a sampled answer of random weights ran past any token limit once in some 75 requests.
    for prompt in ("One", "Hi"):
        response = client.responses.create(
            model="tiny_llm", input=prompt, text=JSON_FORMAT, max_output_tokens=80, temperature=0
        )
        assert response.status == "completed", response
        jsonschema.validate(json.loads(response.output_text), SCHEMA)


def test_a_stream_sends_the_events_in_order(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="tiny_llm", input="Hi", text=JSON_FORMAT, max_output_tokens=80, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas > 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    jsonschema.validate(json.loads(text), SCHEMA)
    assert final.output_text == text and final.status == "completed"
    assert final.usage is not None and final.usage.output_tokens > 0


def test_a_cut_stream_ends_incomplete(server: ServerProcess) -> None:
    body = {"model": "tiny_llm", "input": "Hi there", "temperature": 0, "max_output_tokens": 3}
    url = server.base_url + "/v1/responses"
    names, data = [], []
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("event: "):
                names.append(line.removeprefix("event: "))
            elif line.startswith("data: "):
                data.append(json.loads(line.removeprefix("data: ")))
    assert names == [d["type"] for d in data]
    assert names[-1] == "response.incomplete"
    last = data[-1]["response"]
    assert last["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["output"][0]["status"] == "incomplete"


def test_a_tool_round_trip(client: openai.OpenAI) -> None:
    # Greedy, as the JSON-format tests: the arguments' grammar lets whitespace in anywhere,
    # and a sampled call of random weights now and then runs past any token limit.
    call = client.responses.create(
        model="tiny_tools",
        input="Weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=100,
    )
    (item,) = call.output
    assert isinstance(item, openai.types.responses.ResponseFunctionToolCall)
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.id and item.id.startswith("fc_") and item.call_id
    assert set(json.loads(item.arguments)) == {"city"}
    assert call.status == "completed"
    # The call and its output, replayed: the template gets the call and the tool message.
    answer = client.responses.create(
        model="tiny_tools",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
        tools=[WEATHER],
        tool_choice="none",
        temperature=0,
        max_output_tokens=8,
    )
    prompt = (
        "user: Weather in Paris?\n"
        'assistant: CALL call_1 get_weather {"city": "Paris"}\n'
        "tool: sunny FOR call_1\n"
        "assistant: "
    )
    assert answer.output_text == reference_text(prompt, 8)
    assert answer.usage is not None and answer.usage.input_tokens == len(prompt_ids(prompt))


def test_a_streamed_named_tool_call(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="tiny_tools",
        input="Weather?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,  # greedy, as above
        max_output_tokens=100,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in kinds
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    (item,) = final.output
    assert isinstance(item, openai.types.responses.ResponseFunctionToolCall)
    assert item.type == "function_call" and set(json.loads(item.arguments)) == {"city"}


def test_errors_are_openais(client: openai.OpenAI, server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="no_such_model", input="Hi")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="tiny_llm", input="Hi", max_output_tokens=0)
    assert isinstance(bad.value.body, dict) and bad.value.body["param"] == "max_output_tokens"
    with pytest.raises(openai.BadRequestError) as hosted:
        client.responses.create(model="tiny_llm", input="Hi", tools=[{"type": "web_search"}])
    assert isinstance(hosted.value.body, dict) and hosted.value.body["param"] == "tools[0].type"
    # The model has no `logprobs` output: the refusal names this API's field.
    with pytest.raises(openai.BadRequestError) as logprobs:
        client.responses.create(
            model="tiny_llm", input="Hi", include=["message.output_text.logprobs"]
        )
    assert isinstance(logprobs.value.body, dict) and logprobs.value.body["param"] == "include"
    # No store (vLLM's default): nothing to continue from, nothing to retrieve.
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="tiny_llm", input="Hi", previous_response_id="resp_1")
    found = httpx.get(server.base_url + "/v1/responses/resp_1", timeout=30)
    assert found.status_code == 404 and found.json()["error"]["param"] == "response_id"


def test_the_route_is_documented(server: ServerProcess) -> None:
    document = httpx.get(server.base_url + "/openapi.json", timeout=30)
    if document.status_code != 200:
        pytest.skip("no OpenAPI document served")
    assert "/v1/responses" in document.json()["paths"]
