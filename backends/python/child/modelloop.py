"""The model's asyncio event loop, as Triton's stub keeps one.

Triton's stub makes one event loop the first time a model's `execute` (or here also
`initialize` or `finalize`) is a coroutine, sets it as the model thread's event loop, and
runs it with `run_forever` in a daemon thread for the life of the stub. Every coroutine of
the model runs on it: a default-mode model's execute is waited for, a decoupled model's is
left running in the background. So tasks an execute starts (`asyncio.create_task`) go on
running after it returned, and may answer through their requests' response senders, as
python_backend's qa/python_models/response_sender/model_async.py does.

At finalize the loop is wound down: tasks still pending are cancelled, the loop stopped,
its thread joined, and the loop closed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

# How long finalize waits for the loop's leftover tasks to end once cancelled.
_WIND_DOWN_S = 5.0


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _coroutine(awaitable: Awaitable[Any]) -> Coroutine[Any, Any, Any]:
    """Any awaitable as a coroutine (what run_coroutine_threadsafe takes); a coroutine as
    it is, so that its traceback starts in the model."""
    return awaitable if isinstance(awaitable, Coroutine) else _await(awaitable)


class ModelLoop:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _started(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            # As Triton: the model thread's loop is this one, for code that asks for it.
            asyncio.set_event_loop(loop)
            thread = threading.Thread(target=loop.run_forever, name="pb-asyncio", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        return self._loop

    def run(self, awaitable: Awaitable[Any]) -> Any:
        """Run `awaitable` on the loop and wait for its result (or its exception)."""
        future = asyncio.run_coroutine_threadsafe(_coroutine(awaitable), self._started())
        return future.result()

    def start(self, awaitable: Awaitable[Any], on_error: Callable[[BaseException], None]) -> None:
        """Run `awaitable` on the loop without waiting; `on_error(exc)` is called (on the
        loop's thread) if it raises."""

        def done(future: concurrent.futures.Future[Any]) -> None:
            if future.cancelled():
                return
            exc = future.exception()
            if exc is not None:
                on_error(exc)

        future = asyncio.run_coroutine_threadsafe(_coroutine(awaitable), self._started())
        future.add_done_callback(done)

    def close(self) -> None:
        """Cancel what is still pending, stop the loop, and close it (at finalize)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = self._thread = None

        async def wind_down() -> None:
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=_WIND_DOWN_S)
            await loop.shutdown_asyncgens()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(wind_down(), loop).result(_WIND_DOWN_S + 1)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_WIND_DOWN_S)
        asyncio.set_event_loop(None)
        if not thread.is_alive():
            loop.close()
