"""Framing: a 4-byte little-endian length, then the payload.

`FrameReader` is the one parser both drivers feed: it keeps the bytes of a frame still
arriving and the file descriptors received with them (SCM_RIGHTS, in arrival order), and
hands back whole payloads. It never blocks and never touches a socket, so the asyncio
driver and the thread driver read the same way and it is tested without either.
"""

from __future__ import annotations

import collections
import contextlib
import os
import struct

LENGTH = struct.Struct("<I")
# A frame larger than this is a broken or hostile peer, not a message.
MAX_FRAME = 256 << 20


class LinkClosed(ConnectionError):
    """The other end went away, or sent something that is not a message."""


class FrameTooLarge(OverflowError):
    """A message this end would send is past the frame limit: the peer would take it for
    a broken link, so the one message fails instead (an OverflowError, as an encoder's
    own refusal of a value is)."""


def frame_parts(payload: bytes) -> tuple[bytes, bytes]:
    """A frame as its length and its payload, for a writer that joins the parts of every
    frame of one write at once rather than copying each into a frame of its own first.
    FrameTooLarge past MAX_FRAME."""
    if len(payload) > MAX_FRAME:
        raise FrameTooLarge(
            f"a message of {len(payload)} bytes is larger than the {MAX_FRAME} a link carries"
        )
    return LENGTH.pack(len(payload)), payload


def frame(payload: bytes) -> bytes:
    return b"".join(frame_parts(payload))


class FrameReader:
    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._pending = bytearray()
        self._fds: collections.deque[int] = collections.deque()
        self._max_frame = max_frame

    def feed(self, data: bytes | bytearray, fds: list[int] | tuple[int, ...] = ()) -> None:
        self._fds.extend(fds)
        self._pending += data

    def payloads(self) -> list[bytes]:
        """Every whole frame received so far; LinkClosed for a frame past the limit."""
        buffer = self._pending
        found: list[bytes] = []
        offset = 0
        # Payloads are cut from a view: one copy each, not a bytearray slice copied again.
        with memoryview(buffer) as view:
            while len(buffer) - offset >= LENGTH.size:
                (length,) = LENGTH.unpack_from(buffer, offset)
                if length > self._max_frame:
                    raise LinkClosed(f"a frame of {length} bytes is larger than allowed")
                end = offset + LENGTH.size + length
                if len(buffer) < end:
                    break
                found.append(bytes(view[offset + LENGTH.size : end]))
                offset = end
        if offset:
            del buffer[:offset]
        return found

    @property
    def partial(self) -> bool:
        """Whether part of a frame is waiting for the rest."""
        return bool(self._pending)

    def take_fd(self) -> int:
        if not self._fds:
            raise LinkClosed("a segment was announced without its file descriptor")
        return self._fds.popleft()

    def close(self) -> None:
        close_fds(list(self._fds))
        self._fds.clear()


def close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
