"""/v1 at the edges of the HTTP front end, where no model is reached: a body past
--http-max-input-size is a 413 in OpenAI's error object (Triton's OpenAI front end), the
v2 routes keep Triton's 400; `/v1` itself answers in OpenAI's shape; and Triton's OpenAI
front end's `GET /health/ready` is served, in the restricted-API category `health`."""

from __future__ import annotations

import dataclasses
import gzip
from collections.abc import AsyncIterator
from typing import Any

import httpx

from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.models.lifecycle import ModelLifecycle

LIMIT = 1024
TOO_LARGE = (
    "Request size of {} bytes exceeds the maximum allowed input size of 1024 bytes. "
    "Use --http-max-input-size to increase the limit."
)
POSTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")


def client(core: InferenceServer, **settings: Any) -> httpx.AsyncClient:
    base = HttpSettings(max_input_size=LIMIT, restricted_api=())
    front = HttpFrontEnd(core, dataclasses.replace(base, **settings))
    transport = httpx.ASGITransport(app=front.build())
    return httpx.AsyncClient(transport=transport, base_url="http://ge-serve")


def error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    found: dict[str, Any] = body["error"]
    return found


async def pieces(*sizes: int) -> AsyncIterator[bytes]:
    for size in sizes:
        yield b"x" * size


async def test_a_v1_body_past_the_limit_is_413_content_too_large(
    lifecycle: ModelLifecycle,
) -> None:
    async with client(InferenceServer(lifecycle)) as http:
        for path in POSTS:
            declared = await http.post(path, content=b"x" * (LIMIT + 1))
            found = error(declared, 413)
            assert found == {
                "message": TOO_LARGE.format(LIMIT + 1),
                "type": "invalid_request_error",
                "param": None,
                "code": "content_too_large",
            }
            # The rest of the body is unread: the connection ends with the answer.
            assert declared.headers["connection"] == "close"
            # Chunked, counted as it arrives.
            chunked = await http.post(path, content=pieces(LIMIT, 1))
            assert error(chunked, 413)["message"] == TOO_LARGE.format(LIMIT + 1)
            assert chunked.headers["connection"] == "close"
            # At the limit it is read, and checked.
            at_limit = await http.post(path, content=b"x" * LIMIT)
            assert error(at_limit, 400)["code"] == "invalid_json"
        inflated = await http.post(
            POSTS[0],
            content=gzip.compress(b" " * (LIMIT + 1)),
            headers={"content-encoding": "gzip"},
        )
        found = error(inflated, 413)
        assert found["code"] == "content_too_large"
        assert found["message"].startswith("Decompressed request size exceeds the maximum")
        # Triton's front end's load and unload take no body, but one past the limit is
        # the same 413, before the model-control mode is looked at.
        for path in ("/v1/models/m/load", "/v1/models/m/unload"):
            found = error(await http.post(path, content=b"x" * (LIMIT + 1)), 413)
            assert found["code"] == "content_too_large"
        # v2 keeps Triton's 400 and words.
        v2 = await http.post("/v2/repository/index", content=b"x" * (LIMIT + 1))
        assert v2.status_code == 400
        assert v2.json() == {
            "error": f"request JSON size of {LIMIT + 1} bytes exceeds the maximum allowed "
            f"input size of {LIMIT} bytes. Use --http-max-input-size to increase the limit."
        }


async def test_a_v1_body_in_too_many_chunks_ends_the_connection(
    lifecycle: ModelLifecycle,
) -> None:
    async with client(InferenceServer(lifecycle), max_chunks=4) as http:
        refused = await http.post(POSTS[1], content=pieces(1, 1, 1, 1, 1))
        assert error(refused, 400)["message"].startswith("Chunked request body exceeds")
        assert refused.headers["connection"] == "close"


