"""`one_blas_thread()`: numpy's BLAS on one thread while a test's reference computation
runs.

numpy's OpenBLAS starts a thread per core, and its idle threads spin while they wait: on
a loaded machine (the suite on two cores under pytest-xdist) a float64 reference pass costs
several times the CPU on two threads that it costs on one (SmolLM2-135M's: 2.2 s against
0.5 s). The pass's arithmetic is the same on one thread. Best effort: where numpy's BLAS is
not an OpenBLAS this process can reach (not Linux, another BLAS), it changes nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

# The setter and getter as the OpenBLAS builds numpy ships name them.
_NAMES = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)


@cache
def _controls() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """OpenBLAS's thread-count setter and getter, found in the library numpy loaded."""
    import numpy  # noqa: F401  (loads its BLAS)

    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8")
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if "openblas" in line.lower()}
    for path in sorted(paths):
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for setter, getter in _NAMES:
            if hasattr(library, setter) and hasattr(library, getter):
                set_threads, get_threads = getattr(library, setter), getattr(library, getter)
                set_threads.argtypes, set_threads.restype = [ctypes.c_int], None
                get_threads.argtypes, get_threads.restype = [], ctypes.c_int
                return set_threads, get_threads
    return None


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """numpy's BLAS on one thread inside the block, as many as before after it."""
    controls = _controls()
    if controls is None:
        yield
        return
    set_threads, get_threads = controls
    before = get_threads()
    set_threads(1)
    try:
        yield
    finally:
        set_threads(before)
