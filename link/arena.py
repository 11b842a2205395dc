"""Shared memory between two processes of the server: memfd arenas.

Used between the server and a Python model's worker process, and between the server and
its front-end workers. Each side owns an `Arena` of memfd segments that only it allocates
from (for a Python model, the server's holds request inputs and BLS results, the
worker's holds responses and BLS requests). A message names a tensor by (segment,
offset, size) in its sender's arena; the receiver maps the sender's segments once
(`PeerSegments`) and reads the bytes in place. Whoever reads a region says so (the
sender then frees it), or the protocol says when a region is done with.

memfd segments have no names, so nothing is left behind in /dev/shm when a process is
killed: the memory goes once the last process holding a mapping of it is gone. A segment
is announced to the peer by passing its file descriptor over the control socket. Pages
are committed only when touched, so a large segment costs what is used of it; an arena
grows by further segments when one is too full, and first-fit allocation keeps reusing the
start of the first. Further segments that are wholly free again are kept up to twice as
many bytes as were ever in use at once, the largest always; the others go (the peer is
told, to unmap them too), and all go when the link ends.

Mappings are never closed by hand, only let go of: numpy views may still point into them
(a worker's input arrays, or a late reader), and an mmap goes away on its own once nothing
refers to it.
"""

from __future__ import annotations

import bisect
import mmap
import os
import threading
from collections.abc import Callable

from .frames import LinkClosed

# Offsets and sizes are kept to this alignment, so any dtype's view is aligned.
ALIGN = 64
DEFAULT_SEGMENT_BYTES = 16 << 20

# (segment id, offset, size): where a tensor's bytes are. Segment -1 holds nothing (an
# empty tensor).
Region = tuple[int, int, int]
EMPTY: Region = (-1, 0, 0)

# Told of each new segment before any region in it is handed out: (id, fd, size). The fd
# is closed once the announcement returns.
Announce = Callable[[int, int, int], None]
# Told of a segment let go of (its id), for the peer to unmap it too.
Dropped = Callable[[int], None]


def _round(size: int, unit: int) -> int:
    return (size + unit - 1) // unit * unit


