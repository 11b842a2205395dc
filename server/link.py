"""The link between the server and one front-end worker process: messages on a Unix
socket, tensors in shared memory.

Both ends run it on their event loop, without a thread: the socket is non-blocking, read
when the loop says it is readable, and written at the end of the loop turn, the turn's
messages in one write (or when it is writable again, if the kernel's buffer is full). A
frame is a 4-byte little-endian length and a pickle of a tuple of builtins whose first
item names the message. Reading refuses any pickle that
names a class or function, so a worker that went wrong cannot make the server run code.

Tensor bytes up to `INLINE_MAX` travel inside the frame; larger ones are copied into the
sender's memfd arena (backends/memfd.py) and the frame names their region, which the
receiver reads in place. A new arena segment is announced with a frame of its own that
carries its file descriptor (SCM_RIGHTS), ahead of the first frame that uses it. The
sender frees a region when the protocol above says the receiver is done with it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import logging
import os
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any

from ge_serve.link.arena import Arena, PeerSegments, Region

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("<I")
_READ_BYTES = 1 << 18
_MAX_FDS = 16
# Bytes of one tensor that travel inside the frame rather than in shared memory.
INLINE_MAX = 64 << 10
# A frame larger than this is a broken peer, not a message.
MAX_FRAME = 256 << 20
# The message that announces an arena segment: ("segment", id, size) plus its fd.
SEGMENT = "segment"

Message = tuple[Any, ...]


class LinkClosed(ConnectionError):
    """The other end went away, or sent something that is not a frame."""


class _BuiltinsOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a link message may not name {module}.{name}")


class Link:
    """One end of a worker link on the running loop.

    `on_message` gets every message but segment announcements, in order; `on_closed` is
    called once when the link ends, from either side.
    """

    def __init__(
        self,
        sock: socket.socket,
        label: str,
        on_message: Callable[[Message], None],
        on_closed: Callable[[], None],
    ) -> None:
        sock.setblocking(False)
        self.label = label
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._on_message = on_message
        self._on_closed = on_closed
        self.arena = Arena(self._announce, label)
        self._peer = PeerSegments()
        self._pending = bytearray()
        self._fds: collections.deque[int] = collections.deque()
        # Frames the kernel has not taken yet, each with the fds that ride with its start.
        self._backlog: collections.deque[tuple[memoryview, list[int]]] = collections.deque()
        # Frames sent this loop turn, written together at its end.
        self._queued: list[bytes] = []
        self._flush_soon = False
        self.closed = False
        self._loop.add_reader(sock.fileno(), self._readable)

    # --- sending -------------------------------------------------------------------------

    def send(self, *message: Any) -> None:
        """Queue a message of builtins (tensor bytes already placed with `place`). The
        messages queued in one loop turn leave in one write, at the end of the turn."""
        if self.closed:
            raise LinkClosed("the link is closed")
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self._queued.append(_LENGTH.pack(len(payload)))
        self._queued.append(payload)
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

    def place(self, data: memoryview, regions: list[Region]) -> bytes | Region:
        """Where tensor bytes travel: the bytes themselves when small, else a region of this
        end's arena holding a copy (appended to `regions`, to free once the peer is done)."""
        if data.nbytes <= INLINE_MAX:
            return bytes(data)
        region = self.arena.alloc(data.nbytes)
        seg, offset, size = region
        self.arena.buffer(seg)[offset : offset + size] = data.cast("B")
        regions.append(region)
        return region

    def view(self, placed: bytes | Region) -> memoryview:
        """The tensor bytes `place` sent from the other end, read in place."""
        if isinstance(placed, bytes):
            return memoryview(placed)
        return self._peer.view(placed)

    def release(self, regions: list[Region]) -> None:
        for region in regions:
            self.arena.free(region)

    def _announce(self, seg: int, fd: int, size: int) -> None:
        self._flush()  # what was queued before it goes before it
        payload = pickle.dumps((SEGMENT, seg, size), protocol=pickle.HIGHEST_PROTOCOL)
        self._write(_LENGTH.pack(len(payload)) + payload, [os.dup(fd)])

    def _write(self, frame: bytes, fds: list[int]) -> None:
        if self.closed:
            for fd in fds:
                os.close(fd)
            raise LinkClosed("the link is closed")
        view = memoryview(frame)
        if not self._backlog:
            try:
                sent = self._send_now(view, fds)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._close_fds(fds)
                self.close()
                raise LinkClosed(str(exc)) from exc
            if sent:
                self._close_fds(fds)
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
                self._close_fds(fds)
                fds = []
            if sent < len(view):
                self._backlog[0] = (view[sent:], fds)
                return
            self._backlog.popleft()
        self._loop.remove_writer(self._sock.fileno())

    # --- receiving -----------------------------------------------------------------------

    def _readable(self) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self._sock, _READ_BYTES, _MAX_FDS)
            except BlockingIOError:
                break
            except OSError:
                self.close()
                return
            self._fds.extend(fds)
            if not data:
                self.close()
                return
            self._pending += data
            if len(data) < _READ_BYTES:
                break
        try:
            messages = self._parse()
        except LinkClosed as exc:
            log.error("worker link %s: %s", self.label, exc)
            self.close()
            return
        for message in messages:
            if self.closed:
                return
            self._on_message(message)

    def _parse(self) -> list[Message]:
        buffer = self._pending
        messages: list[Message] = []
        offset = 0
        while len(buffer) - offset >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buffer, offset)
            if length > MAX_FRAME:
                raise LinkClosed(f"a frame of {length} bytes is larger than allowed")
            end = offset + _LENGTH.size + length
            if len(buffer) < end:
                break
            try:
                start = offset + _LENGTH.size
                message = _BuiltinsOnly(io.BytesIO(buffer[start:end])).load()
            except Exception as exc:
                raise LinkClosed(f"an unreadable frame: {exc}") from exc
            if not isinstance(message, tuple) or not message or not isinstance(message[0], str):
                raise LinkClosed("a frame that is not a message")
            offset = end
            if message[0] == SEGMENT:
                if not self._fds:
                    raise LinkClosed("a segment was announced without its file descriptor")
                self._peer.add(int(message[1]), self._fds.popleft(), int(message[2]))
            else:
                messages.append(message)
        if offset:
            del buffer[:offset]
        return messages

    # --- closing -------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        fileno = self._sock.fileno()
        if fileno >= 0:
            self._loop.remove_reader(fileno)
            self._loop.remove_writer(fileno)
        for _view, fds in self._backlog:
            self._close_fds(fds)
        self._backlog.clear()
        self._close_fds(list(self._fds))
        self._fds.clear()
        with contextlib.suppress(OSError):
            self._sock.close()
        self._on_closed()

    @staticmethod
    def _close_fds(fds: list[int]) -> None:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
