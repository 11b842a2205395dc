"""vLLM's `--enable-server-load-tracking` and `GET /load`: `{"server_load": N}`, the
requests in progress on vLLM's counted routes, each from when its route takes it until
its answer's last byte is sent (a stream's too), and given back however it ends: an
error, a client gone mid-stream. Other routes never count; off, `/load` answers 0. The
application is driven as uvicorn drives it, so a test looks at `/load` while an answer
is being sent."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import pytest
import pytest_asyncio
from openai_inprocess import openai_app
from starlette.types import ASGIApp, Message

from ge_serve.server.control.restrictions import http_category
from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference.core import InferenceServer

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="module")]

TRACKED = HttpSettings(max_input_size=1 << 20, restricted_api=(), load_tracking=True)
SAMPLING: dict[str, Any] = {"model": "tiny", "max_tokens": 3, "temperature": 0}
CHAT = {**SAMPLING, "messages": [{"role": "user", "content": "hi"}]}


class ClientGoneError(OSError):
    """What a send to a closed connection raises (starlette's ClientDisconnect then)."""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-server-load")
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def core(repo: Path) -> AsyncIterator[InferenceServer]:
    async with openai_app(repo, ["tiny"]) as (_, found):
        yield found


def application(core: InferenceServer, settings: HttpSettings = TRACKED) -> ASGIApp:
    return HttpFrontEnd(core, settings).build()


async def load(app: ASGIApp, **headers: str) -> int:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answer = await client.get("/load", headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    found = answer.json()
    assert set(found) == {"server_load"}
    count: int = found["server_load"]
    return count


async def drive(
    app: ASGIApp,
    path: str,
    body: Any,
    on_body: Callable[[], Awaitable[None]],
    left: asyncio.Event | None = None,
    spec: str = "2.4",
) -> tuple[int, bytes]:
    """POST `body` to `path` as uvicorn would (`spec`: the ASGI spec version it says);
    `on_body` runs as each part of the answer's body is sent (it may raise ClientGoneError,
    or set `left`: the client's disconnect is what `receive` gives next, as uvicorn's
    httptools protocol does, spec 2.3). The status and body."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"test"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(raw)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("test", 80),
    }
    given = False
    gone = left or asyncio.Event()
    status, sent = 0, bytearray()

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()  # the client stays until the answer is sent, or leaves
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            await on_body()
            sent.extend(message.get("body", b""))

    await app(scope, receive, send)
    return status, bytes(sent)


@pytest.mark.parametrize(
    ("path", "body", "counted"),
    [
        ("/v1/chat/completions", {**CHAT, "stream": True}, 1),
        ("/v1/completions", {**SAMPLING, "prompt": "hi"}, 1),
        ("/openai/v1/completions", {**SAMPLING, "prompt": "hi"}, 1),
        ("/tokenize", {"model": "tiny", "prompt": "hi"}, 0),
        ("/invocations", {**CHAT, "stream": True}, 1),
    ],
    ids=["chat-stream", "completions", "kserve-prefix", "tokenize-uncounted", "invocations"],
)
async def test_a_request_counts_until_its_last_byte_is_sent(
    core: InferenceServer, path: str, body: Any, counted: int
) -> None:
    app = application(core)
    seen: list[int] = []

    async def look() -> None:
        seen.append(await load(app))

    status, sent = await drive(app, path, body, look)
    assert status == 200, sent
    assert seen and set(seen) == {counted}
    if body.get("stream"):
        assert len(seen) > 2 and sent.endswith(b"data: [DONE]\n\n")
    assert await load(app) == 0


async def test_a_client_gone_mid_stream_is_given_back(core: InferenceServer) -> None:
    app = application(core)
    seen: list[int] = []
    body = {**CHAT, "max_tokens": 8, "ignore_eos": True, "stream": True}

    async def send_fails() -> None:
        seen.append(await load(app))
        if len(seen) == 2:
            raise ClientGoneError("the client closed the connection")

    with pytest.raises(Exception):  # noqa: B017 -- starlette's ClientDisconnect
        await drive(app, "/v1/chat/completions", body, send_fails)
    assert seen == [1, 1]
    assert await load(app) == 0
    # uvicorn's way (ASGI 2.3): the disconnect message, which ends the stream early.
    left = asyncio.Event()

    async def leaves() -> None:
        seen.append(await load(app))
        left.set()
        await asyncio.Event().wait()  # a slow client's send, until the disconnect ends it

    status, sent = await drive(app, "/v1/chat/completions", body, leaves, left, "2.3")
    assert status == 200 and b"[DONE]" not in sent
    assert seen[2:] == [1] and await load(app) == 0


async def test_errors_and_refusals_never_drift(core: InferenceServer) -> None:
    app = application(core, dataclasses.replace(TRACKED, api_keys=("k3y",)))
    key = {"authorization": "Bearer k3y"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        for answer, status in (
            (await client.post("/v1/completions", json={**SAMPLING, "prompt": "hi"}), 401),
            (await client.post("/v1/completions", headers=key, content=b"{"), 400),
            (await client.post("/v1/completions", headers=key, json={"prompt": 1}), 400),
            (
                await client.post(
                    "/v1/completions", headers=key, json={"model": "x", "prompt": "hi"}
                ),
                404,
            ),
            (await client.get("/v1/chat/completions", headers=key), 405),
            (await client.post("/score", headers=key, json={"model": "tiny"}), 400),
        ):
            assert answer.status_code == status, answer.text
        # vLLM's /load is outside the prefixes its --api-key guards.
        assert await load(app) == 0
        assert (await client.post("/load")).json()["error"]["type"] == "invalid_request_error"
    assert http_category("/load") == "statistics"


async def test_off_load_answers_zero(core: InferenceServer) -> None:
    app = application(core, HttpSettings(max_input_size=1 << 20, restricted_api=()))
    seen: list[int] = []

    async def look() -> None:
        seen.append(await load(app))

    status, _ = await drive(app, "/v1/chat/completions", {**CHAT, "stream": True}, look)
    assert status == 200 and seen and set(seen) == {0}
