"""How a request body is framed (server/http/protocol.py): a body chunked, with or without
a Content-Length, is read; one whose Transfer-Encoding does not end in `chunked` cannot be
framed, and gets 400 and the connection's close (RFC 9112 section 6.3) instead of a wait
for the client to close."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from threadserver import serving

pytestmark = pytest.mark.timeout(60)


async def echo_body(scope: dict[str, Any], receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def app() -> AsyncIterator[Any]:
    yield echo_body


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with serving(app) as url:
        yield int(url.rsplit(":", 1)[1])


def exchange(port: int, request: bytes) -> tuple[bytes, float]:
    """Send the request and keep the connection open for more; returns what came back
    until the server closed, and how long that took."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as connection:
        connection.sendall(request)
        sent = time.monotonic()
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
        return answer, time.monotonic() - sent


def split(answer: bytes) -> tuple[bytes, bytes, bytes]:
    head, body = answer.split(b"\r\n\r\n", 1)
    status, headers = head.split(b"\r\n", 1)
    return status, headers.lower(), body


@pytest.mark.parametrize(
    "codings",
    [
        [b"identity"],
        [b"gzip"],
        [b"chunked;x=1"],
        [b"gzip, identity"],
        [b"gzip", b"identity"],  # two headers: one list
    ],
    ids=["identity", "gzip", "chunked-with-parameter", "list", "two-headers"],
)
@pytest.mark.parametrize("length", [True, False], ids=["with-length", "without-length"])
def test_a_body_whose_last_transfer_coding_is_not_chunked_gets_400_and_a_close(
    port: int, codings: list[bytes], length: bool
) -> None:
    head = b"POST /x HTTP/1.1\r\nHost: a\r\n"
    head += b"".join(b"Transfer-Encoding: " + coding + b"\r\n" for coding in codings)
    head += b"Content-Length: 13\r\n" if length else b""
    # The client sends its body and then waits: the server must answer without its close.
    answer, waited = exchange(port, head + b"\r\n" + b'{"inputs":[]}')
    assert waited < 10, "answered, not left to wait for the client"
    status, headers, body = split(answer)
    assert status == b"HTTP/1.1 400 Bad Request", answer
    assert b"connection: close" in headers
    assert b"content-type: application/json" in headers
    error = orjson.loads(body)["error"]
    assert "must be chunked" in error and codings[0].decode() in error


@pytest.mark.parametrize("codings", [b"chunked", b"Chunked", b"gzip, chunked", b",chunked"])
@pytest.mark.parametrize("length", [True, False], ids=["with-length", "without-length"])
def test_a_chunked_body_is_read(port: int, codings: bytes, length: bool) -> None:
    head = b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: " + codings + b"\r\n"
    head += b"Content-Length: 5\r\n" if length else b""
    chunks = b"2\r\n{}\r\n0\r\n\r\n"
    # Without a Content-Length the connection carries a next request; with one beside the
    # chunks it closes after the answer.
    after = b"" if length else b"GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
    answer, _ = exchange(port, head + b"\r\n" + chunks + after)
    first, _, rest = answer.partition(b"{}")
    assert first.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    if length:
        assert b"connection: close" in first.lower() and rest == b""
    else:
        assert rest.startswith(b"HTTP/1.1 200 OK\r\n"), "the next request on the connection"
