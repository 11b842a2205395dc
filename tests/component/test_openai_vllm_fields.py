"""vLLM's extensions of the OpenAI request bodies (vLLM's `ChatCompletionRequest` and
`CompletionRequest`, what most OpenAI-compatible clients are tested against): each is
honoured as vLLM honours it, or refused by name, never silently dropped. The models are
tests/textgen.py's echo model, whose answer is the prompt it got, word by word."""

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

from ge_serve.backends.base import TextGeneration
from ge_serve.server.http.openai.errors import OpenAIError
from ge_serve.server.http.openai.schemas import ChatMessage
from ge_serve.server.http.openai.template import render

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHAT = "/v1/chat/completions"
PREFILL = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
# Prints what vLLM's template controls reach a template with.
VARIABLES = (
    "{% if enable_thinking is defined and not enable_thinking %}nothink {% endif %}"
    "{{ bos_token }}{% for m in messages %} {{ m['content'] }}{% endfor %}"
    "{% for d in documents or [] %} doc:{{ d.title }}{% endfor %}"
    " effort:{{ reasoning_effort | default('unset') }}"
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = textgen.write(tmp_path_factory.mktemp("openai-vllm-fields"))
    textgen.write_templated(folder, "tpl_variables", VARIABLES)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["textgen", "tpl_variables", "embedder"]) as client:
        yield client


async def answer(http: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    body = {"model": "textgen", "messages": PREFILL, **fields}
    response = await http.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


def chunks(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    blocks = [block[6:] for block in response.text.split("\n\n") if block]
    assert blocks[-1] == "[DONE]"
    return [json.loads(block) for block in blocks[:-1]]


async def test_add_generation_prompt_false_opens_no_assistant_turn(
    http: httpx.AsyncClient,
) -> None:
    opened = await answer(http)
    assert opened["content"].endswith("<|im_start|>assistant")
    assert opened["role"] == "assistant"
    closed = await answer(http, add_generation_prompt=False)
    assert (
        closed["content"] == "<|im_start|>user Hi<|im_end|> <|im_start|>assistant Hello<|im_end|>"
    )
    # vLLM's: without a generation prompt the answer has the last message's role.
    assert closed["role"] == "assistant"
    user_last = {"model": "textgen", "messages": PREFILL[:1], "add_generation_prompt": False}
    response = await http.post(CHAT, json=user_last)
    assert response.json()["choices"][0]["message"]["role"] == "user"


async def test_continue_final_message_leaves_the_last_message_open(
    http: httpx.AsyncClient,
) -> None:
    continued = await answer(http, continue_final_message=True, add_generation_prompt=False)
    assert continued["content"] == "<|im_start|>user Hi<|im_end|> <|im_start|>assistant Hello"
    for fields in (
        {"continue_final_message": True},
        {"continue_final_message": True, "add_generation_prompt": True},
    ):
        body = {"model": "textgen", "messages": PREFILL, **fields}
        refused = error(await http.post(CHAT, json=body))
        assert refused["param"] == "continue_final_message"
        assert "add_generation_prompt" in refused["message"]


async def test_a_continued_message_ends_as_the_template_ends_it() -> None:
    def rendered(template: str, last: str) -> str:
        generation = TextGeneration(template, "", "", 0)
        messages = [
            ChatMessage(role="user", content="a"),
            ChatMessage(role="assistant", content=last),
        ]
        return render(generation, messages, add_generation_prompt=False, continue_final=True)

    plain = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    assert rendered(plain, "b ") == "[a][b "
    # A template that strips what a message ends with: so does the prompt, as transformers.
    assert rendered("{% for m in messages %}[{{ m.content | trim }}]{% endfor %}", "b ") == "[a][b"
    # Llama 3's shape: what the template prints before the message stays, even when the
    # message is empty or blank and the template trims it.
    llama = "{% for m in messages %}<{{ m.role }}>\n\n{{ m.content | trim }}<eot>{% endfor %}"
    assert rendered(llama, "") == "<user>\n\na<eot><assistant>\n\n"
    assert rendered(llama, "  ") == "<user>\n\na<eot><assistant>\n\n"
    assert rendered(llama, " b c ") == "<user>\n\na<eot><assistant>\n\nb c"
    assert rendered(plain, " b") == "[a][ b"
    with pytest.raises(OpenAIError) as caught:
        rendered("{% for m in messages %}[{{ m.content[:1] }}]{% endfor %}", "bc")
    assert caught.value.param == "continue_final_message"


async def test_chat_template_kwargs_documents_and_reasoning_effort_reach_the_template(
    http: httpx.AsyncClient,
) -> None:
    async def prompt(**fields: Any) -> str:
        body = {"model": "tpl_variables", "messages": PREFILL[:1], **fields}
        response = await http.post(CHAT, json=body)
        assert response.status_code == 200, response.text
        text: str = response.json()["choices"][0]["message"]["content"]
        return text

    assert await prompt() == "Hi effort:unset"
    kwargs = {"enable_thinking": False, "bos_token": "BOS"}
    assert await prompt(chat_template_kwargs=kwargs) == "nothink BOS Hi effort:unset"
    documents = [{"title": "T1", "text": "x"}]
    assert await prompt(documents=documents) == "Hi doc:T1 effort:unset"
    assert await prompt(reasoning_effort="none") == "nothink Hi effort:none"
    assert await prompt(reasoning_effort="low") == "Hi effort:low"
    agreeing = {"add_generation_prompt": True}
    assert await prompt(chat_template_kwargs=agreeing) == "Hi effort:unset"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"chat_template": "{{ 1 }}"}, "chat_template_kwargs.chat_template"),
        ({"messages": []}, "chat_template_kwargs.messages"),
        ({"tokenize": True}, "chat_template_kwargs.tokenize"),
        ({"add_generation_prompt": False}, "chat_template_kwargs.add_generation_prompt"),
    ],
)
async def test_chat_template_kwargs_that_clash_are_refused(
    http: httpx.AsyncClient, kwargs: dict[str, Any], param: str
) -> None:
    body = {"model": "textgen", "messages": PREFILL, "chat_template_kwargs": kwargs}
    assert error(await http.post(CHAT, json=body))["param"] == param


