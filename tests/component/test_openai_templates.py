"""Chat templates render as transformers' `apply_chat_template` renders them (the
environment Triton's OpenAI front end and vLLM use), and the messages reach them as
transformers is given them. Each model is tests/textgen.py's echo model with another
template, so a chat's answer is the prompt the template rendered, word by word. (Also the
refusal of an empty prompt, which no model here would refuse itself.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import error, openai_client

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

TEMPLATES = {
    # Granite 3's templates open so.
    "tpl_strftime": "{%- set today = strftime_now('%Y') %}{{ today }}"
    "{% for m in messages %} {{ m['content'] }}{% endfor %}",
    # transformers' AssistantTracker tag, common in fine-tuned templates.
    "tpl_generation": "{% for m in messages %}{% if m['role'] == 'assistant' %}"
    "A: {% generation %}{{ m['content'] }}{% endgeneration %}"
    "{% else %}{{ m['role'] }}: {{ m['content'] }}{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}",
    "tpl_tojson": "{% for m in messages %}{{ m['content'] | tojson }} "
    "{{ m | tojson(separators=(',', ':'), sort_keys=True) }} {% endfor %}",
    # A tool-calling conversation, as Hermes- and Llama-style templates walk it.
    "tpl_tools": "{% for m in messages %}{{ m['role'] }}"
    "{% for call in m.tool_calls or [] %} {{ call.id }} {{ call.type }} "
    "{{ call.function.name }}({{ call.function.arguments.city }}){% endfor %}"
    "{% if m.tool_call_id %} answers {{ m.tool_call_id }}{% endif %}"
    " {{ m['content'] }} {% endfor %}tools={{ tools is none }}",
    "tpl_broken": "{% for m in messages %}{{ m['content'] }}",
    # Llama 3.1's roles, and a refusal of any other, as such templates word it.
    "tpl_roles": "{% for m in messages %}{% if m['role'] not in "
    "['system', 'user', 'assistant', 'ipython'] %}"
    "{{ raise_exception('Unknown role: ' + m['role']) }}{% endif %}"
    "{{ m['role'] }}: {{ m['content'] }} {% endfor %}",
    # Variables from a request's chat_template_kwargs, used as a template would use them.
    "tpl_kwargs": "{% for i in range(turns | default(1)) %}{{ i }} {% endfor %}"
    "{{ 100 // (divisor | default(1)) }}{% for m in messages %} {{ m['content'] }}{% endfor %}",
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-templates")
    for name, template in TEMPLATES.items():
        textgen.write_templated(folder, name, template)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, list(TEMPLATES)) as client:
        yield client


async def chat(http: httpx.AsyncClient, model: str, messages: list[dict[str, Any]]) -> str:
    """The prompt the model got (its echo)."""
    body = {"model": model, "messages": messages, "max_tokens": 63}
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    answer: str = response.json()["choices"][0]["message"]["content"]
    return answer


async def test_strftime_now_is_the_servers_clock(http: httpx.AsyncClient) -> None:
    before = datetime.now().year
    prompt = await chat(http, "tpl_strftime", [{"role": "user", "content": "hi"}])
    assert prompt in (f"{before} hi", f"{datetime.now().year} hi")


async def test_the_generation_tag_renders_what_it_encloses(http: httpx.AsyncClient) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "next"},
    ]
    assert await chat(http, "tpl_generation", messages) == "user: hi A: ok user: next A:"


async def test_tojson_is_transformers_json_dumps(http: httpx.AsyncClient) -> None:
    # Not Jinja2's HTML-safe filter (\u003c, \u0026, \u00e9), and with json.dumps' keywords.
    text = 'a <b> & "c" é'
    prompt = await chat(http, "tpl_tojson", [{"role": "user", "content": text}])
    assert prompt == '"a <b> & \\"c\\" é" {"content":"a <b> & \\"c\\" é","role":"user"}'


async def test_text_parts_are_joined_by_a_line_break(http: httpx.AsyncClient) -> None:
    parts = [{"type": "text", "text": "Say"}, {"type": "text", "text": "hello"}]
    prompt = await chat(http, "tpl_tojson", [{"role": "user", "content": parts}])
    assert prompt.split()[0] == '"Say\\nhello"'


async def test_tool_calls_and_tool_answers_reach_the_template(http: httpx.AsyncClient) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    prompt = await chat(http, "tpl_tools", messages)
    assert prompt == (
        "user weather? assistant call_1 function get_weather(Paris) "
        "tool answers call_1 sunny tools=True"
    )
    messages[1]["tool_calls"][0]["function"]["arguments"] = "{city"
    bad = await http.post("/v1/chat/completions", json={"model": "tpl_tools", "messages": messages})
    assert error(bad, 400)["param"] == "messages[1].tool_calls[0].function.arguments"


async def test_a_template_that_does_not_compile_refuses_chat_only(
    http: httpx.AsyncClient,
) -> None:
    body = {"model": "tpl_broken", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(2):
        refused = error(await http.post("/v1/chat/completions", json=body), 400)
        assert refused["code"] == "chat_template_invalid"
        assert refused["param"] == "model"
        assert "endfor" in refused["message"] and "/v1/completions" in refused["message"]
    completion = await http.post("/v1/completions", json={"model": "tpl_broken", "prompt": "a b"})
    assert completion.status_code == 200 and completion.json()["choices"][0]["text"] == "a b"


async def test_an_empty_prompt_is_refused_on_its_field(http: httpx.AsyncClient) -> None:
    for prompt in ("", [""]):
        body = {"model": "tpl_broken", "prompt": prompt}
        refused = error(await http.post("/v1/completions", json=body), 400)
        assert refused["param"] == "prompt"
        assert refused["message"] == "'prompt' must not be empty"


async def test_request_variables_reach_the_template(http: httpx.AsyncClient) -> None:
    body = {
        "model": "tpl_kwargs",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 63,
        "chat_template_kwargs": {"turns": 2, "divisor": 4},
    }
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "0 1 25 hi"


@pytest.mark.parametrize(
    "variables",
    [
        {"divisor": 0},  # ZeroDivisionError
        {"turns": 10**9},  # the sandbox's OverflowError: range too big
        {"turns": "many"},  # TypeError
        {"divisor": []},  # TypeError in //
    ],
)
async def test_request_variables_that_break_the_template_are_the_clients_400(
    http: httpx.AsyncClient, variables: dict[str, Any]
) -> None:
    # Whatever the template raises on a client's values, the client gets a 400 on the
    # field, never a 500, and the model serves the next chat.
    body = {
        "model": "tpl_kwargs",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 63,
        "chat_template_kwargs": variables,
    }
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    found = error(response)
    assert found["param"] == "chat_template_kwargs", found
    assert "chat template" in found["message"], found
    assert await chat(http, "tpl_kwargs", [{"role": "user", "content": "hi"}]) == "0 100 hi"


async def test_any_role_is_the_templates_to_render_or_refuse(http: httpx.AsyncClient) -> None:
    """vLLM takes any role (its CustomChatCompletionMessageParam) and leaves it to the
    template: Llama 3.1's `ipython` renders, a role the template does not know is its
    raise_exception, a 400 on `messages`."""
    messages = [{"role": "user", "content": "run"}, {"role": "ipython", "content": "42"}]
    assert await chat(http, "tpl_roles", messages) == "user: run ipython: 42"
    # With no generation prompt the answer has the last message's role, as vLLM's.
    body = {"model": "tpl_roles", "messages": messages, "add_generation_prompt": False}
    response = await http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "ipython"
    body = {"model": "tpl_roles", "messages": [{"role": "wizard", "content": "hi"}]}
    refused = error(await http.post("/v1/chat/completions", json=body), 400)
    assert refused["param"] == "messages"
    assert refused["message"].endswith("Unknown role: wizard")
    body = {"model": "tpl_roles", "messages": [{"role": 5, "content": "hi"}]}
    assert error(await http.post("/v1/chat/completions", json=body), 400)["param"] == (
        "messages[0].role"
    )
