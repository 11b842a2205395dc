"""vLLM's `--root-path` (server/http/rootpath.py): behind a proxy that routes by a path
prefix, every route answers with and without the prefix (v2 inference's shortcut too),
`/openapi.json` names the prefix as its server, and `--api-key` and restricted APIs guard
a prefixed path as the route it reaches. In process: the tiny `llm` model and an
onnxruntime identity model behind the HTTP application, over httpx's ASGI transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from tinyfront import CHAT, INFER, front_client, tiny_core

from ge_serve.server.inference.core import InferenceServer

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="module")]

ROOT = "/proxy"
KEY = {"authorization": "Bearer k3y"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def core(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[InferenceServer]:
    async with tiny_core(tmp_path_factory.mktemp("rootpath")) as found:
        yield found


def client(core: InferenceServer, **settings: Any) -> httpx.AsyncClient:
    return front_client(core, **{"root_path": ROOT, **settings})


@pytest.mark.parametrize("prefix", [ROOT, ""], ids=["prefixed", "plain"])
async def test_every_route_answers_with_and_without_the_prefix(
    core: InferenceServer, prefix: str
) -> None:
    async with client(core) as http:
        infer = await http.post(f"{prefix}/v2/models/ident/infer", json=INFER)
        assert infer.status_code == 200, infer.text
        assert infer.json()["outputs"][0]["data"] == [1, 2, 3, 4]
        assert (await http.get(f"{prefix}/v2/health/ready")).status_code == 200
        models = await http.get(f"{prefix}/v1/models")
        assert [model["id"] for model in models.json()["data"]] == ["tiny"]
        for route in ("/v1/chat/completions", "/openai/v1/chat/completions"):
            chat = await http.post(prefix + route, json=CHAT)
            assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
        # A route that is not there: the error shape of its API, with or without it.
        missing = await http.get(f"{prefix}/v1/nothing")
        assert missing.status_code == 404
        assert (
            missing.json()["error"]["message"] == f"Not Found: no route for GET {prefix}/v1/nothing"
        )
        assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
        document = (await http.get(f"{prefix}/openapi.json")).json()
        assert document.get("servers") == ([{"url": ROOT}] if prefix else None)


async def test_a_prefix_that_is_not_a_whole_segment_is_not_taken_off(
    core: InferenceServer,
) -> None:
    async with client(core, api_keys=("k3y",)) as http:
        answer = await http.get(f"{ROOT}v1/models")
        assert answer.status_code == 404 and answer.json()["error"].startswith("Not Found")


async def test_without_a_root_path_the_document_names_no_server(core: InferenceServer) -> None:
    async with client(core, root_path="") as http:
        assert "servers" not in (await http.get("/openapi.json")).json()
        assert (await http.get(f"{ROOT}/v1/models")).status_code == 404


@pytest.mark.parametrize("prefix", [ROOT, ""], ids=["prefixed", "plain"])
async def test_the_api_key_guards_prefixed_paths(core: InferenceServer, prefix: str) -> None:
    async with client(core, api_keys=("k3y",)) as http:
        for path in ("/v1/models", "/openai/v1/models", "/v1", "/v2/embed"):
            refused = await http.get(prefix + path)
            assert refused.status_code == 401, path
            assert refused.json()["error"]["type"] == "authentication_error"
        messages = await http.post(f"{prefix}/v1/messages", json=CHAT)
        assert messages.status_code == 401 and messages.json()["type"] == "error"
        assert (await http.get(f"{prefix}/v1/models", headers=KEY)).status_code == 200
        # Triton's routes need no key, as without the prefix.
        assert (await http.post(f"{prefix}/v2/models/ident/infer", json=INFER)).status_code == 200


@pytest.mark.parametrize("prefix", [ROOT, ""], ids=["prefixed", "plain"])
async def test_restricted_apis_guard_prefixed_paths(core: InferenceServer, prefix: str) -> None:
    rules = (("inference", "x-secret", "open"),)
    async with client(core, restricted_api=rules) as http:
        refused = await http.post(f"{prefix}/v2/models/ident/infer", json=INFER)
        assert refused.status_code == 403
        assert refused.json() == {"error": "This API is restricted, expecting header 'x-secret'"}
        chat = await http.post(f"{prefix}/v1/chat/completions", json=CHAT)
        assert chat.status_code == 401 and chat.json()["error"]["type"] == "authentication_error"
        given = await http.post(
            f"{prefix}/v2/models/ident/infer", json=INFER, headers={"x-secret": "open"}
        )
        assert given.status_code == 200