@pytest.mark.parametrize(
    ("param", "refused", "default"),
    [
        ("add_special_tokens", True, False),
        ("return_token_ids", True, False),
        ("vllm_xargs", {"a": 1}, {}),
    ],
)
async def test_vllm_fields_not_served_are_refused_by_name(
    http: httpx.AsyncClient, param: str, refused: Any, default: Any
) -> None:
    body = {"model": "textgen", "messages": PREFILL, param: refused}
    found = error(await http.post(CHAT, json=body))
    assert (found["param"], found["code"]) == (param, "unsupported_parameter")
    # vLLM's default changes nothing, and is accepted.
    assert (await answer(http, **{param: default})) == await answer(http)


async def test_a_requests_chat_template_is_refused_unless_trusted(http: httpx.AsyncClient) -> None:
    body = {"model": "textgen", "messages": PREFILL, "chat_template": "{{ 1 }}"}
    found = error(await http.post(CHAT, json=body))
    assert found["param"] == "chat_template"
    assert found["message"] == (
        "Chat template is passed with request, but --trust-request-chat-template is not set. "
        "Refused request with untrusted chat template."
    )
    # vLLM's default (none) changes nothing, and is accepted.
    assert (await answer(http, chat_template=None)) == await answer(http)


async def test_a_thinking_budget_without_a_reasoning_parser_is_vllms_400(
    http: httpx.AsyncClient,
) -> None:
    body = {"model": "textgen", "messages": PREFILL, "thinking_token_budget": 10}
    found = error(await http.post(CHAT, json=body))
    assert found["param"] == "thinking_token_budget"
    assert found["message"] == (
        "thinking_token_budget is set but reasoning_config is not configured. Please set "
        "--reasoning-parser and/or --reasoning-config to use thinking_token_budget."
    )
    # -1, unlimited, is no budget.
    assert (await answer(http, thinking_token_budget=-1)) == await answer(http)


async def test_a_priority_is_served_and_only_the_llm_engine_is_sent_it(
    http: httpx.AsyncClient,
) -> None:
    # A Python model (Triton's vLLM backend's interface builds vLLM's SamplingParams from
    # its `sampling_parameters`) has no queue ordered by it: left out, as fcfs ignores it.
    body = {"model": "textgen", "prompt": "SHOW_PARAMS", "priority": -4, "top_k": 5}
    found = await http.post("/v1/completions", json=body, headers={"X-Vllm-Priority": "9"})
    assert found.status_code == 200, found.text
    sent = json.loads(found.json()["choices"][0]["text"])
    assert sent["sampling"] == {"top_k": 5, "max_tokens": 16}


