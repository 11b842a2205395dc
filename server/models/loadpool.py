"""How model loads use threads: at most `--model-load-thread-count` at once, each retried
up to `--model-load-retry-count` times when it fails.

A load's blocking half (reading files, building sessions, compiling) runs on a worker
thread; the bound keeps a large repository from starting every load at once, as Triton's
load thread pool does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class LoadPool:
    def __init__(self, threads: int = 4, retries: int = 0) -> None:
        self._slots = asyncio.Semaphore(max(threads, 1))
        self.retries = max(retries, 0)

    async def run(
        self, work: Callable[..., T], *args: Any, failed: Callable[[T], bool] | None = None
    ) -> T:
        """`work(*args)` on a thread, again while it raises or `failed(result)` says so,
        at most `retries` more times; the last attempt's outcome is the answer."""
        attempt = 0
        while True:
            async with self._slots:
                try:
                    result = await asyncio.to_thread(work, *args)
                except Exception as exc:
                    if attempt >= self.retries:
                        raise
                    log.warning("load attempt %d failed (%s); retrying", attempt + 1, exc)
                else:
                    if failed is None or attempt >= self.retries or not failed(result):
                        return result
                    log.warning("load attempt %d failed; retrying", attempt + 1)
            attempt += 1
