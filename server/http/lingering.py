"""Lingering close: answer first, then read and drop the rest of a request body.

When a server closes a connection whose request body it has not read to the end, the
bytes still unread make the kernel reset the connection, and the reset can overtake the
answer: a client that writes its whole body before it reads (`http.client`, `requests`,
`tritonclient`) then sees "connection reset" instead of the 400 that says its body is too
large. Reading the body before answering is bounded in bytes and so fails for exactly the
large bodies that get refused.

nginx's answer is the lingering close, and this is it for uvicorn's httptools protocol:
when the server closes a connection while a request body is still arriving, it sends what
it has written (the answer), half-closes (FIN, so the client knows no more comes), then
reads and drops whatever the client still sends, until the client closes its side, no byte
has come for `LINGERING_TIMEOUT_S`, or `LINGERING_TIME_S` has passed in all. Only then is
the socket closed. The bounds are in time, as nginx's `lingering_timeout` and
`lingering_time` are, so a client cannot keep the server reading, and no size is too
large to get its answer. A connection closed with its request read to the end closes at
once, as before.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# nginx's defaults: lingering_timeout 5s, lingering_time 30s.
LINGERING_TIMEOUT_S: Final = 5.0
LINGERING_TIME_S: Final = 30.0


class _Transport:
    """The connection's transport as uvicorn sees it: every call passes through, except
    that a close while the request body is still arriving becomes a lingering close, and
    that a write waits for the next one, or the end of the loop turn, to go out with it.

    uvicorn writes a response's status line and headers, then its body: two sends, each
    a system call that on loopback also delivers the segment. Held together they go out
    in one (`writelines`). A write is held no longer than the loop's next pass over its
    ready callbacks, and never past a close, an end of file from the client or another
    write, so what a streamed response writes still leaves at once.
    """

    __slots__ = ("_held", "_loop", "_protocol", "_transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        protocol: LingeringHttpToolsProtocol,
        loop: asyncio.AbstractEventLoop,
    ):
        self._transport = transport
        self._protocol = protocol
        self._loop = loop
        self._held: bytes | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = data
            self._loop.call_soon(self.flush)
            return
        self._held = None
        self._transport.writelines((held, data))

    def writelines(self, data: Any) -> None:
        self.flush()
        self._transport.writelines(data)

    def flush(self) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if not self._transport.is_closing():
                self._transport.write(held)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        held = self._held
        return self._transport.get_write_buffer_size() + (len(held) if held else 0)

    def close(self) -> None:
        self.flush()
        protocol, transport = self._protocol, self._transport
        if protocol.lingering or transport.is_closing() or not protocol.body_unread():
            transport.close()
            return
        protocol.linger(transport)

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()


class LingeringHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a lingering close (see the module docstring)."""

    lingering = False
    _idle: asyncio.TimerHandle | None = None
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        wrapped = _Transport(transport, self, self.loop)
        super().connection_made(wrapped)  # type: ignore[arg-type]

    def body_unread(self) -> bool:
        """A request on this connection has a body that has not all arrived."""
        cycle = self.cycle
        return cycle is not None and cycle.more_body and not cycle.waiting_for_100_continue

    def linger(self, transport: asyncio.Transport) -> None:
        self.lingering = True
        if transport.can_write_eof():
            transport.write_eof()  # after what is buffered: the answer goes first
        transport.resume_reading()
        self._deadline = self.loop.call_later(LINGERING_TIME_S, transport.close)
        self._idle = self.loop.call_later(LINGERING_TIMEOUT_S, transport.close)

    def eof_received(self) -> None:
        # The client half-closed: the loop closes the transport itself, past the wrapper,
        # once this returns, so what is held goes now.
        transport = self.transport
        if isinstance(transport, _Transport):
            transport.flush()
        super().eof_received()

    def data_received(self, data: bytes) -> None:
        if not self.lingering:
            super().data_received(data)
            return
        if self._idle is not None:  # dropped; the client is still sending
            self._idle.cancel()
            self._idle = self.loop.call_later(LINGERING_TIMEOUT_S, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._idle, self._deadline):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)
