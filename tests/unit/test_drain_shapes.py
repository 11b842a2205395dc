"""While the server stops, the 503 is in each API's error object: OpenAI's on /v1,
Anthropic's on /v1/messages (whose SDKs raise OverloadedError for it), Triton's
elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import orjson

from ge_serve.server.control.stopping import DrainGate
from ge_serve.server.http.drain import RefuseWhileDraining


async def _never(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("a request was let through a closed gate")


def _refusal(path: str) -> tuple[int, Any]:
    gate = DrainGate()
    gate.close()
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "method": "POST", "headers": []}
    asyncio.run(RefuseWhileDraining(_never, gate)(scope, receive, send))
    return sent[0]["status"], orjson.loads(sent[1]["body"])


def test_each_api_is_refused_in_its_own_shape() -> None:
    status, body = _refusal("/v1/messages")
    assert status == 503 and body["type"] == "error"
    assert body["error"]["type"] == "overloaded_error" and set(body["error"]) == {"type", "message"}
    status, body = _refusal("/v1/chat/completions")
    assert status == 503 and body["error"]["type"] == "server_error"
    assert isinstance(_refusal("/v2/models/m/infer")[1]["error"], str)
