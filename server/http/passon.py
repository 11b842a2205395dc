"""An HTTP worker's way to pass a request on: to the server's own HTTP front end, on a
Unix socket only the server's user reaches (server/workers/loopback.py), byte for byte
(HTTP/1.1 with h11).

Everything but inference is answered by the server process (health, metadata,
statistics, the repository, shared memory, logging, /metrics, /v1, generate): a worker
sends the request on whole and relays the answer as it comes, a streamed one chunk by
chunk. gRPC workers pass their other calls on the same way, to the server's own gRPC
front end on its Unix socket, so both protocols have one way: the process link carries
inference only, and every other answer is the one the server's own front end gives.

Connections to the server are kept open and reused, well within the server's keep-alive
time, so that the server does not close one as a request goes out on it. A body past its
bound (--http-max-input-size; infer.body_bound for binary tensor data) is refused here, as
the server would refuse it, before it is held whole. A client that goes away closes its
connection to the server too, so the server cancels what it was doing for it.

h11 sends only what HTTP/1.1 allows, which is less than the server's own parser takes:
exactly one Host header, and no whitespace at either end of a header value. A request
that the server's front end would answer is made so (`_request`) rather than refused, so
that it gets the server's answer: a health probe over HTTP/1.0 sends no Host at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import h11
from starlette.types import Message, Receive, Scope, Send

from ..errors import ErrorCode, ServerError
from . import codec
from .errors import BodyKind, error_response, server_error_response
from .infer import HEADER_LENGTH, INFER_PATH, body_bound, read_raw_body, scope_headers
from .rootpath import route_path

_READ_BYTES = 1 << 16
# A kept connection is used again only this soon: the server's own front end closes one
# idle for 5 s (uvicorn's keep-alive timeout), and a request written just as it does
# would fail; it cannot safely be sent again.
_IDLE_S = 3.0
_JSON: BodyKind = "json"
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

    def __init__(self, path: str, max_body: int, max_chunks: int) -> None:
        self._path = path
        # --http-max-input-size and the chunk count, as the server's front end applies
        # them (body_bound, read_raw_body): a body past them is refused here, before it
        # is held whole.
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
        reader, writer = await asyncio.open_unix_connection(self._path)
        return _Connection(reader, writer)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = scope_headers(scope)
        try:
            bound, kind = self._max_body, _JSON
            if INFER_PATH.fullmatch(route_path(scope)):  # served here under --http-restricted-api
                header_length = codec.parse_header_length(headers.get(HEADER_LENGTH))
                bound, kind = body_bound(headers, self._max_body, header_length)
            body = await read_raw_body(scope, receive, headers, bound, self._max_chunks, kind)
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
            request = _request(scope, len(body))
        except h11.LocalProtocolError as exc:
            # What the front end accepted and h11 still will not send: the client's
            # request is at fault, and no other server is.
            response = error_response(400, f"the request cannot be passed on: {exc}")
            await response(scope, _no_body, send)
            return
        try:
            connection = await self._connect()
        except OSError:
            await _unavailable("the server process is not reachable", scope, send)
            return
        reusable = False
        started = False
        try:
            h = connection.h11
            data = h.send(request)
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


# The Host a request without one and without an address is passed on with: the
# server's own, on no port.
_SERVER_HOST = b"localhost"


def _request(scope: Scope, length: int) -> h11.Request:
    """The request to send on, with a body of `length` bytes, made valid for h11.

    h11 requires exactly one Host in HTTP/1.1, which it always sends; the front end takes
    none (HTTP/1.0, or HTTP/1.1 without) or several, and routes by the path alone. Of
    several, the first is kept: the one starlette reads. With none, the server that the
    request would have found without a worker in between is named: the address the
    client connected to (`scope["server"]`, the socket every worker shares), else
    `_SERVER_HOST`.
    """
    host: bytes | None = None
    headers: list[tuple[bytes, bytes]] = []
    for name, value in scope["headers"]:
        name = name.lower()
        if name in _REQUEST_HOP:
            continue
        # llhttp keeps whitespace at the end of a value, which RFC 9110 section 5.5 makes
        # no part of it and h11 refuses; uvicorn strips it, but this does not rely on that.
        value = value.strip(b" \t")
        if name == b"host":
            if host is None:
                host = value
            continue
        headers.append((name, value))
    if host is None:
        host = _SERVER_HOST
        server = scope.get("server")
        if server is not None and server[1] is not None:
            address = str(server[0])
            host = (f"[{address}]" if ":" in address else address).encode() + b":%d" % server[1]
    headers.insert(0, (b"host", host))
    headers.append((b"content-length", str(length).encode()))
    query = scope.get("query_string", b"")
    target = scope.get("raw_path") or scope["path"].encode()
    target += b"?" + query if query else b""
    return h11.Request(method=scope["method"], headers=headers, target=target)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _unavailable(text: str, scope: Scope, send: Send) -> None:
    await server_error_response(ServerError(ErrorCode.UNAVAILABLE, text))(scope, _no_body, send)
