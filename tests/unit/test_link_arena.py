"""The process link's shared memory: memfd arenas, and tensors written to and read from
them (ge_serve.link.arena, ge_serve.link.tensors)."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

from ge_serve.link.arena import ALIGN, EMPTY, Arena, PeerSegments
from ge_serve.link.messages import Region
from ge_serve.link.tensors import (
    deserialize_bytes,
    read_tensor,
    serialize_bytes,
    write_tensor,
)


def _pair() -> tuple[Arena, PeerSegments]:
    """An arena and the peer view of it, as two processes would have them."""
    peers = PeerSegments()

    def announce(seg: int, fd: int, size: int) -> None:
        peers.add(seg, os.dup(fd), size)

    return Arena(announce, "test", segment_bytes=1 << 16, dropped=peers.drop), peers


def mapped(peers: PeerSegments) -> list[int]:
    """The segments the peer still maps."""
    found = []
    for seg in range(64):
        try:
            peers.view((seg, 0, 1))
        except ValueError:
            continue
        found.append(seg)
    return found


def test_regions_are_aligned_reused_and_merged_after_free() -> None:
    arena, _ = _pair()
    a = arena.alloc(10)
    b = arena.alloc(100)
    c = arena.alloc(1)
    assert a[1] == 0 and b[1] == ALIGN and c[1] == 3 * ALIGN
    arena.free(b)
    assert arena.alloc(64)[1] == ALIGN  # the hole is reused, first fit
    arena.free(a)
    arena.free(c)
    arena.free((0, ALIGN, 64))
    # Everything merged back: one block at the start holds a large region again.
    assert arena.alloc(60_000) == (0, 0, 60_000)
    assert arena.alloc(0) == EMPTY


def test_an_arena_grows_by_segments_the_peer_maps() -> None:
    arena, peers = _pair()
    first = arena.alloc(60_000)
    second = arena.alloc(200_000)  # larger than a segment: a segment of its own
    assert first[0] == 0 and second[0] == 1 and arena.segment_count == 2
    arena.buffer(1)[0:3] = b"abc"
    assert bytes(peers.view((1, 0, 3))) == b"abc"
    with pytest.raises(ValueError, match="not mapped"):
        peers.view((7, 0, 1))


def test_segments_for_ever_larger_tensors_do_not_pile_up() -> None:
    # Each new largest tensor needed a segment of its own size, and none was ever let go
    # of: twenty requests of 20 to 39 MB held 1.2 GB through a front-end worker.
    arena, peers = _pair()
    arena.free(arena.alloc(10))  # the first segment, 64 KiB
    for size in range(100_000, 300_000, 10_000):
        region = arena.alloc(size)
        assert region[0] != 0, "larger than the first segment"
        arena.free(region)
        # The first, and spares within twice the most in use at once.
        assert arena.segment_count <= 3
    largest = region[0]
    kept = [0, largest - 1, largest]
    assert mapped(peers) == kept, "the peer let go of the dropped ones too"
    # The spares are used again, and a busy segment is never dropped.
    held, other = arena.alloc(250_000), arena.alloc(250_000)
    assert {held[0], other[0]} == {largest - 1, largest} and arena.segment_count == 3
    arena.free(other)
    arena.free(held)
    assert mapped(peers) == kept
    arena.close()
    assert arena.segment_count == 0


def test_tensors_in_flight_together_keep_their_segments() -> None:
    # Dropping all but one spare would make and unmake a segment per tensor each round.
    arena, peers = _pair()
    arena.free(arena.alloc(10))
    used: set[int] = set()
    for _ in range(5):
        regions = [arena.alloc(200_000) for _ in range(3)]
        used.update(region[0] for region in regions)
        for region in regions:
            arena.free(region)
    assert len(used) == 3 and arena.segment_count == 4
    assert mapped(peers) == [0, *sorted(used)]


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(6, dtype=np.int64)[::2],  # not contiguous
        np.array([[True, False]]),
        np.array([1.5, -2], dtype=ml_dtypes.bfloat16),
        np.zeros((0, 4), dtype=np.int32),
    ],
)
def test_fixed_size_tensors_round_trip_as_views(array: np.ndarray) -> None:
    arena, peers = _pair()
    regions: list[Region] = []
    tensor = write_tensor(arena, "X", array, regions)
    view = read_tensor(peers, tensor, copy=False)
    np.testing.assert_array_equal(view, array)
    assert view.dtype == array.dtype and view.shape == array.shape
    if array.size:
        # Zero-copy: what the owner writes next is what the view shows.
        assert regions == [tensor.data]
        seg, offset, _ = regions[0]
        arena.buffer(seg)[offset] ^= 0x01  # the low bit: a bool flips too
        assert not np.array_equal(view, array)


def test_bytes_tensors_use_tritons_serialized_form() -> None:
    values = np.array([b"ab", "\u00e9", b""], dtype=object).reshape(3, 1)
    raw = serialize_bytes(values.flat)
    assert raw == b"\x02\x00\x00\x00ab\x02\x00\x00\x00\xc3\xa9\x00\x00\x00\x00"
    assert list(deserialize_bytes(raw)) == [b"ab", "\u00e9".encode(), b""]
    with pytest.raises(ValueError, match="ends inside"):
        deserialize_bytes(raw[:-3] + b"\x05\x00")
    arena, peers = _pair()
    back = read_tensor(peers, write_tensor(arena, "S", values, []), copy=False)
    assert back.shape == (3, 1) and back[1, 0] == "\u00e9".encode()
