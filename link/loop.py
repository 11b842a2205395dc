"""The asyncio driver: one end of a link on the running loop, without a thread.

The socket is non-blocking, read when the loop says it is readable, and written at the
end of the loop turn: the turn's messages leave in one write (or when the socket is
writable again, if the kernel's buffer is full). A new arena segment's announcement
first flushes what was queued before it, so its fd arrives ahead of the first message
that names it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket

from .endpoint import MAX_FDS, READ_BYTES, Endpoint
from .frames import LinkClosed, close_fds
from .messages import Message

log = logging.getLogger(__name__)


class LoopLink(Endpoint):
    def _attach(self) -> None:
        self._sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        # Frames the kernel has not taken yet, each with the fds that ride with its start.
        self._backlog: collections.deque[tuple[memoryview, list[int]]] = collections.deque()
        # Frames sent this loop turn, written together at its end.
        self._queued: list[bytes] = []
        self._flush_soon = False
        self._loop.add_reader(self._sock.fileno(), self._readable)

    # --- sending -----------------------------------------------------------------------

    def send(self, message: Message) -> None:
        """Queue a message; those queued in one loop turn leave in one write."""
        if self.closed:
            raise LinkClosed("the link is closed")
        self._queued.extend(self.frame_of(message))
        if not self._flush_soon:
            self._flush_soon = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        if self._queued and not self.closed:
            frames = b"".join(self._queued)
            self._queued.clear()
            with contextlib.suppress(LinkClosed):
                self._write(frames, [])

    def _announce(self, seg: int, fd: int, size: int) -> None:
        self._flush()  # what was queued before it goes before it
        super()._announce(seg, fd, size)

    def _write(self, data: bytes, fds: list[int]) -> None:
        if self.closed:
            close_fds(fds)
            raise LinkClosed("the link is closed")
        view = memoryview(data)
        if not self._backlog:
            try:
                sent = self._send_now(view, fds)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                close_fds(fds)
                self.close()
                raise LinkClosed(str(exc)) from exc
            if sent:
                close_fds(fds)
                fds = []
            if sent == len(view):
                return
            view = view[sent:]
            self._loop.add_writer(self._sock.fileno(), self._writable)
        self._backlog.append((view, fds))

    def _send_now(self, view: memoryview, fds: list[int]) -> int:
        if fds:
            return socket.send_fds(self._sock, [view], fds)
        return self._sock.send(view)

    def _writable(self) -> None:
        while self._backlog:
            view, fds = self._backlog[0]
            try:
                sent = self._send_now(view, fds)
            except BlockingIOError:
                return
            except OSError:
                self.close()
                return
            if sent and fds:
                close_fds(fds)
                fds = []
            if sent < len(view):
                self._backlog[0] = (view[sent:], fds)
                return
            self._backlog.popleft()
        self._loop.remove_writer(self._sock.fileno())

    # --- receiving ---------------------------------------------------------------------

    def _readable(self) -> None:
        chunks: list[bytes] = []
        fds: list[int] = []
        end = False
        while True:
            try:
                chunk, got, _flags, _addr = socket.recv_fds(self._sock, READ_BYTES, MAX_FDS)
            except BlockingIOError:
                break
            except OSError:
                end = True
                break
            fds.extend(got)
            if not chunk:
                end = True
                break
            chunks.append(chunk)
            if len(chunk) < READ_BYTES:
                break
        try:
            # Most reads are one chunk: it goes to the reader as it came, not copied first.
            self._received(chunks[0] if len(chunks) == 1 else b"".join(chunks), fds)
        except LinkClosed as exc:
            log.error("link %s: %s", self.label, exc)
            end = True
        if end:
            self.close()

    # --- closing -----------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        fileno = self._sock.fileno()
        if fileno >= 0:
            self._loop.remove_reader(fileno)
            self._loop.remove_writer(fileno)
        for _view, fds in self._backlog:
            close_fds(fds)
        self._backlog.clear()
        with contextlib.suppress(OSError):
            self._sock.close()
        self._ended()
