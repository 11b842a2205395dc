"""The control channel between the server and a worker: small messages on a Unix socket.

A message is a tuple whose first item names its kind; it holds only builtins (strings,
numbers, bytes, tuples, lists, dicts, None), and tensors only as shared-memory regions,
never their data. Frames are a 4-byte little-endian length and a pickle. Reading refuses
any pickle that names a class or function, so a message cannot make its reader run code:
model code runs in the worker, and the server must not trust what comes from it.

File descriptors (new shared-memory segments) travel as SCM_RIGHTS data with the frame
that announces them; the reader keeps them in arrival order, and the announcement takes
the oldest.
"""

from __future__ import annotations

import collections
import contextlib
import io
import os
import pickle
import socket
import struct
import threading
from collections.abc import Sequence
from typing import Any

_LENGTH = struct.Struct("<I")
_READ_BYTES = 1 << 16
_MAX_FDS = 16
# A frame larger than this is a broken or hostile peer, not a message.
MAX_FRAME = 256 << 20

Message = tuple[Any, ...]


class ChannelClosed(ConnectionError):
    """The other side closed the socket or sent something that is not a frame."""


class _BuiltinsOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a control message may not name {module}.{name}")


def _loads(data: bytes) -> Any:
    return _BuiltinsOnly(io.BytesIO(data)).load()


def encode(message: Message) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _LENGTH.pack(len(payload)) + payload


class Channel:
    """One end of the socket. `send` may be called from any thread; `receive` from one."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._send_lock = threading.Lock()
        self._pending = bytearray()
        self._fds: collections.deque[int] = collections.deque()
        self._closed = False

    def fileno(self) -> int:
        return self._sock.fileno()

    def send(self, *messages: Message, fds: Sequence[int] = ()) -> None:
        """Send the messages as one write (the fds ride with the first byte)."""
        data = b"".join(encode(m) for m in messages)
        with self._send_lock:
            if self._closed:
                raise ChannelClosed("the channel is closed")
            try:
                if fds:
                    sent = socket.send_fds(self._sock, [data], list(fds))
                    if sent < len(data):
                        self._sock.sendall(data[sent:])
                else:
                    self._sock.sendall(data)
            except OSError as exc:
                raise ChannelClosed(str(exc)) from exc

    def receive(self) -> list[Message]:
        """Block until at least one whole message has arrived; return every whole message
        read so far. Raises ChannelClosed at the end of the stream."""
        while True:
            messages = self._parse()
            if messages:
                return messages
            try:
                data, fds, _flags, _addr = socket.recv_fds(self._sock, _READ_BYTES, _MAX_FDS)
            except OSError as exc:
                raise ChannelClosed(str(exc)) from exc
            self._fds.extend(fds)
            if not data:
                raise ChannelClosed("the other side closed the channel")
            self._pending += data

    def take_fd(self) -> int:
        if not self._fds:
            raise ChannelClosed("a segment was announced without its file descriptor")
        return self._fds.popleft()

    def close(self) -> None:
        with self._send_lock:
            self._closed = True
        for fd in self._fds:
            _close_quietly(fd)
        self._fds.clear()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _parse(self) -> list[Message]:
        buffer = self._pending
        messages: list[Message] = []
        offset = 0
        while len(buffer) - offset >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(buffer, offset)
            if length > MAX_FRAME:
                raise ChannelClosed(f"a frame of {length} bytes is larger than allowed")
            end = offset + _LENGTH.size + length
            if len(buffer) < end:
                break
            try:
                message = _loads(bytes(buffer[offset + _LENGTH.size : end]))
            except Exception as exc:
                raise ChannelClosed(f"an unreadable frame: {exc}") from exc
            if not isinstance(message, tuple) or not message or not isinstance(message[0], str):
                raise ChannelClosed("a frame that is not a message")
            messages.append(message)
            offset = end
        if offset:
            del buffer[:offset]
        return messages


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
