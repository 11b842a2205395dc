"""An HTTP worker's way to pass a request on: to the server's own HTTP front end, on a
loopback port, byte for byte (HTTP/1.1 with h11).

Everything but inference is answered by the server process (health, metadata,
statistics, the repository, shared memory, logging, /metrics, /v1, generate): a worker
sends the request on whole and relays the answer as it comes, a streamed one chunk by
chunk. gRPC workers pass their other calls on the same way, to the server's own gRPC
front end on loopback, so both protocols have one way: the process link carries
inference only, and every other answer is the one the server's own front end gives.

Connections to the server are kept open and reused, well within the server's keep-alive
time, so that the server does not close one as a request goes out on it. A body
past --http-max-input-size is refused here, as the server would refuse it, before it is
held whole. A client that goes away closes its connection to the server too, so the
server cancels what it was doing for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import h11
from starlette.types import Message, Receive, Scope, Send

from ..errors import ErrorCode, ServerError
from .errors import server_error_response
from .infer import read_raw_body, scope_headers

_READ_BYTES = 1 << 16
# A kept connection is used again only this soon: the server's own front end closes one
# idle for 5 s (uvicorn's keep-alive timeout), and a request written just as it does
# would fail; it cannot safely be sent again.
_IDLE_S = 3.0
# Headers of one hop, not passed on; `date` and `server` describe the server that sent them.
_REQUEST_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length",
                b"expect", b"te", b"upgrade", b"proxy-connection"}  # fmt: skip
_RESPONSE_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"date", b"server"}


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.h11 = h11.Connection(h11.CLIENT)
        self.idle_since = 0.0

    async def next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.h11.receive_data(await self.reader.read(_READ_BYTES))

    def close(self) -> None:
        self.writer.close()


class PassOn:
    """ASGI: the request, body and all, answered by the server's own front end."""

    def __init__(self, host: str, port: int, max_body: int, max_chunks: int) -> None:
        self._host = host
        self._port = port
        # --http-max-input-size and the chunk count, as the server's front end applies
        # them (read_raw_body): a body past them is refused here, before it is held whole.
        self._max_body = max_body
        self._max_chunks = max_chunks
        self._idle: list[_Connection] = []

    async def _connect(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.reader.at_eof() and now - connection.idle_since < _IDLE_S:
                return connection
            connection.close()
        reader, writer = await asyncio.open_connection(self._host, self._port)
        return _Connection(reader, writer)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            body = await read_raw_body(
                scope, receive, scope_headers(scope), self._max_body, self._max_chunks
            )
        except ServerError as exc:
            if exc.code is not ErrorCode.CANCELLED:  # a client that left gets nothing
                await server_error_response(exc)(scope, _no_body, send)
            return
        relay = asyncio.ensure_future(self._relay(scope, body, send))
        # The body is all read: what receive() gives now is the client going away.
        gone = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait([relay, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not relay.done():
                relay.cancel()  # its connection closes: the server cancels the request
        if relay.done() and not relay.cancelled():
            relay.result()

    async def _relay(self, scope: Scope, body: bytes, send: Send) -> None:
        try:
            connection = await self._connect()
        except OSError:
            await _unavailable("the server process is not reachable", scope, send)
            return
        reusable = False
        started = False
        try:
            query = scope.get("query_string", b"")
            target = scope.get("raw_path") or scope["path"].encode()
            headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _REQUEST_HOP]
            headers.append((b"content-length", str(len(body)).encode()))
            h = connection.h11
            path = target + (b"?" + query if query else b"")
            data = h.send(h11.Request(method=scope["method"], headers=headers, target=path))
            data += h.send(h11.Data(data=body)) if body else b""
            data += h.send(h11.EndOfMessage())
            connection.writer.write(data)
            while True:
                event = await connection.next_event()
                if isinstance(event, h11.Response):
                    started = True
                    kept = [(k, v) for k, v in event.headers if k.lower() not in _RESPONSE_HOP]
                    await send({"type": "http.response.start", "status": event.status_code,
                                "headers": kept})  # fmt: skip
                elif isinstance(event, h11.Data):
                    await send({"type": "http.response.body", "body": bytes(event.data),
                                "more_body": True})  # fmt: skip
                elif isinstance(event, h11.EndOfMessage):
                    await send({"type": "http.response.body", "body": b""})
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    raise h11.RemoteProtocolError("the server closed the connection")
            if h.our_state is h11.DONE and h.their_state is h11.DONE:
                h.start_next_cycle()
                reusable = True
        except (OSError, h11.ProtocolError):
            if started:  # the answer has begun: it can only end
                await send({"type": "http.response.body", "body": b""})
            else:
                # Not sent again: the server may have acted on it (a load, a sequence
                # step) before the connection failed.
                await _unavailable("the server process did not answer", scope, send)
        finally:
            if reusable:
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
            else:
                connection.close()

    async def close(self) -> None:
        for connection in self._idle:
            connection.close()
            with contextlib.suppress(OSError):
                await connection.writer.wait_closed()
        self._idle.clear()


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _unavailable(text: str, scope: Scope, send: Send) -> None:
    await server_error_response(ServerError(ErrorCode.UNAVAILABLE, text))(scope, _no_body, send)