def new_segment_fd(size: int, label: str) -> int:
    fd = os.memfd_create(label, os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


class Arena:
    """Segments this process allocates from; thread-safe."""

    def __init__(
        self,
        announce: Announce,
        label: str,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        dropped: Dropped | None = None,
    ) -> None:
        self._announce = announce
        self._dropped = dropped
        self._closed = False
        # Segments past the first kept while wholly free, by size: at most twice as many
        # bytes as were ever in use at once (so tensors in flight together reuse theirs),
        # and always the largest.
        self._spares: dict[int, int] = {}
        self._in_use = 0
        self._peak = 0
        self._label = label
        self._segment_bytes = _round(max(segment_bytes, ALIGN), mmap.PAGESIZE)
        self._lock = threading.Lock()
        self._maps: dict[int, mmap.mmap] = {}
        # Per segment: the free blocks as sorted offsets and their sizes.
        self._free_at: dict[int, list[int]] = {}
        self._free_size: dict[int, dict[int, int]] = {}
        self._next_id = 0

    def alloc(self, nbytes: int) -> Region:
        if nbytes <= 0:
            return EMPTY
        size = _round(nbytes, ALIGN)
        with self._lock:
            if self._closed:
                raise LinkClosed("the link is closed")
            for seg, offsets in self._free_at.items():
                sizes = self._free_size[seg]
                for offset in offsets:
                    if sizes[offset] >= size:
                        self._take(seg, offset, size)
                        return (seg, offset, nbytes)
            seg = self._grow(size)
            self._take(seg, 0, size)
            return (seg, 0, nbytes)

    def free(self, region: Region) -> None:
        seg, offset, nbytes = region
        if seg < 0 or nbytes <= 0:
            return
        size = _round(nbytes, ALIGN)
        with self._lock:
            offsets = self._free_at.get(seg)
            if offsets is None:
                return
            self._in_use -= size
            sizes = self._free_size[seg]
            index = bisect.bisect_left(offsets, offset)
            # Merge with the block after, then with the block before.
            if index < len(offsets) and offsets[index] == offset + size:
                size += sizes.pop(offsets.pop(index))
            if index > 0 and offsets[index - 1] + sizes[offsets[index - 1]] == offset:
                sizes[offsets[index - 1]] += size
            else:
                offsets.insert(index, offset)
                sizes[offset] = size
            drops = self._spare(seg)
        if self._dropped is not None:
            for drop in drops:
                self._dropped(drop)

    def _spare(self, seg: int) -> list[int]:
        """A segment past the first that is wholly free again is kept as a spare; spares
        past the budget go, smallest first, so that tensors of ever new sizes do not pile
        up segments that nothing uses (each new largest size made one), while tensors in
        flight together keep theirs. Returns the segments dropped."""
        if seg == 0 or self._free_size[seg].get(0) != len(self._maps[seg]):
            return []
        spares = self._spares
        spares[seg] = len(self._maps[seg])
        drops: list[int] = []
        # Twice the peak: a segment may be larger than what it was made for (whole
        # pages, the minimum segment size).
        while len(spares) > 1 and sum(spares.values()) > 2 * self._peak:
            drop = min(spares, key=lambda s: (spares[s], s))
            del spares[drop]
            # No close: a view of it may still be alive; the mapping goes with the last one.
            del self._maps[drop], self._free_at[drop], self._free_size[drop]
            drops.append(drop)
        return drops

    def close(self) -> None:
        """The link is gone: every segment is let go of (mapped still where a view of it
        lives on)."""
        with self._lock:
            self._closed = True
            self._maps.clear()
            self._free_at.clear()
            self._free_size.clear()
            self._spares.clear()

    def buffer(self, seg: int) -> mmap.mmap:
        found = self._maps.get(seg)
        if found is None:  # let go of since it was allocated: the link ended meanwhile
            raise LinkClosed("the link is closed")
        return found

    @property
    def segment_count(self) -> int:
        return len(self._maps)

    def _take(self, seg: int, offset: int, size: int) -> None:
        self._spares.pop(seg, None)
        self._in_use += size
        self._peak = max(self._peak, self._in_use)
        offsets = self._free_at[seg]
        sizes = self._free_size[seg]
        block = sizes.pop(offset)
        offsets.remove(offset)
        if block > size:
            rest = offset + size
            bisect.insort(offsets, rest)
            sizes[rest] = block - size

    def _grow(self, size: int) -> int:
        seg = self._next_id
        self._next_id += 1
        total = max(self._segment_bytes, _round(size, mmap.PAGESIZE))
        fd = new_segment_fd(total, f"{self._label}-{seg}")
        try:
            self._maps[seg] = mmap.mmap(fd, total)
            self._announce(seg, fd, total)
        finally:
            os.close(fd)
        self._free_at[seg] = [0]
        self._free_size[seg] = {0: total}
        return seg


class PeerSegments:
    """The other side's segments, mapped here as they are announced."""

    def __init__(self) -> None:
        self._maps: dict[int, mmap.mmap] = {}

    def add(self, seg: int, fd: int, size: int) -> None:
        try:
            self._maps[seg] = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def drop(self, seg: int) -> None:
        """The peer let go of a segment: no region in it is in use or will be."""
        self._maps.pop(seg, None)

    def clear(self) -> None:
        self._maps.clear()

    def view(self, region: Region) -> memoryview:
        seg, offset, nbytes = region
        if seg < 0:
            return memoryview(b"")
        mapped = self._maps.get(seg)
        if mapped is None or offset < 0 or offset + nbytes > len(mapped):
            raise ValueError(f"shared-memory region {region} is not mapped")
        return memoryview(mapped)[offset : offset + nbytes]
