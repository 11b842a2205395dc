"""A request's work, cancelled when its client closes the connection before the answer.

Once a handler has read the whole body, the next message its `receive` gives is the
disconnect, so watching it costs nothing while the client waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")

# What the access log shows for a request whose client left first (nginx's 499).
CLIENT_GONE = 499


class ClientGone(Exception):
    """The client closed the connection before the answer was ready."""


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, or `work` cancelled and ClientGone raised when the client closes
    the connection first (the body has been read, so what `receive` gives now is the
    disconnect)."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
    if task.cancelled():
        raise ClientGone()
    return task.result()
