"""/v1 at the edges of the HTTP front end, where no model is reached: `/v1` itself
answers in OpenAI's shape."""

from __future__ import annotations

from typing import Any

import httpx

from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.models.lifecycle import ModelLifecycle

LIMIT = 1024


def client(core: InferenceServer, **settings: Any) -> httpx.AsyncClient:
    front = HttpFrontEnd(
        core, HttpSettings(**{"max_input_size": LIMIT, "restricted_api": ()} | settings)
    )
    transport = httpx.ASGITransport(app=front.build())
    return httpx.AsyncClient(transport=transport, base_url="http://ge-serve")


def error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    found: dict[str, Any] = body["error"]
    return found


async def test_v1_itself_answers_in_openais_shape(lifecycle: ModelLifecycle) -> None:
    async with client(InferenceServer(lifecycle)) as http:
        assert error(await http.get("/v1"), 404)["type"] == "invalid_request_error"
        assert error(await http.post("/v1"), 404)["message"] == "Not Found: no route for POST /v1"
        # Other paths keep the v2 shape.
        assert isinstance((await http.get("/v1x")).json()["error"], str)
