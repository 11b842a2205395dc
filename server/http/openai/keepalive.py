"""vLLM's `--sse-keep-alive-interval`: an idle /v1 stream sends an SSE comment.

Proxies and tunnels with a read timeout (nginx's `proxy_read_timeout`, load balancers)
close a connection that sends nothing for a while: while a request is queued, during a
long prefill, or between slow tokens. `kept_alive` sends `: keep-alive` (a comment, which
SSE clients skip) whenever its stream has sent nothing for the interval, as vLLM's
`with_sse_keep_alive`. Events pass whole and unchanged, so a comment never falls inside
one. Chat and completions streams only, as vLLM's (textstream.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Final

KEEP_ALIVE: Final = b": keep-alive\n\n"


async def kept_alive(
    events: AsyncGenerator[bytes, None], interval: float, idle: bool = False
) -> AsyncGenerator[bytes, None]:
    """`events`, with KEEP_ALIVE after every `interval` seconds in which none came;
    `idle`: the stream has been idle that long already (its status waited), so a
    KEEP_ALIVE goes at once, with the status, as vLLM's comes an interval after its.

    One task at a time advances `events` (an async generator takes one `anext` at once),
    and a timeout leaves it running: the event it waits for is sent when it comes.
    Closing this (the stream's end, or its client gone) cancels that task and closes
    `events`, which cancels the request behind them."""
    pending = asyncio.ensure_future(anext(events))
    try:
        if idle:
            yield KEEP_ALIVE
        while True:
            done, _ = await asyncio.wait((pending,), timeout=interval)
            if not done:
                yield KEEP_ALIVE
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            yield event
            pending = asyncio.ensure_future(anext(events))
    finally:
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pending  # its outcome was read above, or is not wanted now
        await events.aclose()
