"""An HTTP worker's pass-on to the server's own front end (server/http/passon.py): the
body bound, and kept connections reused only while the server keeps them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from ge_serve.server.http import passon as passon_module
from ge_serve.server.http.passon import PassOn
from ge_serve.server.inference.error_texts import MAX_CHUNKS

LIMIT = 1 << 16


def scope(path: str = "/v2/repository/index", length: int | None = None) -> dict[str, Any]:
    headers = [(b"host", b"x")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
            "query_string": b"", "headers": headers}  # fmt: skip


class Client:
    """The ASGI side: a body in chunks, and what was sent back."""

    def __init__(self, chunks: int, size: int = 4096) -> None:
        self.left = chunks
        self.size = size
        self.taken = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if self.left == 0:
            await asyncio.Event().wait()  # the client stays, and sends nothing more
        self.left -= 1
        self.taken += 1
        return {"type": "http.request", "body": b"x" * self.size, "more_body": self.left > 0}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(dict(message))

    @property
    def status(self) -> int:
        return int(self.sent[0]["status"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])


async def test_a_body_past_the_limit_is_refused_before_it_is_held_whole(tmp_path: Path) -> None:
    # Nothing listens there: a request passed on would be answered 503.
    passon = PassOn(str(tmp_path / "none.sock"), LIMIT, MAX_CHUNKS)
    streamed = Client(chunks=10_000)  # 40 MB, chunked
    await asyncio.wait_for(passon(scope(), streamed.receive, streamed.send), 10)
    assert streamed.status == 400 and streamed.taken == LIMIT // 4096 + 1
    assert (
        "exceeds the maximum allowed input size of 65536 bytes"
        in (orjson.loads(streamed.body)["error"])
    )
    declared = Client(chunks=1)
    await asyncio.wait_for(passon(scope(length=10 << 20), declared.receive, declared.send), 10)
    assert declared.status == 400 and declared.taken == 0, "refused on its Content-Length"
    await passon.close()


async def test_a_connection_is_reused_only_well_within_the_servers_keep_alive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The server's keep-alive timeout closed a kept connection just as a request went out
    # on it: 503. Here it closes one that waits 0.1 s; the pass-on reuses one for 0.05 s.
    monkeypatch.setattr(passon_module, "_IDLE_S", 0.05)
    heads: list[bytes] = []

    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0.0  # when this connection last answered; 0: it has not
        try:
            while True:
                heads.append(await reader.readuntil(b"\r\n\r\n"))
                if answered and time.monotonic() - answered > 0.1:
                    return  # the keep-alive timeout, racing the request: closed unanswered
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
                answered = time.monotonic()
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()

    path = str(tmp_path / "server.sock")
    listener = await asyncio.start_unix_server(server, path)
    passon = PassOn(path, LIMIT, MAX_CHUNKS)
    try:
        for _ in range(3):
            client = Client(chunks=1, size=0)
            await asyncio.wait_for(passon(scope(), client.receive, client.send), 10)
            assert (client.status, client.body) == (200, b"ok")
            await asyncio.sleep(0.15)
        assert len(heads) == 3, "each request sent once"
    finally:
        await passon.close()
        listener.close()
        await listener.wait_closed()


async def test_a_request_without_one_host_is_passed_on_with_one(tmp_path: Path) -> None:
    # h11 sends HTTP/1.1, which needs exactly one Host; the server's front end takes none
    # or several (it routes by path), and so must a worker passing a request on to it.
    heads: list[bytes] = []

    async def server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    path = str(tmp_path / "server.sock")
    listener = await asyncio.start_unix_server(server, path)
    passon = PassOn(path, LIMIT, MAX_CHUNKS)
    cases = [
        ([], ("127.0.0.1", 8000), b"127.0.0.1:8000"),  # HTTP/1.0, no Host: the address used
        ([], ("::1", 8000), b"[::1]:8000"),
        ([], None, b"localhost"),  # no address either (a Unix socket): the server's
        ([(b"host", b"a"), (b"host", b"b")], ("127.0.0.1", 8000), b"a"),  # the first, as read
        # Whitespace at the end of a value, which llhttp keeps and h11 refuses.
        ([(b"host", b"a "), (b"x-odd", b"b \t")], ("127.0.0.1", 8000), b"a"),
    ]
    try:
        for headers, address, host in cases:
            request = {**scope(), "headers": headers, "server": address}
            client = Client(chunks=1, size=0)
            await asyncio.wait_for(passon(request, client.receive, client.send), 10)
            assert (client.status, client.body) == (200, b"ok"), (headers, client.sent)
            lines = heads[-1].lower().split(b"\r\n")
            assert [line for line in lines if line.startswith(b"host:")] == [b"host: " + host]
            assert all(not line.endswith((b" ", b"\t")) for line in lines)
    finally:
        await passon.close()
        listener.close()
        await listener.wait_closed()
