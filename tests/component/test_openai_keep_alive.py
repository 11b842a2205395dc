"""vLLM's `--sse-keep-alive-interval`: an idle /v1 chat or completions stream sends
`: keep-alive` between its events (while its request waits for its first response, and
between tokens), with the events unchanged; a stream whose first response is late answers
200 and keep-alives, and a refusal then is its error event; a refusal within the interval
is still a plain 4xx; a client that leaves while it waits cancels the request.

The model's responses are held back (the core's stream behind a gate) until the client
has received a keep-alive, so each wait is the interval, never a guess at a duration. The
application is called as an ASGI app, since the test must read the body as it is sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import pytest
import pytest_asyncio
from openai_inprocess import openai_app

from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.http.openai.tools import ToolSettings
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.types import InferRequest, InferResponse

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="module")]

KEEP_ALIVE = b": keep-alive\n\n"
ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
}
SAMPLING: dict[str, Any] = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}
Responses = Callable[..., AsyncGenerator[InferResponse, None]]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-keep-alive")
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(repo: Path) -> AsyncIterator[tuple[httpx.AsyncClient, InferenceServer]]:
    async with openai_app(repo, ["tiny"]) as found:
        yield found


class Exchange:
    """One request to the application: what it sends, as it sends it. `on_keep_alive`
    runs at each keep-alive with how many have come; `gone` makes the client leave."""

    def __init__(self, on_keep_alive: Callable[[int], None]) -> None:
        self.on_keep_alive = on_keep_alive
        self.status = 0
        self.bodies: list[bytes] = []
        self.gone = asyncio.Event()

    async def run(self, app: Any, path: str, body: dict[str, Any]) -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": json.dumps(body).encode()}
            await self.gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            elif message.get("body"):
                self.bodies.append(message["body"])
                if message["body"] == KEEP_ALIVE:
                    self.on_keep_alive(self.bodies.count(KEEP_ALIVE))

        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
            "client": ("127.0.0.1", 1),
            "server": ("test", 80),
        }
        await app(scope, receive, send)


def kept_alive_app(core: InferenceServer, interval: float) -> Any:
    settings = HttpSettings(1 << 20, (), tools=ToolSettings(sse_keep_alive=interval))
    return HttpFrontEnd(core, settings).build()


def gated(original: Responses, gates: list[asyncio.Event], closed: list[bool]) -> Responses:
    """The core's responses, response i held until gates[i] is set (where there is one);
    `closed` gets True once the stream is closed (the request cancelled or done)."""

    async def responses(request: InferRequest, *args: Any, **kwargs: Any) -> Any:
        try:
            index = 0
            async for response in original(request, *args, **kwargs):
                if index < len(gates):
                    await gates[index].wait()
                index += 1
                yield response
        finally:
            closed.append(True)

    return responses


def events(bodies: list[bytes]) -> list[Any]:
    """The data events' JSON without the fields that differ from answer to answer."""
    found: list[Any] = []
    for body in bodies:
        if body == KEEP_ALIVE:
            continue
        text = body.decode()
        assert text.startswith("data: ") and text.endswith("\n\n") and text.count("\n\n") == 1
        data = text[6:-2]
        value = data if data == "[DONE]" else json.loads(data)
        if isinstance(value, dict):
            value.pop("id", None), value.pop("created", None)
        found.append(value)
    return found


@pytest.mark.parametrize("route", ROUTES)
async def test_idle_stream_sends_keep_alives_between_whole_events(
    served: tuple[httpx.AsyncClient, InferenceServer],
    monkeypatch: pytest.MonkeyPatch,
    route: str,
) -> None:
    client, core = served
    body = {"model": "tiny", **ROUTES[route], **SAMPLING, "stream": True}
    plain = await client.post(route, json=body)
    assert plain.status_code == 200
    expected = events([line.encode() + b"\n\n" for line in plain.text.split("\n\n") if line])
    gates = [asyncio.Event(), asyncio.Event()]  # the first response, then the second
    closed: list[bool] = []
    monkeypatch.setattr(core, "infer_responses", gated(core.infer_responses, gates, closed))
    exchange = Exchange(lambda count: gates[count - 1].set() if count <= 2 else None)
    await exchange.run(kept_alive_app(core, 0.01), route, body)
    assert exchange.status == 200
    bodies = exchange.bodies
    # Before the first response: the headers, then a keep-alive; one between tokens too.
    assert bodies[0] == KEEP_ALIVE
    assert KEEP_ALIVE in bodies[2:]
    assert bodies[-1] == b"data: [DONE]\n\n"
    assert events(bodies) == expected
    assert closed == [True]


def refusing(gate: asyncio.Event) -> Responses:
    """A model that refuses the request once `gate` is set."""

    async def refused(request: InferRequest, *args: Any, **kwargs: Any) -> Any:
        await gate.wait()
        raise ServerError(ErrorCode.INVALID_ARG, "refused")
        yield  # an async generator, as the core's

    return refused


@pytest.mark.parametrize("route", ROUTES)
async def test_late_refusal_is_the_streams_error_event(
    served: tuple[httpx.AsyncClient, InferenceServer],
    monkeypatch: pytest.MonkeyPatch,
    route: str,
) -> None:
    _, core = served
    gate = asyncio.Event()
    monkeypatch.setattr(core, "infer_responses", refusing(gate))
    exchange = Exchange(lambda count: gate.set())
    body = {"model": "tiny", **ROUTES[route], **SAMPLING, "stream": True}
    await exchange.run(kept_alive_app(core, 0.01), route, body)
    assert exchange.status == 200
    assert exchange.bodies[0] == KEEP_ALIVE
    (error,) = events(exchange.bodies)  # no [DONE]
    assert error["error"]["message"] == "refused"
    assert error["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("route", ROUTES)
async def test_refusal_within_the_interval_is_a_plain_error(
    served: tuple[httpx.AsyncClient, InferenceServer],
    monkeypatch: pytest.MonkeyPatch,
    route: str,
) -> None:
    _, core = served
    gate = asyncio.Event()
    gate.set()
    monkeypatch.setattr(core, "infer_responses", refusing(gate))
    transport = httpx.ASGITransport(app=kept_alive_app(core, 30.0))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        body = {"model": "tiny", **ROUTES[route], **SAMPLING, "stream": True}
        answer = await client.post(route, json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"] == "refused"
    assert "keep-alive" not in answer.text


async def test_client_gone_while_waiting_cancels_the_request(
    served: tuple[httpx.AsyncClient, InferenceServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, core = served
    never = asyncio.Event()
    closed: list[bool] = []
    monkeypatch.setattr(core, "infer_responses", gated(core.infer_responses, [never], closed))
    exchange = Exchange(lambda count: exchange.gone.set())
    body = {"model": "tiny", **ROUTES["/v1/completions"], **SAMPLING, "stream": True}
    await exchange.run(kept_alive_app(core, 0.01), "/v1/completions", body)
    assert exchange.status == 200 and exchange.bodies == [KEEP_ALIVE]
    assert closed == [True]
