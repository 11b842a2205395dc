"""`model` left out of a /v1 generation request, as vLLM 0.34 takes it (its requests'
`model: str | None = None`): the one generative model the server serves answers, and the
answer names it; with several, or none, a 400 naming `model`. Over the llm backend's tiny
model (tests/llmrepo.py), a second copy of it, and tests/textgen.py's embedding model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import error, openai_client
from pymodels import write_model

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="module")]

MESSAGES = [{"role": "user", "content": "Hi"}]
GREEDY: dict[str, Any] = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
# Each route's body, less `model`.
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": GREEDY | {"messages": MESSAGES},
    "/v1/completions": GREEDY | {"prompt": "Hi"},
    "/v1/chat/completions/batch": GREEDY | {"messages": [MESSAGES, MESSAGES]},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 4, "temperature": 0},
}
# vLLM's names of the APIs (its words for a server whose model does not generate).
APIS = {
    "/v1/chat/completions": "Chat Completions API",
    "/v1/completions": "Completions API",
    "/v1/chat/completions/batch": "Chat Completions API",
    "/v1/responses": "Responses API",
}
STREAMED = ["/v1/chat/completions", "/v1/completions", "/v1/responses"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-default-model")
    llmrepo.write_tiny_llm(folder, "tiny")
    llmrepo.write_tiny_llm(folder, "tiny_two")
    write_model(folder, "embedder", textgen.EMBEDDER, textgen._EMBEDDER_CONFIG)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["tiny"]) as client:
        yield client


async def ok(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(path, json=body)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


async def events(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed answer's JSON events, in order."""
    found = []
    async with http.stream("POST", path, json=body | {"stream": True}) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                found.append(json.loads(line[6:]))
    return found


def text_of(path: str, answer: dict[str, Any]) -> list[str]:
    """What an answer says, choice by choice."""
    if path == "/v1/responses":
        return [part["text"] for item in answer["output"] for part in item["content"]]
    if path == "/v1/completions":
        return [choice["text"] for choice in answer["choices"]]
    return [choice["message"]["content"] for choice in answer["choices"]]


def streamed_text(path: str, found: list[dict[str, Any]]) -> tuple[str, set[str]]:
    """A stream's text, and the model names its events give."""
    if path == "/v1/responses":
        text = "".join(e["delta"] for e in found if e["type"] == "response.output_text.delta")
        return text, {e["response"]["model"] for e in found if "response" in e}
    if path == "/v1/completions":
        text = "".join(c["text"] for e in found for c in e["choices"])
    else:
        text = "".join(c["delta"].get("content") or "" for e in found for c in e["choices"])
    return text, {e["model"] for e in found}


@pytest.mark.parametrize("path", list(BODIES))
async def test_without_model_the_one_generative_model_answers(
    http: httpx.AsyncClient, path: str
) -> None:
    named = await ok(http, path, BODIES[path] | {"model": "tiny"})
    assert named["model"] == "tiny"
    for unnamed in (BODIES[path], BODIES[path] | {"model": None}):  # vLLM's None too
        answer = await ok(http, path, unnamed)
        assert answer["model"] == "tiny"
        assert text_of(path, answer) == text_of(path, named)
        assert all(text_of(path, answer))


@pytest.mark.parametrize("path", STREAMED)
async def test_without_model_the_stream_names_the_served_model(
    http: httpx.AsyncClient, path: str
) -> None:
    named = streamed_text(path, await events(http, path, BODIES[path] | {"model": "tiny"}))
    text, models = streamed_text(path, await events(http, path, BODIES[path]))
    assert models == {"tiny"} and text == named[0] and text


async def test_the_served_models_statistics_count_the_requests(http: httpx.AsyncClient) -> None:
    async def count() -> int:
        stats = (await http.get("/v2/models/tiny/stats")).json()["model_stats"][0]
        found: int = stats["inference_stats"]["success"]["count"]
        return found

    async def settled() -> int:
        # A request is counted when the engine releases it, just after its last response:
        # the tests before this one may still be counted.
        found, seen = await count(), -1
        while found != seen:
            await asyncio.sleep(0.05)
            found, seen = await count(), found
        return found

    before = await settled()
    await ok(http, "/v1/completions", BODIES["/v1/completions"])
    assert await settled() == before + 1


async def test_without_model_a_conversation_past_the_context_is_refused_first(
    http: httpx.AsyncClient,
) -> None:
    # The tiny model's context is 256 tokens; each message renders to one at least.
    body = {"messages": [{"role": "user", "content": "x"}] * 300}
    found = error(await http.post("/v1/chat/completions", json=body))
    assert found["code"] == "context_length_exceeded"
    assert found["message"].endswith("your messages are 300 messages, each of at least one token.")


async def test_tokenize_a_chat_without_model(http: httpx.AsyncClient) -> None:
    named = await ok(http, "/tokenize", {"model": "tiny", "messages": MESSAGES})
    assert await ok(http, "/tokenize", {"messages": MESSAGES}) == named


async def test_two_generative_models_need_model(repo: Path) -> None:
    async with openai_client(repo, ["tiny", "tiny_two"]) as http:
        for path, body in BODIES.items():
            for sent in (body, body | {"stream": True}) if path in STREAMED else (body,):
                found = error(await http.post(path, json=sent))
                assert found["param"] == "model", path
                assert found["message"] == (
                    "Missing required parameter: 'model' (2 generative models here)"
                ), path
        # Named, each answers.
        for name in ("tiny", "tiny_two"):
            answer = await ok(http, "/v1/completions", BODIES["/v1/completions"] | {"model": name})
            assert answer["model"] == name


async def test_an_embedding_model_alone_does_not_generate(repo: Path) -> None:
    async with openai_client(repo, ["embedder"]) as http:
        for path, body in BODIES.items():
            for sent in (body, body | {"stream": True}) if path in STREAMED else (body,):
                found = error(await http.post(path, json=sent))
                assert found["param"] == "model", path
                assert found["message"] == (
                    f"The model does not support {APIS[path]}: the server serves no "
                    "generative model"
                ), path
