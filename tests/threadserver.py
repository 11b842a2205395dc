"""An HTTP application served on loopback from a thread of the test process.

For tests that need a real HTTP server (uvicorn, real sockets) around an application they
build themselves, e.g. a core with a temporary shared-memory root, without the start-up
of a `ge-serve` subprocess. The application is built, served and closed on the thread's
own event loop, so everything it creates lives and dies on one loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

from ge_serve.server.http.embedded import EmbeddedUvicorn, front_end_config
from ge_serve.server.startup.listen import listen_socket

AppFactory = Callable[[], AbstractAsyncContextManager[Any]]


@contextlib.contextmanager
def serving(build: AppFactory, timeout: float = 30.0) -> Iterator[str]:
    """Serve the ASGI app that `build()` yields on 127.0.0.1; yields the base URL."""
    ready = threading.Event()
    url: list[str] = []
    failure: list[BaseException] = []
    stop: list[Callable[[], object]] = []

    async def main() -> None:
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        stop.append(lambda: loop.call_soon_threadsafe(stopping.set))
        async with build() as app:
            # As every HTTP front end of ge-serve runs uvicorn (its connection protocol).
            config = front_end_config(app, grace_s=1.0)
            server = EmbeddedUvicorn(config)
            sock = listen_socket("127.0.0.1", 0, "HTTP")
            task = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.01)
            url.append(f"http://127.0.0.1:{sock.getsockname()[1]}")
            ready.set()
            await stopping.wait()
            server.should_exit = True
            await task

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            failure.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name="threadserver", daemon=True)
    thread.start()
    try:
        assert ready.wait(timeout), "the threaded server did not start"
        if failure:
            raise failure[0]
        yield url[0]
    finally:
        if stop:
            # The loop is gone already when the app failed to start.
            with contextlib.suppress(RuntimeError):
                stop[0]()
        thread.join(timeout)
        assert not thread.is_alive(), "the threaded server did not stop"
        if failure:
            raise failure[0]
