"""The thread driver: one end of a link for code that runs on threads.

`send` may be called from any thread (a lock keeps frames whole); one thread runs
`serve`, which blocks reading the socket and hands each message to `on_message` in order,
until the link ends.

Regions of the peer's arena this side has read and let go of (`release`) are owed back:
they travel in a `Release` ahead of the next message sent, or, when nothing is sent for
a while, from `serve` after a read, once they are urgent or more than its batch.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from .arena import Region
from .endpoint import MAX_FDS, READ_BYTES, Endpoint
from .frames import LinkClosed, close_fds, frame
from .messages import Message, Release


class ThreadLink(Endpoint):
    def _attach(self) -> None:
        self._sock.setblocking(True)
        self._send_lock = threading.Lock()
        self._owed_lock = threading.Lock()
        self._owed: list[Region] = []
        self._owed_urgent = False

    def send(self, *messages: Message) -> None:
        """Send the messages as one write, with the releases owed ahead of them."""
        owed = self._take_owed(-1)
        if owed:
            messages = (Release(owed), *messages)
        self._write(b"".join(part for m in messages for part in self.frame_of(m)), [])

    def release(self, regions: list[Region], urgent: bool = False) -> None:
        """Regions of the peer's arena, read and let go of: owed back to the peer.
        `urgent`: the peer may be waiting for space, so `serve` sends them after its next
        read even if they are few."""
        with self._owed_lock:
            self._owed.extend(regions)
            self._owed_urgent = self._owed_urgent or urgent

    def _take_owed(self, batch: int) -> list[Region]:
        """The releases owed, taken to send, when urgent or more than `batch` (-1: any)."""
        with self._owed_lock:
            owed = self._owed
            if not owed or not (batch < 0 or self._owed_urgent or len(owed) > batch):
                return []
            self._owed = []
            self._owed_urgent = False
        return owed

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

    def serve(self, release_batch: int = 0) -> None:
        """Read and hand on messages until the link ends (returns then; LinkClosed is
        not raised for an ordinary end, nor for a peer that sent something else: both
        end the link). After each read, the releases owed go if urgent or more than
        `release_batch`."""
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
                owed = self._take_owed(release_batch)
                if owed:
                    self._write(frame(self.codec.encode(Release(owed))), [])
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
