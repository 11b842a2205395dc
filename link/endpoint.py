"""What both drivers share: one end of a link, without the I/O.

An `Endpoint` owns the codec, the frame reader, this end's arena and the peer's mapped
segments. A driver (loop.py, thread.py) moves bytes and file descriptors; this class turns
received bytes into messages, handles the link's own (a segment is mapped, a release
frees this end's regions) and hands the rest on in order.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable

from .arena import Arena, PeerSegments
from .frames import FrameReader, LinkClosed, frame, frame_parts
from .messages import Codec, Drop, Message, Region, Release, Segment
from .tensors import Placed, place, view

# The socket is read this many bytes at a time; file descriptors per read, at most.
READ_BYTES = 1 << 18
MAX_FDS = 16


class Endpoint:
    """`on_message` gets every message but the link's own, in order; `on_closed` (if
    given) is called once when the link ends, from either side. Tensor bytes up to
    `inline_max` travel inside the message (tensors.place)."""

    def __init__(
        self,
        sock: socket.socket,
        codec: Codec,
        label: str,
        on_message: Callable[[Message], None],
        on_closed: Callable[[], None] | None = None,
        inline_max: int = 0,
    ) -> None:
        self.label = label
        self.codec = codec
        self.arena = Arena(self._announce, label, dropped=self._dropped)
        self.peers = PeerSegments()
        self.inline_max = inline_max
        self._sock = sock
        self._reader = FrameReader()
        self._on_message = on_message
        self._on_closed = on_closed
        self.closed = False
        self._attach()

    # --- what drivers provide ----------------------------------------------------------

    def _attach(self) -> None:
        """Set the socket up for this driver (blocking or not, watched by a loop)."""
        raise NotImplementedError

    def _write(self, data: bytes, fds: list[int]) -> None:
        """Send `data` (whole frames) with `fds` riding with its first byte; the fds are
        this end's to close once sent. LinkClosed when the link is gone."""
        raise NotImplementedError

    # --- sending -----------------------------------------------------------------------

    def frame_of(self, message: Message) -> tuple[bytes, bytes]:
        """A message's frame, in parts (frames.frame_parts)."""
        return frame_parts(self.codec.encode(message))

    def _announce(self, seg: int, fd: int, size: int) -> None:
        self._write(frame(self.codec.encode(Segment(seg, size))), [os.dup(fd)])

    def _dropped(self, seg: int) -> None:
        # Written at once rather than queued with a turn's messages: no message in flight
        # names a segment that is wholly free, so its order among them does not matter.
        if not self.closed:
            with contextlib.suppress(LinkClosed):
                self._write(frame(self.codec.encode(Drop(seg))), [])

    def place(self, data: memoryview, regions: list[Region]) -> Placed:
        """Where tensor bytes travel (tensors.place with this link's inline limit)."""
        return place(self.arena, data, regions, self.inline_max)

    def view(self, placed: Placed) -> memoryview:
        """Tensor bytes the other end placed, read in place."""
        return view(self.peers, placed)

    def free(self, regions: list[Region]) -> None:
        """This end's regions, done with."""
        for region in regions:
            self.arena.free(region)

    # --- receiving ---------------------------------------------------------------------

    def _received(self, data: bytes | bytearray, fds: list[int]) -> None:
        """Bytes from the socket: every whole message goes to `on_message`, in order.
        LinkClosed when what came is not a message of this link."""
        reader = self._reader
        reader.feed(data, fds)
        for payload in reader.payloads():
            message = self.codec.decode(payload)
            if isinstance(message, Segment):
                self.peers.add(message.seg, reader.take_fd(), message.size)
            elif isinstance(message, Release):
                for region in message.regions:
                    self.arena.free(region)
            elif isinstance(message, Drop):
                self.peers.drop(message.seg)
            else:
                if self.closed:
                    return
                self._on_message(message)

    def _ended(self) -> None:
        """A driver closed the link: fds not yet taken are closed, `on_closed` is told."""
        self._reader.close()
        # The memory goes now, not when a collection finds this endpoint's cycles.
        self.arena.close()
        self.peers.clear()
        if self._on_closed is not None:
            self._on_closed()


__all__ = ["Endpoint", "LinkClosed"]