async def test_echo_puts_the_last_message_before_the_answer(http: httpx.AsyncClient) -> None:
    plain = (await answer(http))["content"]
    assert (await answer(http, echo=True))["content"] == "Hello" + plain
    body = {"model": "textgen", "messages": PREFILL, "echo": True, "stream": True}
    streamed = chunks(await http.post(CHAT, json=body))
    assert streamed[1]["choices"][0]["delta"] == {"content": "Hello"}
    # Not the assistant's role: nothing to echo.
    user_last = {"model": "textgen", "messages": PREFILL[:1], "echo": True}
    text = (await http.post(CHAT, json=user_last)).json()["choices"][0]["message"]["content"]
    assert text.startswith("<|im_start|>user")

    completion = {"model": "textgen", "prompt": "a b", "echo": True}
    found = (await http.post("/v1/completions", json=completion)).json()
    assert found["choices"][0]["text"] == "a ba b"
    streamed = chunks(await http.post("/v1/completions", json={**completion, "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in streamed) == "a ba b"


async def test_request_id_names_the_answer(http: httpx.AsyncClient) -> None:
    body = {"model": "textgen", "messages": PREFILL, "request_id": "abc"}
    assert (await http.post(CHAT, json=body)).json()["id"] == "chatcmpl-abc"
    body = {"model": "textgen", "prompt": "a", "request_id": "abc"}
    assert (await http.post("/v1/completions", json=body)).json()["id"] == "cmpl-abc"


@pytest.mark.parametrize("path", [CHAT, "/v1/completions"])
async def test_continuous_usage_stats_puts_usage_on_every_chunk(
    http: httpx.AsyncClient, path: str
) -> None:
    prompt = {"messages": PREFILL[:1]} if path == CHAT else {"prompt": "a b c"}
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": "textgen", "stream": True, "stream_options": options, **prompt}
    streamed = chunks(await http.post(path, json=body))
    prompt_tokens = streamed[-1]["usage"]["prompt_tokens"]
    assert prompt_tokens > 0
    counts = [c["usage"]["completion_tokens"] for c in streamed]
    texts = [
        c
        for c in streamed[:-1]
        if c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content")
    ]
    assert [c["usage"]["completion_tokens"] for c in texts] == list(range(1, len(texts) + 1))
    assert counts == sorted(counts) and counts[-1] == len(texts)
    for chunk in streamed:
        usage = chunk["usage"]
        assert usage["prompt_tokens"] == prompt_tokens
        assert usage["total_tokens"] == prompt_tokens + usage["completion_tokens"]
    # As vLLM: only with include_usage.
    body["stream_options"] = {"continuous_usage_stats": True}
    assert all("usage" not in c for c in chunks(await http.post(path, json=body)))


COMPLETIONS, EMBEDDINGS = "/v1/completions", "/v1/embeddings"


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        # Token-id prompts go to a model's `input_ids`; this one has none.
        (COMPLETIONS, {"model": "textgen", "prompt": [1, 2, 3]}, "prompt", "Token-id prompts"),
        (COMPLETIONS, {"model": "textgen", "prompt": [[1, 2]]}, "prompt", "Token-id prompts"),
        (EMBEDDINGS, {"model": "embedder", "input": [[15339, 1917]]}, "input", "Token-id input"),
        (EMBEDDINGS, {"model": "embedder", "input": [15339, 1917]}, "input", "Token-id input"),
    ],
)
async def test_token_id_inputs_are_refused_in_so_many_words(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], param: str, words: str
) -> None:
    refused = error(await http.post(path, json=body))
    assert (refused["param"], refused["code"]) == (param, "unsupported_parameter")
    assert refused["message"].startswith(words)


async def test_an_x_request_id_header_names_the_answer(http: httpx.AsyncClient) -> None:
    # vLLM's order: the header, then the body's request_id, then a fresh id.
    header = {"X-Request-Id": "gw-trace-123"}
    body: dict[str, Any] = {"model": "textgen", "messages": PREFILL, "request_id": "abc"}
    found = (await http.post(CHAT, json=body, headers=header)).json()
    assert found["id"] == "chatcmpl-gw-trace-123"
    body = {"model": "textgen", "prompt": "a", "stream": True}
    streamed = chunks(await http.post("/v1/completions", json=body, headers=header))
    assert {c["id"] for c in streamed} == {"cmpl-gw-trace-123"}
    body = {"model": "embedder", "input": "a b"}
    found = (await http.post("/v1/embeddings", json=body, headers=header)).json()
    assert found["id"] == "embd-gw-trace-123" and found["data"]
    assert (await http.post("/v1/embeddings", json={**body, "request_id": "e"})).json()[
        "id"
    ] == "embd-e"
    fresh = (await http.post("/v1/embeddings", json=body)).json()["id"]
    assert fresh.startswith("embd-") and len(fresh) > len("embd-")


