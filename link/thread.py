"""The thread driver: one end of a link for code that runs on threads.

`send` may be called from any thread (a lock keeps frames whole); one thread runs
`serve`, which blocks reading the socket and hands each message to `on_message` in order,
calling `after_read` once the messages of one read are handed on (a place to send what
they made owed, such as releases), until the link ends.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from .endpoint import MAX_FDS, READ_BYTES, Endpoint
from .frames import LinkClosed, close_fds
from .messages import Message


class ThreadLink(Endpoint):
    def _attach(self) -> None:
        self._sock.setblocking(True)
        self._send_lock = threading.Lock()

    def send(self, *messages: Message) -> None:
        """Send the messages as one write."""
        self._write(b"".join(self.encode(m) for m in messages), [])

    def _write(self, data: bytes, fds: list[int]) -> None:
        with self._send_lock:
            if self.closed:
                close_fds(fds)
                raise LinkClosed("the link is closed")
            try:
                if fds:
                    sent = socket.send_fds(self._sock, [data], fds)
                    if sent < len(data):
                        self._sock.sendall(data[sent:])
                else:
                    self._sock.sendall(data)
            except OSError as exc:
                raise LinkClosed(str(exc)) from exc
            finally:
                close_fds(fds)

    def serve(self, after_read: Callable[[], None] | None = None) -> None:
        """Read and hand on messages until the link ends (returns then; LinkClosed is
        not raised for an ordinary end, nor for a peer that sent something else: both
        end the link)."""
        try:
            while True:
                try:
                    data, fds, _flags, _addr = socket.recv_fds(self._sock, READ_BYTES, MAX_FDS)
                except OSError:
                    return
                if not data:
                    close_fds(fds)
                    return
                self._received(data, fds)
                if after_read is not None:
                    after_read()
        except LinkClosed:
            return
        finally:
            self.close()

    def close(self) -> None:
        with self._send_lock:
            if self.closed:
                return
            self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._ended()
