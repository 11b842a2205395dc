"""vLLM's SageMaker routes on its HTTP port: `POST /invocations` answered by the route its
body's kind names (chat, completions, embeddings, the embedding chat form, scoring,
reranking), `/ping` as vLLM's /health, and `GET /version`. The models are
tests/textgen.py's echo (its answer is the prompt) and its embedding model."""

from __future__ import annotations

import gzip
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import error, openai_client

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

HI = [{"role": "user", "content": "hi"}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    repo: Path = textgen.write(tmp_path_factory.mktemp("openai-invocations"))
    async with openai_client(repo, ["textgen", "embedder"]) as client:
        yield client


async def both(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> tuple[Any, Any]:
    """The answers of /invocations and of the route itself, without what differs per call."""
    found = []
    for url in ("/invocations", path):
        response = await http.post(url, json=body)
        assert response.status_code == 200, response.text
        answer = response.json()
        for key in ("id", "created"):
            answer.pop(key, None)
        found.append(answer)
    return found[0], found[1]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "textgen", "messages": HI, "max_tokens": 8}),
        ("/v1/completions", {"model": "textgen", "prompt": "one two", "max_tokens": 8}),
        ("/v1/embeddings", {"model": "embedder", "input": "one two"}),
        ("/rerank", {"model": "embedder", "query": "a", "documents": ["a", "b c"]}),
        ("/score", {"model": "embedder", "text_1": "a", "text_2": "a b"}),
    ],
    ids=["chat", "completions", "embeddings", "rerank", "score"],
)
async def test_the_bodys_kind_picks_the_route(
    http: httpx.AsyncClient, path: str, body: dict[str, Any]
) -> None:
    invoked, direct = await both(http, path, body)
    assert invoked == direct


async def test_messages_for_an_embedding_model_are_its_chat_form(http: httpx.AsyncClient) -> None:
    response = await http.post("/invocations", json={"model": "embedder", "messages": HI})
    # The embedder has no chat template: the embeddings route's own refusal, not chat's.
    assert error(response)["param"] == "messages"
    assert "chat template" in error(response)["message"]


async def test_a_compressed_body_is_read_once(http: httpx.AsyncClient) -> None:
    body = {"model": "textgen", "prompt": "one two", "max_tokens": 8}
    packed = gzip.compress(json.dumps(body).encode())
    headers = {"content-encoding": "gzip", "content-type": "application/json"}
    response = await http.post("/invocations", content=packed, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == "one two"


async def test_a_body_of_no_kind_is_vllms_400(http: httpx.AsyncClient) -> None:
    found = error(await http.post("/invocations", json={"model": "textgen", "x": 1}))
    assert found["message"].startswith("Cannot find suitable handler for request.")
    assert error(await http.post("/invocations", json=[1]))["message"] == (
        "The request body must be a JSON object"
    )


async def test_messages_without_a_model_where_only_an_embedder_is_served(
    tmp_path: Path,
) -> None:
    repo: Path = textgen.write(tmp_path)
    async with openai_client(repo, ["embedder"]) as embeds:
        response = await embeds.post("/invocations", json={"messages": HI})
    # The embeddings route's own answer (its one model has no chat template), not chat's
    # "the server serves no generative model": the body goes where vLLM's tasks send it.
    assert error(response)["param"] == "messages"


async def test_embeddings_without_a_model_go_to_the_one_served(http: httpx.AsyncClient) -> None:
    # vLLM's `model` is optional (SageMaker's clients send none): its one served model.
    for path in ("/v1/embeddings", "/invocations"):
        response = await http.post(path, json={"input": "one two"})
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "embedder"


async def test_ping_and_version(http: httpx.AsyncClient) -> None:
    assert (await http.get("/ping")).status_code == 200
    assert (await http.post("/ping")).status_code == 200
    version = (await http.get("/version")).json()
    assert version == {"version": (await http.get("/v2")).json()["version"]}
