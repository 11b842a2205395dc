"""vLLM's `--api-key` (server/http/apikey.py): vLLM's routes need a key, sent as
`Authorization: Bearer` (vLLM, OpenAI's and Anthropic's SDKs) or `x-api-key` (litellm);
Triton's KServe v2 routes are untouched. In process: the tiny `llm` model and an
onnxruntime identity model behind the HTTP application, over httpx's ASGI transport."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
from tinyfront import CHAT, INFER, front_client, tiny_core

from ge_serve.server.http import apikey
from ge_serve.server.inference.core import InferenceServer

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="module")]

KEY = "s3cret"
KEYS = (KEY, "other-key")
BEARER = {"authorization": f"Bearer {KEY}"}
MESSAGE = "Invalid or missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def core(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[InferenceServer]:
    async with tiny_core(tmp_path_factory.mktemp("apikey")) as found:
        yield found


def client(core: InferenceServer, **settings: Any) -> httpx.AsyncClient:
    return front_client(core, **{"api_keys": KEYS, **settings})


@pytest_asyncio.fixture(loop_scope="module")
async def http(core: InferenceServer) -> AsyncIterator[httpx.AsyncClient]:
    async with client(core) as found:
        yield found


def refused_openai(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.json() == {
        "error": {
            "message": MESSAGE,
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


async def test_vllms_routes_refuse_no_key_and_a_wrong_one(http: httpx.AsyncClient) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"},
                    {"authorization": f"Basic {KEY}"}, {"authorization": KEY}):  # fmt: skip
        refused_openai(await http.get("/v1/models", headers=headers))
        refused_openai(await http.post("/v1/chat/completions", json=CHAT, headers=headers))
        refused_openai(await http.post("/openai/v1/chat/completions", json=CHAT, headers=headers))
        refused_openai(await http.post("/v2/embed", json={}, headers=headers))
        # Anthropic's error object on its Messages API.
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            answer = await http.post(path, json=CHAT, headers=headers)
            assert answer.status_code == 401, answer.text
            assert answer.json() == {
                "type": "error",
                "error": {"type": "authentication_error", "message": MESSAGE},
            }
    # vLLM's other guarded prefixes: no route here, still no answer without a key.
    for path in ("/inference/v1/generate", "/cohere/v2/embed", "/v1"):
        assert (await http.post(path)).status_code == 401


async def test_a_bearer_key_or_an_x_api_key_is_let_through(http: httpx.AsyncClient) -> None:
    for headers in (BEARER, {"x-api-key": KEY}, {"Authorization": "bearer other-key"},
                    {"authorization": "Bearer wrong", "x-api-key": KEY}):  # fmt: skip
        models = await http.get("/v1/models", headers=headers)
        assert models.status_code == 200 and models.json()["object"] == "list"
        chat = await http.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
        message = await http.post("/v1/messages", json=CHAT, headers=headers)
        assert message.status_code == 200 and message.json()["type"] == "message"
        # Past the key: /v2/embed's own answer (the tiny model embeds nothing).
        assert (await http.post("/v2/embed", json={}, headers=headers)).status_code == 400


async def test_the_sdks_send_their_key_and_raise_on_a_wrong_one(http: httpx.AsyncClient) -> None:
    # OpenAI's SDK sends the Bearer form; so does Anthropic's (2.x, over httpx2).
    anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is not installed")
    import httpx2

    inprocess: Any = http._transport
    transport = httpx2.ASGITransport(app=inprocess.app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://test") as own:
        good = openai.AsyncOpenAI(base_url="http://test/v1", api_key=KEY, http_client=own)
        assert [model.id async for model in good.models.list()] == ["tiny"]
        wrong = openai.AsyncOpenAI(base_url="http://test/v1", api_key="no", http_client=own)
        with pytest.raises(openai.AuthenticationError):
            await wrong.models.list()
        asked: dict[str, Any] = {"model": "tiny", "messages": CHAT["messages"]}
        sdk = anthropic.AsyncAnthropic(base_url="http://test", api_key=KEY, http_client=own)
        assert (await sdk.messages.count_tokens(**asked)).input_tokens > 0
        bad = anthropic.AsyncAnthropic(base_url="http://test", api_key="no", http_client=own)
        with pytest.raises(anthropic.AuthenticationError):
            await bad.messages.count_tokens(**asked)


async def test_tritons_routes_and_preflights_need_no_key(
    http: httpx.AsyncClient, core: InferenceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[bool] = []
    admits = apikey.ApiKeys.admits

    def spied(self: apikey.ApiKeys, headers: Any) -> bool:
        checked.append(admits(self, headers))
        return checked[-1]

    monkeypatch.setattr(apikey.ApiKeys, "admits", spied)
    assert (await http.get("/v2/health/ready")).status_code == 200
    assert (await http.get("/v2/models/ident")).json()["name"] == "ident"
    infer = await http.post("/v2/models/ident/infer", json=INFER)
    assert infer.status_code == 200 and infer.json()["outputs"][0]["data"] == [1, 2, 3, 4]
    assert checked == []  # not even looked at
    # A CORS preflight is never refused (vLLM's rule): here, /v1's own 405.
    preflight = await http.options("/v1/chat/completions")
    assert preflight.status_code == 405 and checked == []
    assert (await http.get("/v1/models")).status_code == 401 and checked == [False]
    # Triton's own restriction still guards Triton's routes; the key is not its header.
    rules = (("inference", "admin", "yes"),)
    async with client(core, restricted_api=rules) as restricted:
        infer = await restricted.post("/v2/models/ident/infer", json=INFER, headers=BEARER)
        assert infer.status_code == 403
        infer = await restricted.post(
            "/v2/models/ident/infer", json=INFER, headers={"admin": "yes"}
        )
        assert infer.status_code == 200


async def test_no_key_checks_nothing(core: InferenceServer) -> None:
    async with client(core, api_keys=()) as http:
        assert (await http.get("/v1/models")).status_code == 200


async def test_the_guarded_paths() -> None:
    for path in ("/v1", "/v1/models", "/openai/v1/models", "/v2/embed", "/v2/rerank",
                 "/inference/v1/generate", "/cohere", "/cohere/v2/chat"):  # fmt: skip
        assert apikey.guarded(path), path
    for path in ("/v2", "/v2/models/m/infer", "/v2/health/ready", "/v2/repository/index",
                 "/v1x", "/openai", "/tokenize", "/score", "/rerank", "/pooling", "/health",
                 "/metrics", "/"):  # fmt: skip
        assert not apikey.guarded(path), path
