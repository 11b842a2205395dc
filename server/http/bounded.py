"""Bounds on how a client may send a request: the size of its head, and how long it may
take to send it.

uvicorn's httptools protocol sets neither. Its parser keeps a header line however long,
and a connection that sends nothing, half a head or half a body is kept for ever, so
enough of them use up the process's file descriptors, after which every client gets an
empty reply. uvicorn's `timeout_keep_alive` only covers a connection idle after a
response. The bounds here are nginx's, which a client that works with nginx in front of a
server never meets:

- a request's head (request line and headers) may hold at most `MAX_HEAD_BYTES`; past
  that the answer is 431 and the connection closes (nginx: 4 buffers of 8k, answered
  400 or 414; uvicorn's h11 protocol: 16 KiB);
- the head must have arrived `HEAD_TIMEOUT_S` after the connection opened or its first
  byte came (nginx's `client_header_timeout`), or the answer is 408 and the connection
  closes;
- while a body arrives, `BODY_IDLE_TIMEOUT_S` may pass between two reads (nginx's
  `client_body_timeout`), or the connection closes. Time the server itself holds the
  body back (flow control, while the application is not reading) does not count.

The time between requests on a kept-alive connection is uvicorn's own keep-alive timeout.
"""

from __future__ import annotations

import asyncio
from typing import Final

import orjson

from .lingering import LingeringHttpToolsProtocol

MAX_HEAD_BYTES: Final = 64 * 1024
HEAD_TIMEOUT_S: Final = 60.0
BODY_IDLE_TIMEOUT_S: Final = 60.0


class _Refused(Exception):
    """Raised in a parser callback to stop the parser at a request already answered."""


class BoundedHttpToolsProtocol(LingeringHttpToolsProtocol):
    """The lingering httptools protocol with bounds on reading a request (see the module
    docstring).

    One timer per connection, not one per request: a request only notes the time its head
    began, or its body last brought bytes (a clock read), and the timer, when it fires,
    compares, then sets itself again for what is left. Arming and cancelling timers for
    each request would cost every request microseconds.
    """

    # Bytes of the current head received so far; None while no head is arriving.
    _head_bytes: int | None = 0
    # When the current head began, or the body last brought bytes (loop time).
    _since = 0.0
    _timer: asyncio.TimerHandle | None = None
    # The size of the read being parsed.
    _read = 0
    # The bounds, as class attributes that a test may shorten.
    head_timeout_s = HEAD_TIMEOUT_S
    body_idle_timeout_s = BODY_IDLE_TIMEOUT_S
    max_head_bytes = MAX_HEAD_BYTES

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._since = self.loop.time()
        self._timer = self.loop.call_later(self.head_timeout_s, self._check)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # The phases are told apart here and in on_headers_complete only, not in more of
        # the parser's callbacks: each override is a call more on every request.
        if self.lingering:
            super().data_received(data)
            return
        read = self._read = len(data)
        head = self._head_bytes
        if head is not None:
            self._head_bytes = head + read
        elif self.body_unread():
            self._since = self.loop.time()
        else:
            # Bytes after a request has been read whole: the next one's head begins.
            # (Those of a next head that came in the same read as the request before are
            # not counted: the bound is loose by at most one read.)
            self._head_bytes = read
            self._since = self.loop.time()
        super().data_received(data)
        if (
            self._head_bytes is not None
            and self._head_bytes > self.max_head_bytes
            and not self.transport.is_closing()
        ):
            self._head_too_large()

    def on_headers_complete(self) -> None:
        counted, self._head_bytes = self._head_bytes, None
        if (counted or 0) + self._read > self.max_head_bytes and (
            self._head_size() > self.max_head_bytes
        ):
            # The head ended in a read that also held more (its body, or it came whole in
            # one read): measured only then, since most heads never come near the bound.
            self._head_too_large()
            # Stops the parser; uvicorn's answer to that (a 400) finds the connection
            # closed, and is dropped.
            raise _Refused()
        self._since = self.loop.time()
        super().on_headers_complete()

    def _head_size(self) -> int:
        """The head's size: its request line and header lines."""
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def _check(self) -> None:
        """The timer: act on a bound passed, else wait for the first that may pass."""
        self._timer = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        if self._head_bytes is not None:
            left = self._since + self.head_timeout_s - now
            if left <= 0:
                self._refuse(408, "Request Timeout", "the request's head took too long to arrive")
                return
        elif self.body_unread():
            if self.flow.read_paused:
                self._since = now  # the server holds the body back, not the client
            left = self._since + self.body_idle_timeout_s - now
            if left <= 0:
                self.transport.close()
                return
        else:
            # Between requests, or answering one: nothing to bound until a head begins.
            left = self.head_timeout_s
        self._timer = self.loop.call_later(left, self._check)

    def _head_too_large(self) -> None:
        self._refuse(431, "Request Header Fields Too Large", "the request's head is too large")

    def _refuse(self, status: int, phrase: str, message: str) -> None:
        """Answer before any application has seen the request, then close."""
        body = orjson.dumps({"error": message})
        head = (
            f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode()
        self.transport.write(head + body)
        self.transport.close()
