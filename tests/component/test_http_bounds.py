"""Bounds on how a client sends a request (server/http/bounded.py): a head too large is
431, a head too slow 408, a body that stops arriving closes the connection; requests
within the bounds are served as before. The timeouts are shortened for the test."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from threadserver import serving

from ge_serve.server.http.bounded import BoundedHttpToolsProtocol

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 0.5


async def echo_length(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    answer = b"got %d" % len(body)
    headers = [(b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@asynccontextmanager
async def app() -> AsyncIterator[Any]:
    yield echo_length


@pytest.fixture
def port(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(BoundedHttpToolsProtocol, "head_timeout_s", TIMEOUT_S)
    monkeypatch.setattr(BoundedHttpToolsProtocol, "body_idle_timeout_s", TIMEOUT_S)
    with serving(app) as url:
        yield int(url.rsplit(":", 1)[1])


def exchange(port: int, *parts: bytes, pause_s: float = 0.0) -> tuple[bytes, float]:
    """Send the parts (pausing between them), then read until the server closes; returns
    what came back and how long the server took to close after the last part."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as connection:
        for part in parts:
            connection.sendall(part)
            time.sleep(pause_s)
        sent = time.monotonic()
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
        return answer, time.monotonic() - sent


def test_a_connection_that_sends_nothing_gets_408_and_is_closed(port: int) -> None:
    answer, _ = exchange(port)
    assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert answer.endswith(b'{"error":"the request\'s head took too long to arrive"}')


def test_half_a_head_gets_408(port: int) -> None:
    answer, _ = exchange(port, b"POST /x HTTP/1.1\r\nHost: a\r\n")
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_a_body_that_stops_arriving_closes_the_connection(port: int) -> None:
    head = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\n"
    answer, waited = exchange(port, head, b"0123456789")
    assert b"got" not in answer
    assert waited < 15


def test_a_body_that_keeps_arriving_slowly_is_served(port: int) -> None:
    # Each pause is shorter than the idle bound, though all of them are longer.
    head = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 40\r\nConnection: close\r\n\r\n"
    parts = [b"0123456789"] * 4
    answer, _ = exchange(port, head, *parts, pause_s=TIMEOUT_S / 3)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"got 40")


def test_a_head_too_large_gets_431(port: int) -> None:
    header = b"X-Big: " + b"a" * (BoundedHttpToolsProtocol.max_head_bytes + 1) + b"\r\n"
    answer, _ = exchange(port, b"GET /x HTTP/1.1\r\nHost: a\r\n" + header + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert answer.endswith(b'{"error":"the request\'s head is too large"}')


def test_a_large_head_within_the_bound_is_served(port: int) -> None:
    headers = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(50))
    head = b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n" + headers + b"\r\n"
    answer, _ = exchange(port, head)
    assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"got 0")