async def test_v1_itself_answers_in_openais_shape(lifecycle: ModelLifecycle) -> None:
    async with client(InferenceServer(lifecycle)) as http:
        assert error(await http.get("/v1"), 404)["type"] == "invalid_request_error"
        assert error(await http.post("/v1"), 404)["message"] == "Not Found: no route for POST /v1"
        # Other paths keep the v2 shape.
        assert isinstance((await http.get("/v1x")).json()["error"], str)


async def test_vllms_tokenizer_routes_answer_every_refusal_in_openais_shape(
    lifecycle: ModelLifecycle,
) -> None:
    rules = (("inference", "api-key", "s3cret"),)
    async with client(InferenceServer(lifecycle), restricted_api=rules) as http:
        for route in ("/tokenize", "/detokenize"):
            refused = error(await http.post(route, json={}), 401)
            assert refused["type"] == "authentication_error" and refused["code"] == "invalid_auth"
            wrong = await http.get(route, headers={"api-key": "s3cret"})
            assert error(wrong, 405)["message"] == f"Method Not Allowed: GET {route}"


async def test_health_ready_answers_as_tritons_openai_front_end(
    lifecycle: ModelLifecycle,
) -> None:
    core = InferenceServer(lifecycle)
    async with client(core) as http:
        ready = await http.get("/health/ready")
        assert ready.status_code == 200 and ready.content == b""
        core.begin_draining()
        not_ready = await http.get("/health/ready")
        assert not_ready.status_code == 400
        assert not_ready.json() == {
            "detail": "Attached inference engine is not ready for inference requests."
        }


async def test_health_ready_is_in_the_health_category(lifecycle: ModelLifecycle) -> None:
    rules = (("health", "x-probe", "yes"),)
    async with client(InferenceServer(lifecycle), restricted_api=rules) as http:
        refused = await http.get("/health/ready")
        assert refused.status_code == 403
        assert refused.json() == {"error": "This API is restricted, expecting header 'x-probe'"}
        allowed = await http.get("/health/ready", headers={"x-probe": "yes"})
        assert allowed.status_code == 200


async def test_vllms_health_route_answers_liveness(lifecycle: ModelLifecycle) -> None:
    # guidellm and probes written for vLLM GET /health first: 200, no body, while live.
    core = InferenceServer(lifecycle)
    async with client(core) as http:
        live = await http.get("/health")
        assert live.status_code == 200 and live.content == b""
        core.begin_draining()  # not ready, still live: a liveness probe must not restart it
        assert (await http.get("/health")).status_code == 200
        core.fail_initialization()
        dead = await http.get("/health")
        assert dead.status_code == 503 and dead.content == b""


async def test_vllms_health_route_is_in_the_health_category(lifecycle: ModelLifecycle) -> None:
    rules = (("health", "x-probe", "yes"),)
    async with client(InferenceServer(lifecycle), restricted_api=rules) as http:
        assert (await http.get("/health")).status_code == 403
        assert (await http.get("/health", headers={"x-probe": "yes"})).status_code == 200


def anthropic_error(response: httpx.Response, status: int) -> str:
    """Anthropic's error object of a `status` answer: its type and message only."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return str(body["error"]["type"])


async def test_anthropics_routes_answer_edges_in_anthropics_shape(
    lifecycle: ModelLifecycle,
) -> None:
    # Restricted as chat is (`inference`), so `x-api-key`, the header Anthropic's SDKs
    # send, can be the key; refused, Anthropic's authentication_error.
    rules = (("inference", "x-api-key", "s3cret"),)
    async with client(InferenceServer(lifecycle), restricted_api=rules) as http:
        for route in ("/v1/messages", "/v1/messages/count_tokens", "/openai/v1/messages"):
            refused = await http.post(route, json={})
            assert anthropic_error(refused, 401) == "authentication_error"
            key = {"x-api-key": "s3cret"}
            large = await http.post(route, content=b"x" * (LIMIT + 1), headers=key)
            assert anthropic_error(large, 413) == "request_too_large"
            wrong = await http.get(route, headers=key)
            assert anthropic_error(wrong, 405) == "invalid_request_error"
