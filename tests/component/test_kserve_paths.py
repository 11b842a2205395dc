"""KServe's paths on the HTTP front end, for deployments moved from KServe: its OpenAI
prefix, `/openai/v1/...`, answers as `/v1/...` does (the same routes, errors, limits,
restricted-API categories and refusal while stopping), and KServe v1's liveness route,
`GET /`, answers `{"status": "alive"}`. In process, over httpx's ASGI transport; the
answers of the routes themselves, with models, are tested on /v1 (and through an HTTP
worker in tests/e2e/test_openai_client.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.models.lifecycle import ModelLifecycle

LIMIT = 1024
KSERVE = "/openai/v1"


@asynccontextmanager
async def client(
    core: InferenceServer, rules: tuple[tuple[str, str, str], ...] = ()
) -> AsyncIterator[tuple[HttpFrontEnd, httpx.AsyncClient]]:
    front = HttpFrontEnd(core, HttpSettings(max_input_size=LIMIT, restricted_api=rules))
    transport = httpx.ASGITransport(app=front.build())
    async with httpx.AsyncClient(transport=transport, base_url="http://ge-serve") as http:
        yield front, http


def openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    found: dict[str, Any] = body["error"]
    return found


async def test_the_kserve_prefix_answers_as_v1(lifecycle: ModelLifecycle) -> None:
    async with client(InferenceServer(lifecycle)) as (_, http):
        for path in ("/models", "/models/nope"):
            served, alias = await http.get("/v1" + path), await http.get(KSERVE + path)
            assert (alias.status_code, alias.json()) == (served.status_code, served.json())
        assert (await http.get(KSERVE + "/models")).json() == {"object": "list", "data": []}
        # KServe's /openai/v1/rerank too: vLLM's, as /v1/rerank (and /v1/score beside it).
        scoring = {"query": "a", "queries": "a", "documents": ["b"]}
        for path in ("/chat/completions", "/completions", "/embeddings", "/rerank", "/score"):
            body = {
                "model": "nope",
                "prompt": "a",
                "input": "a",
                "messages": [{"role": "user", "content": "a"}],
                # (Chat's `documents` are objects, the scoring routes' are texts.)
                **(scoring if path in ("/rerank", "/score") else {}),
            }
            found = openai_error(await http.post(KSERVE + path, json=body), 404)
            assert found["code"] == "model_not_found"
            # A body is read as on /v1: past --http-max-input-size, OpenAI's 413.
            too_large = await http.post(KSERVE + path, content=b"x" * (LIMIT + 1))
            assert openai_error(too_large, 413)["code"] == "content_too_large"
        predict = openai_error(await http.post(KSERVE + "/models/simple:predict", json={}), 404)
        assert "POST /v2/models/simple/infer" in predict["message"]


async def test_what_the_prefix_does_not_serve_is_openais_404(lifecycle: ModelLifecycle) -> None:
    async with client(InferenceServer(lifecycle)) as (_, http):
        missing = openai_error(await http.get(KSERVE + "/files"), 404)
        assert missing["message"] == f"Not Found: no route for GET {KSERVE}/files"
        assert openai_error(await http.get(KSERVE), 404)["type"] == "invalid_request_error"
        wrong = openai_error(await http.get(KSERVE + "/completions"), 405)
        assert wrong["message"] == f"Method Not Allowed: GET {KSERVE}/completions"
        # Only /v1 has the alias, and the prefix alone is no OpenAI path.
        for path in (
            "/openai/tokenize",
            "/openai/rerank",
            "/openai/health",
            "/openai/v2/health/live",
            "/openai",
        ):
            other = await http.get(path)
            assert other.status_code == 404
            assert other.json() == {"error": f"Not Found: no route for GET {path}"}


async def test_a_restricted_route_is_restricted_under_the_prefix(
    lifecycle: ModelLifecycle,
) -> None:
    rules = (
        ("inference", "api-key", "s3cret"),
        ("metadata", "meta-key", "m"),
        ("model-repository", "admin-key", "a"),
    )
    async with client(InferenceServer(lifecycle), rules) as (_, http):
        for method, path, header in (
            ("POST", "/completions", "api-key"),
            ("POST", "/chat/completions", "api-key"),
            ("POST", "/embeddings", "api-key"),
            ("GET", "/models", "meta-key"),
            ("GET", "/models/nope", "meta-key"),
            ("POST", "/models/nope/load", "admin-key"),
            ("POST", "/models/nope/unload", "admin-key"),
        ):
            refused = openai_error(await http.request(method, KSERVE + path), 401)
            assert refused["message"] == (
                f"This API is restricted, expecting header '{header}' with valid value"
            )
        allowed = await http.get(KSERVE + "/models", headers={"meta-key": "m"})
        assert allowed.status_code == 200


async def test_the_prefix_is_refused_in_openais_shape_while_stopping(
    lifecycle: ModelLifecycle,
) -> None:
    async with client(InferenceServer(lifecycle)) as (front, http):
        front.gate.close()
        refused = await http.get(KSERVE + "/models")
        assert openai_error(refused, 503)["type"] == "server_error"
        assert refused.headers["connection"] == "close"


async def test_get_root_is_kserve_v1_liveness(lifecycle: ModelLifecycle) -> None:
    core = InferenceServer(lifecycle)
    async with client(core) as (_, http):
        live = await http.get("/")
        assert (live.status_code, live.json()) == (200, {"status": "alive"})
        assert live.headers["content-type"] == "application/json"
        core.begin_draining()  # not ready, still live
        assert (await http.get("/")).json() == {"status": "alive"}
        core.fail_initialization()
        dead = await http.get("/")
        assert (dead.status_code, dead.json()) == (503, {"status": "not alive"})


async def test_get_root_is_in_the_health_category(lifecycle: ModelLifecycle) -> None:
    async with client(InferenceServer(lifecycle), (("health", "x-probe", "yes"),)) as (_, http):
        refused = await http.get("/")
        assert refused.status_code == 403
        assert refused.json() == {"error": "This API is restricted, expecting header 'x-probe'"}
        assert (await http.get("/", headers={"x-probe": "yes"})).status_code == 200
