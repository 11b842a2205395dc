"""The one way tests wait: poll a real signal until it holds, bounded in time.

A fixed sleep is a guess about speed; on a loaded 2-core machine it is wrong in both
directions. `poll` asks the signal again and again until it holds or the bound passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(
    condition: Callable[[], T | None],
    timeout: float,
    what: str = "a condition",
    interval: float = 0.02,
) -> T:
    """Call `condition` until it returns something true, and return that; raise
    TimeoutError naming `what` when `timeout` seconds pass first. (Never None, so a
    condition that answers `X | None` gives an X.)"""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {timeout}s")
        time.sleep(interval)
