"""The memfd arenas a Python model's worker shares with the server (backends/memfd.py).

Request inputs and BLS results live in the server's arena, responses and BLS requests in
the worker's; the server frees request inputs itself once their request is answered.
"""

from __future__ import annotations

from ge_serve.link.arena import (
    ALIGN,
    DEFAULT_SEGMENT_BYTES,
    EMPTY,
    Announce,
    Arena,
    PeerSegments,
    Region,
    new_segment_fd,
)

__all__ = [
    "ALIGN",
    "DEFAULT_SEGMENT_BYTES",
    "EMPTY",
    "Announce",
    "Arena",
    "PeerSegments",
    "Region",
    "new_segment_fd",
]
