"""glibc's malloc, tuned for a long-running server: how many arenas it may keep, set once
at start-up, and handing back what loading models freed.

glibc gives each thread that allocates concurrently an arena of its own, up to eight per
core. The event loop, grpc's completion-queue poller and the executor slots all allocate
small, short-lived buffers, so with many arenas a long-running server's resident memory
creeps up by fragments that are freed but never returned: a soak under steady traffic
grew a few per cent every ten minutes with the default, and stayed flat with two arenas.
The allocation rate of a Python server is far below what one shared arena can serve, so
capping them costs nothing measurable. `MALLOC_ARENA_MAX` in the environment, glibc's own
setting, wins over the flag.

Loading a model reads and parses its file and builds and warms up its session, on
several threads at once; most of that is freed once the model is ready, but glibc keeps
the freed pages of its heaps mapped until something trims them, so resident memory
would stay at the loading peak (with the four peer models: 386 MiB, 252 after a trim).
`malloc_trim(0)` returns them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

# mallopt's parameter number for the arena limit (glibc's malloc.h).
M_ARENA_MAX = -8


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_freed_memory() -> None:
    """Return the heap pages freed so far to the system (glibc's malloc_trim); a no-op for a
    C library without it. Blocking for a few ms on a large heap: call it off the loop."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    trim(0)


def limit_malloc_arenas(count: int) -> bool:
    """Cap glibc's arenas at `count` (0 leaves glibc's default); True when applied.

    A C library without mallopt (musl, macOS) is left alone."""
    if count <= 0 or "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.debug("no mallopt in this C library: malloc arenas left as they are")
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, count))