@pytest.mark.parametrize(
    ("path", "fields", "limit"),
    [
        (CHAT, {"messages": PREFILL, "max_tokens": 3}, 3),
        (CHAT, {"messages": PREFILL, "max_completion_tokens": 3}, 3),
        # /v1/completions' default, as vLLM's.
        ("/v1/completions", {"prompt": "a"}, 16),
    ],
)
async def test_min_tokens_past_max_tokens_is_refused(
    http: httpx.AsyncClient, path: str, fields: dict[str, Any], limit: int
) -> None:
    body = {"model": "textgen", "min_tokens": limit + 2, **fields}
    refused = error(await http.post(path, json=body))
    assert refused["param"] == "min_tokens"
    assert refused["message"] == (
        f"min_tokens must be less than or equal to max_tokens={limit}, got {limit + 2}."
    )


async def test_echo_with_max_tokens_0_answers_the_prompt_alone(http: httpx.AsyncClient) -> None:
    # vLLM's: the model runs for one token, which is not shown but is counted.
    body = {"model": "textgen", "prompt": "a b c", "echo": True, "max_tokens": 0}
    found = (await http.post("/v1/completions", json=body)).json()
    assert found["choices"][0]["text"] == "a b c"
    assert found["choices"][0]["finish_reason"] == "length"
    assert found["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 1,
        "total_tokens": 4,
        "completion_tokens_details": None,  # vLLM's null without --reasoning-parser
    }
    options = {"include_usage": True}
    streamed = chunks(
        await http.post("/v1/completions", json={**body, "stream": True, "stream_options": options})
    )
    assert "".join(c["choices"][0]["text"] for c in streamed if c["choices"]) == "a b c"
    assert streamed[-1]["usage"]["completion_tokens"] == 1
    # Without echo, as vLLM: at least 1.
    del body["echo"]
    assert error(await http.post("/v1/completions", json=body))["param"] == "max_tokens"


async def test_a_streamed_echo_comes_with_the_first_token(http: httpx.AsyncClient) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": "textgen", "prompt": "a b c", "echo": True, "max_tokens": 3}
    body |= {"stream": True, "stream_options": options}
    streamed = chunks(await http.post("/v1/completions", json=body))
    # vLLM's completions: the prompt and the first token in one chunk, which counts it.
    assert streamed[0]["choices"][0]["text"] == "a b ca"
    assert streamed[0]["usage"]["completion_tokens"] == 1
    assert "".join(c["choices"][0]["text"] for c in streamed if c["choices"]) == "a b ca b c"


async def test_stream_options_without_stream_is_refused_unless_empty(
    http: httpx.AsyncClient,
) -> None:
    body = {"model": "textgen", "prompt": "a", "stream_options": {}}
    assert (await http.post("/v1/completions", json=body)).status_code == 200
    body["stream_options"] = {"include_usage": False}
    refused = error(await http.post("/v1/completions", json=body))
    assert refused["param"] == "stream_options"
    assert refused["message"] == "Stream options can only be defined when `stream=True`."


async def test_stream_options_of_unknown_keys_without_stream_is_refused(
    http: httpx.AsyncClient,
) -> None:
    """vLLM checks the body as sent: any non-empty `stream_options`, whatever its keys."""
    body = {"model": "textgen", "prompt": "a", "stream_options": {"foo": 1}}
    refused = error(await http.post("/v1/completions", json=body))
    assert refused["param"] == "stream_options"
    streamed = chunks(await http.post("/v1/completions", json={**body, "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in streamed) == "a"


@pytest.mark.parametrize(
    ("seed", "words"),
    [
        (2**63, "less than or equal to 9223372036854775807"),
        (2**64 - 1, "less than or equal to 9223372036854775807"),
        # Past what the JSON parser reads as an integer (orjson: 64 bits), as a float.
        (-(2**63) - 1, "a valid integer"),
    ],
)
async def test_a_seed_past_int64_is_refused_as_vllm_refuses_it(
    http: httpx.AsyncClient, seed: int, words: str
) -> None:
    for path, prompt in ((CHAT, {"messages": PREFILL}), ("/v1/completions", {"prompt": "a"})):
        body = {"model": "textgen", "seed": seed, **prompt}
        refused = error(await http.post(path, json=body))
        assert refused["param"] == "seed"
        assert refused["message"] == f"Invalid value for 'seed': Input should be {words}"
    # vLLM's largest is taken.
    assert (await answer(http, seed=2**63 - 1))["content"]
