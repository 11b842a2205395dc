"""vLLM's chat flags as a /v1 client sees them: the server's --chat-template in place of
each model's own (and for a model without one), --default-chat-template-kwargs under a
request's own, a request's own template under --trust-request-chat-template, and
--response-role. The models are tests/textgen.py's echo models: a chat's answer is the
prompt the template rendered, word by word."""

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

from ge_serve.server.control.chat import ChatSettings

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHAT = "/v1/chat/completions"
TEMPLATE = (
    "{{ greeting }} {% for m in messages %}{{ m['role'] }}={{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}go{% endif %}"
)
SETTINGS = ChatSettings(
    template=TEMPLATE,
    default_kwargs={"greeting": "hola"},
    trust_request_template=True,
    response_role="bot",
)
HI = [{"role": "user", "content": "hi"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    repo: Path = textgen.write(tmp_path_factory.mktemp("openai-chat-flags"))
    models = ["textgen", "textgen_plain", "embedder"]
    async with openai_client(repo, models, chat=SETTINGS) as client:
        yield client


async def answer(http: httpx.AsyncClient, model: str = "textgen", **fields: Any) -> dict[str, Any]:
    body = {"model": model, "messages": HI, "max_tokens": 20, **fields}
    response = await http.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    message: dict[str, Any] = response.json()["choices"][0]["message"]
    return message


@pytest.mark.parametrize("model", ["textgen", "textgen_plain"])
async def test_the_servers_template_renders_every_chat(http: httpx.AsyncClient, model: str) -> None:
    # textgen's own ChatML template is not used; textgen_plain, which has none, chats.
    found = await answer(http, model)
    assert found == {**found, "role": "bot", "content": "hola user=hi go"}


async def test_a_requests_variables_are_over_the_defaults(http: httpx.AsyncClient) -> None:
    found = await answer(http, chat_template_kwargs={"greeting": "hey"})
    assert found["content"] == "hey user=hi go"


async def test_a_trusted_requests_template_renders_its_chat(http: httpx.AsyncClient) -> None:
    template = "{{ messages[0]['content'] }} mine {{ greeting }}"
    assert (await answer(http, chat_template=template))["content"] == "hi mine hola"


async def test_the_response_role_is_where_a_generation_prompt_opens_the_turn(
    http: httpx.AsyncClient,
) -> None:
    body = {"model": "textgen", "messages": HI, "max_tokens": 20, "stream": True}
    async with http.stream("POST", CHAT, json=body) as response:
        text = (await response.aread()).decode()
    first = json.loads(text.split("\n\n")[0].removeprefix("data: "))
    assert first["choices"][0]["delta"]["role"] == "bot"
    # Without a generation prompt, the answer continues the last message's turn.
    found = await answer(http, add_generation_prompt=False)
    assert found["role"] == "user" and found["content"] == "hola user=hi"


async def test_the_embedding_chat_form_renders_with_the_servers_template(
    http: httpx.AsyncClient,
) -> None:
    # The embedding model has no template of its own: its chat form was a 400.
    chat = await http.post("/v1/embeddings", json={"model": "embedder", "messages": HI})
    text = await http.post("/v1/embeddings", json={"model": "embedder", "input": "hola user=hi "})
    assert chat.status_code == 200, chat.text
    assert chat.json()["data"][0]["embedding"] == text.json()["data"][0]["embedding"]


async def test_the_responses_and_messages_apis_render_with_it(http: httpx.AsyncClient) -> None:
    body = {"model": "textgen", "input": "hi", "max_output_tokens": 20}
    found = await http.post("/v1/responses", json=body)
    assert found.status_code == 200, found.text
    assert found.json()["output"][0]["content"][0]["text"] == "hola user=hi go"
    body = {"model": "textgen", "messages": HI, "max_tokens": 20}
    found = await http.post("/v1/messages", json=body)
    assert found.status_code == 200, found.text
    assert found.json()["content"][0]["text"] == "hola user=hi go"


async def test_a_requests_template_that_does_not_compile_is_its_400(
    http: httpx.AsyncClient,
) -> None:
    body = {"model": "textgen", "messages": HI, "chat_template": "{% for %}"}
    found = error(await http.post(CHAT, json=body))
    assert (found["param"], found["code"]) == ("chat_template", "chat_template_invalid")
    assert found["message"].startswith("The request's chat template does not compile: line 1")
