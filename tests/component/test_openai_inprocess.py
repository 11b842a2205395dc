"""The /v1 front end in process: the HTTP application over httpx's ASGI transport, the
core and the lifecycle in this process, the stand-in models of tests/textgen.py in real
Python-backend workers. The same answers as over a socket (tests/e2e/test_openai_*.py),
here where coverage sees them; also the pieces on their own (template, parameter names)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
import textgen
from modelgen import make_lifecycle
from openai_inprocess import error, openai_client

from ge_serve.backends.base import TextGeneration
from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.http.openai.errors import OpenAIError
from ge_serve.server.http.openai.schemas import ChatCompletionRequest, ChatMessage, parse
from ge_serve.server.http.openai.template import render
from ge_serve.server.inference.core import InferenceServer

pytestmark = pytest.mark.timeout(120)
# The tests on the module's app (`http`) run in its loop.
ON_APP = pytest.mark.asyncio(loop_scope="module")

HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return textgen.write(tmp_path_factory.mktemp("openai-inprocess"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    """One app and its Python workers for the module: its tests only send requests (none
    loads or unloads a model, nor reads statistics), and the models keep no state between
    requests."""
    async with openai_client(repo, ["textgen", "textgen_plain", "embedder"]) as client:
        yield client


def events(response: httpx.Response) -> list[Any]:
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = [block for block in response.text.split("\n\n") if block]
    assert all(block.startswith("data: ") for block in blocks)
    return [
        block.removeprefix("data: ") if block == "data: [DONE]" else json.loads(block[6:])
        for block in blocks
    ]


@ON_APP
async def test_models_chat_completions_and_embeddings(http: httpx.AsyncClient) -> None:
    listed = (await http.get("/v1/models")).json()
    assert [m["id"] for m in listed["data"]] == ["embedder", "textgen", "textgen_plain"]
    # vLLM's ModelCard fields beside OpenAI's: the context where the server knows it (the
    # config's max_model_len), null where not; no `permission` (vLLM's constant flags).
    cards = {m["id"]: m for m in listed["data"]}
    assert {name: cards[name]["max_model_len"] for name in cards} == {
        "embedder": None,
        "textgen": textgen.MAX_MODEL_LEN,
        "textgen_plain": None,
    }
    for name, card in cards.items():
        assert (card["root"], card["parent"], card["owned_by"]) == (name, None, "ge-serve")
        assert set(card) == {
            "id",
            "object",
            "created",
            "owned_by",
            "root",
            "parent",
            "max_model_len",
        }
    assert (await http.get("/v1/models/textgen")).json() == cards["textgen"]
    assert (await http.get("/v1/models/textgen")).json()["object"] == "model"
    error(await http.get("/v1/models/nope"), 404)

    words = textgen.render_chat(HELLO).split()
    chat = await http.post("/v1/chat/completions", json={"model": "textgen", "messages": HELLO})
    answer = chat.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {
        "role": "assistant",
        "content": " ".join(words),
        "reasoning": None,
    }
    assert answer["usage"] == {
        "prompt_tokens": len(words),
        "completion_tokens": len(words),
        "total_tokens": 2 * len(words),
        "completion_tokens_details": None,  # vLLM's null without --reasoning-parser
    }

    body = {
        "model": "textgen",
        "messages": HELLO,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 2,
    }
    streamed = events(await http.post("/v1/chat/completions", json=body))
    assert streamed[-1] == "[DONE]"
    chunks = streamed[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["delta"] == {"content": words[0]}
    # vLLM's: the last token's text comes with the finish reason.
    assert chunks[2]["choices"][0] == {
        "index": 0,
        "delta": {"content": " " + words[1]},
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": None,
    }
    assert chunks[3]["choices"] == [] and chunks[3]["usage"]["completion_tokens"] == 2
    assert all(c["usage"] is None for c in chunks[:3])

    completion = await http.post(
        "/v1/completions", json={"model": "textgen_plain", "prompt": ["a b c"], "stop": "c"}
    )
    assert completion.json()["choices"][0]["text"] == "a b"
    streamed = events(
        await http.post(
            "/v1/completions", json={"model": "textgen", "prompt": "x y", "stream": True}
        )
    )
    assert [c["choices"][0]["text"] for c in streamed[:-1]] == ["x", " y"]
    assert streamed[-2]["choices"][0]["finish_reason"] == "stop"

    shown = await http.post(
        "/v1/completions",
        json={"model": "textgen", "prompt": "SHOW_PARAMS", "top_k": 5, "ignore_eos": True},
    )
    sent = json.loads(shown.json()["choices"][0]["text"])
    assert sent["sampling"] == {"top_k": 5, "ignore_eos": True, "max_tokens": 16}

    texts = ["ab 12", "z"]
    floats = await http.post("/v1/embeddings", json={"model": "embedder", "input": texts})
    data = floats.json()
    for item, text in zip(data["data"], texts, strict=True):
        assert item["embedding"] == pytest.approx(textgen.embedder_vector(text), abs=1e-6)
    assert data["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    coded = await http.post(
        "/v1/embeddings", json={"model": "embedder", "input": "z", "encoding_format": "base64"}
    )
    raw = base64.b64decode(coded.json()["data"][0]["embedding"])
    assert np.frombuffer(raw, "<f4").tolist() == pytest.approx(textgen.embedder_vector("z"))


@ON_APP
@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/chat/completions", {"model": "nope", "messages": HELLO}, 404, "model"),
        ("/v1/embeddings", {"model": "textgen", "input": "a"}, 404, "model"),
        ("/v1/chat/completions", {"model": "textgen_plain", "messages": HELLO}, 400, "model"),
        ("/v1/chat/completions", {"model": "textgen", "messages": []}, 400, "messages"),
        (
            "/v1/chat/completions",
            {"model": "textgen", "messages": [{"role": "tool", "content": "x"}]},
            400,
            "messages",
        ),
        ("/v1/chat/completions", {"model": "textgen", "messages": HELLO, "n": 129}, 400, "n"),
        (
            "/v1/chat/completions",
            {"model": "textgen", "messages": HELLO, "max_tokens": 99},
            400,
            "max_tokens",
        ),
        (
            "/v1/chat/completions",
            {"model": "textgen", "messages": HELLO, "tool_choice": "auto"},
            400,
            "tool_choice",
        ),
        (
            "/v1/completions",
            {"model": "textgen", "prompt": "a", "add_special_tokens": False},
            400,
            "add_special_tokens",
        ),
        ("/v1/completions", {"model": "textgen", "prompt": "a", "top_p": 2}, 400, "top_p"),
        # The model refuses a prompt past its context: its INVALID_ARG is the client's 400,
        # on the field that holds the prompt.
        ("/v1/completions", {"model": "textgen", "prompt": "w " * 70}, 400, "prompt"),
        (
            "/v1/completions",
            {"model": "textgen", "prompt": "w " * 70, "stream": True},
            400,
            "prompt",
        ),
        ("/v1/embeddings", {"model": "embedder", "input": []}, 400, "input"),
        ("/v1/embeddings", {"model": "embedder", "input": "a", "dimensions": 5}, 400, "dimensions"),
    ],
)
async def test_errors(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    assert error(await http.post(path, json=body), status)["param"] == param


@ON_APP
async def test_malformed_bodies(http: httpx.AsyncClient) -> None:
    bad = await http.post("/v1/completions", content=b"{oops")
    assert error(bad, 400)["code"] == "invalid_json"
    error(await http.post("/v1/completions", content=b"[]"), 400)
    error(await http.get("/v1/nowhere"), 404)


@ON_APP
async def test_a_model_error_mid_stream_is_an_error_event(http: httpx.AsyncClient) -> None:
    body = {"model": "textgen", "prompt": "FAIL_MIDSTREAM x y", "stream": True}
    streamed = events(await http.post("/v1/completions", json=body))
    assert "[DONE]" not in streamed
    assert streamed[0]["choices"][0]["text"] == "FAIL_MIDSTREAM"
    assert streamed[-1]["error"]["message"] == "the model failed mid-stream"
    assert streamed[-1]["error"]["type"] == "server_error"


def test_the_template_renders_as_hugging_face_does() -> None:
    generation = TextGeneration(
        chat_template="{{ bos_token }}{% for m in messages %}[{{ m['role'] }}:{{ m['content'] }}]"
        "{% endfor %}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}",
        bos_token="<s>",
        eos_token="</s>",
        max_model_len=0,
    )
    messages = [
        ChatMessage(role="system", content="be brief"),
        ChatMessage.model_validate({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
    ]
    assert render(generation, messages) == "<s>[system:be brief][user:hi]></s>"


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}",
        "{% set x = messages.append(1) %}",
    ],
)
def test_a_template_cannot_reach_the_server(template: str) -> None:
    generation = TextGeneration(template, "", "", 0)
    with pytest.raises(OpenAIError) as caught:
        render(generation, [ChatMessage(role="user", content="x")])
    assert caught.value.status == 400


@pytest.mark.parametrize(
    ("document", "param"),
    [
        # Optional (vLLM's), but never empty.
        ({"model": "", "messages": HELLO}, "model"),
        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"model": "m", "messages": HELLO, "stop": 3}, "stop"),
        (
            {"model": "m", "messages": HELLO, "stream_options": {"include_usage": 1}},
            "stream_options.include_usage",
        ),
    ],
)
def test_a_failed_check_names_the_parameter(document: dict[str, Any], param: str) -> None:
    with pytest.raises(OpenAIError) as caught:
        parse(ChatCompletionRequest, document)
    assert caught.value.param == param
    assert caught.value.status == 400


async def test_a_stopping_server_refuses_v1_in_openais_shape(tmp_path: Path) -> None:
    lifecycle = make_lifecycle(tmp_path)
    try:
        front = HttpFrontEnd(
            InferenceServer(lifecycle), HttpSettings(max_input_size=1 << 20, restricted_api=())
        )
        front.gate.close()
        transport = httpx.ASGITransport(app=front.build())
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            refused = error(await client.get("/v1/models"), 503)
            assert refused["type"] == "server_error"
            v2 = await client.get("/v2/health/ready")
            assert v2.status_code == 503 and isinstance(v2.json()["error"], str)
    finally:
        await lifecycle.close()


async def test_v1_routes_come_after_every_v2_route(tmp_path: Path) -> None:
    # Without the inference shortcut (--http-restricted-api), starlette tries the table in
    # order: /v1 last means a v2 request never pays for a /v1 pattern.
    lifecycle = make_lifecycle(tmp_path)
    try:
        front = HttpFrontEnd(
            InferenceServer(lifecycle), HttpSettings(max_input_size=1 << 20, restricted_api=())
        )
        paths = [route.path for route in front.routes()]
        first_v1 = next(i for i, path in enumerate(paths) if path.startswith("/v1/"))
        assert all(path.startswith("/v1/") for path in paths[first_v1:])
        # With the Responses API's three, vLLM's /v1/score and /v1/rerank, its batch chat,
        # and Anthropic's /v1/messages and its count_tokens.
        assert len(paths) - first_v1 == 16
    finally:
        await lifecycle.close()
