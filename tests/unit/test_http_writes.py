"""The HTTP connection's writes: held for the next one, never past the loop turn or a
close, and never out of order (server/http/lingering.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from ge_serve.server.http.lingering import _Transport
from ge_serve.server.http.protocol import TritonHttpProtocol


class Recorder:
    """A transport that records what reaches the socket, one entry per system call."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent.append(bytes(data))

    def writelines(self, parts: Any) -> None:
        self.sent.append(b"".join(parts))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def write_eof(self) -> None:
        self.sent.append(b"<eof>")

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8000) if name in ("sockname", "peername") else default


class Protocol:
    lingering = False

    def body_unread(self) -> bool:
        return False


def wrapped(loop: asyncio.AbstractEventLoop) -> tuple[_Transport, Recorder]:
    socket = Recorder()
    return _Transport(socket, Protocol(), loop), socket  # type: ignore[arg-type]


def test_headers_and_body_leave_in_one_send() -> None:
    async def scenario() -> list[bytes]:
        transport, socket = wrapped(asyncio.get_running_loop())
        transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        transport.write(b"body")
        await asyncio.sleep(0)
        return socket.sent

    assert asyncio.run(scenario()) == [b"HTTP/1.1 200 OK\r\n\r\nbody"]


def test_a_lone_write_leaves_by_the_end_of_the_turn_in_order() -> None:
    async def scenario() -> list[bytes]:
        transport, socket = wrapped(asyncio.get_running_loop())
        transport.write(b"head")
        assert transport.get_write_buffer_size() == 4
        await asyncio.sleep(0)
        assert socket.sent == [b"head"]
        transport.write(b"chunk 1")
        transport.write(b"chunk 2")
        transport.write(b"chunk 3")
        await asyncio.sleep(0)
        return socket.sent

    assert asyncio.run(scenario()) == [b"head", b"chunk 1chunk 2", b"chunk 3"]


def test_a_close_or_eof_sends_what_is_held_first() -> None:
    async def scenario() -> tuple[list[bytes], bool]:
        transport, socket = wrapped(asyncio.get_running_loop())
        transport.write(b"answer")
        transport.write_eof()
        transport.write(b"late")
        transport.close()
        await asyncio.sleep(0)
        return socket.sent, socket.closed

    assert asyncio.run(scenario()) == ([b"answer", b"<eof>", b"late"], True)


def test_a_write_through_writelines_keeps_its_place() -> None:
    async def scenario() -> list[bytes]:
        transport, socket = wrapped(asyncio.get_running_loop())
        transport.write(b"first")
        transport.writelines([b"second", b"third"])
        await asyncio.sleep(0)
        return socket.sent

    assert asyncio.run(scenario()) == [b"first", b"secondthird"]


def test_an_end_of_file_from_the_client_sends_what_is_held_first() -> None:
    """The loop closes the transport itself after eof_received, past the wrapper."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    async def scenario() -> list[bytes]:
        config = uvicorn.Config(app, http=TritonHttpProtocol, lifespan="off", ws="none")
        config.load()
        protocol = TritonHttpProtocol(
            config=config,
            server_state=ServerState(),
            app_state={},
            _loop=asyncio.get_running_loop(),
        )
        socket = Recorder()
        protocol.connection_made(socket)  # type: ignore[arg-type]
        protocol.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        protocol.eof_received()
        return socket.sent

    assert asyncio.run(scenario()) == [b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"]
