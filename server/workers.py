"""Front-end worker processes: protocol work on every core, one scheduler per model.

With `--grpc-workers N` (or `--http-workers N`), N processes accept that protocol's
connections and do its decoding and encoding; each hands the decoded requests to this
process over a link (server/link.py: a Unix socket, tensors in shared memory), where
`InferenceServer.infer` runs them as it runs its own: through the one scheduler of each
model, so requests from every worker batch together, and through the one set of
statistics and metrics. Everything but inference a worker passes on, as it came, to this
process's own front end on a loopback port, so that every other answer is this
process's.

A worker that dies takes only its own requests with it (they end as cancelled, as when
their clients go away); it is started again, while the others keep serving. A worker
whose link to this process ends exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from ge_serve.backends.memfd import Region

from .errors import ErrorCode, ServerError
from .inference.core import InferenceServer
from .link import Link, LinkClosed, Message
from .linkcodec import request_from_wire, response_to_wire

log = logging.getLogger(__name__)

# How long a new worker may take to report that it listens.
START_TIMEOUT_S = 60.0
# How many times a worker is started before the front end gives up on it at start-up.
START_TRIES = 3
# Restarts of a worker that keeps dying wait longer each time, up to this.
MAX_RESTART_DELAY_S = 5.0


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What to run: `python -m module` with `config` (JSON) as its one argument; the
    link's file descriptor is added to the config as `link_fd`."""

    module: str
    what: str  # "gRPC", "HTTP": for logs and errors
    count: int
    config: dict[str, Any]
    pass_fds: tuple[int, ...] = ()


# An ASGI application, as the HTTP front end builds it.
AsgiApp = Callable[
    [MutableMapping[str, Any], Callable[[], Awaitable[MutableMapping[str, Any]]],
     Callable[[MutableMapping[str, Any]], Awaitable[None]]],
    Awaitable[None],
]  # fmt: skip


@dataclass(eq=False)
class _Worker:
    index: int
    process: asyncio.subprocess.Process | None = None
    link: Link | None = None
    ready: asyncio.Future[str | None] | None = None
    tasks: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    # A response's regions of this process's arena, until the worker has sent it.
    held: dict[int, list[Region]] = field(default_factory=dict)
    started_at: float = 0.0


class FrontEndWorkers:
    """Starts, serves and restarts the worker processes of one front end."""

    def __init__(
        self, core: InferenceServer, spec: WorkerSpec, forward_app: AsgiApp | None = None
    ) -> None:
        """`forward_app`: the application that answers the HTTP requests the workers pass
        on (the HTTP front end's own)."""
        self.core = core
        self.spec = spec
        self.forward_app = forward_app
        self._workers = [_Worker(index) for index in range(spec.count)]
        self._supervisors: list[asyncio.Task[None]] = []
        self._stopping = False
        self.restarts = 0

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process is not None]

    async def start(self) -> None:
        """Start every worker and wait until each listens; a ServerError says why not."""
        for worker in self._workers:
            await self._spawn(worker)
        try:
            for worker in self._workers:
                await self._ready_or_again(worker)
        except BaseException:
            await self.stop(0.0)
            raise
        for worker in self._workers:
            task = asyncio.create_task(self._supervise(worker), name=f"worker-{worker.index}")
            self._supervisors.append(task)

    async def stop(self, grace_s: float) -> None:
        """Ask every worker to drain and exit (SIGTERM) within `grace_s`, then kill the
        ones left."""
        self._stopping = True
        for task in self._supervisors:
            task.cancel()
        for task in self._supervisors:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        running = [w.process for w in self._workers if w.process is not None]
        for process in running:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        waits = [asyncio.ensure_future(p.wait()) for p in running]
        if waits:
            _done, late = await asyncio.wait(waits, timeout=grace_s + 1.0)
            for process in running:
                if process.returncode is None:
                    log.warning("%s worker %d did not exit in time: killed", self.spec.what,
                                process.pid)  # fmt: skip
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
            if late:
                await asyncio.wait(late, timeout=5.0)
        for worker in self._workers:
            if worker.link is not None:
                worker.link.close()

    # --- processes -----------------------------------------------------------------------

    async def _spawn(self, worker: _Worker) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            config = {**self.spec.config, "link_fd": theirs.fileno(), "index": worker.index}
            worker.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                self.spec.module,
                json.dumps(config),
                pass_fds=(theirs.fileno(), *self.spec.pass_fds),
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        worker.started_at = time.monotonic()
        worker.ready = asyncio.get_running_loop().create_future()
        label = f"{self.spec.what.lower()}-worker-{worker.index}"
        worker.link = Link(
            ours,
            label,
            lambda message: self._received(worker, message),
            lambda: self._link_closed(worker),
        )

    async def _wait_ready(self, worker: _Worker) -> None:
        assert worker.ready is not None and worker.process is not None
        wait: asyncio.Future[Any] = asyncio.ensure_future(worker.process.wait())
        ready: asyncio.Future[Any] = worker.ready
        try:
            done, _ = await asyncio.wait(
                [ready, wait], timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            wait.cancel()
        failure = worker.ready.result() if worker.ready.done() else None
        if worker.ready.done() and failure is None:
            return
        reason = failure or (
            f"exited with {worker.process.returncode}" if wait in done else "did not start"
        )
        raise ServerError(
            ErrorCode.UNAVAILABLE, f"{self.spec.what} worker {worker.index}: {reason}"
        )

    async def _ready_or_again(self, worker: _Worker) -> None:
        """Wait until a starting worker listens; one that fails to is started again, up
        to START_TRIES times in all, as a crashed one would be: on a loaded host a
        worker can lose its start, and the server should not fail for it."""
        for attempt in range(1, START_TRIES + 1):
            try:
                await self._wait_ready(worker)
                return
            except ServerError as exc:
                if attempt == START_TRIES:
                    raise
                log.warning("%s: starting it again", exc.message)
            process = worker.process
            if process is not None and process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            if worker.link is not None:
                worker.link.close()
            await self._spawn(worker)

    async def _supervise(self, worker: _Worker) -> None:
        """Start the worker again whenever it exits, until the front end stops."""
        delay = 0.1
        while True:
            assert worker.process is not None
            code = await worker.process.wait()
            if worker.link is not None:
                worker.link.close()
            log.warning(
                "%s worker %d (pid %d) exited with %s: starting it again",
                self.spec.what, worker.index, worker.process.pid, code,
            )  # fmt: skip
            if time.monotonic() - worker.started_at > 10 * MAX_RESTART_DELAY_S:
                delay = 0.1  # it had been serving: no crash loop
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RESTART_DELAY_S)
            try:
                await self._spawn(worker)
                await self._wait_ready(worker)
            except ServerError as exc:
                log.error("%s", exc.message)
                continue
            self.restarts += 1

    # --- requests ------------------------------------------------------------------------

    def _received(self, worker: _Worker, message: Message) -> None:
        kind = message[0]
        if kind == "infer":
            _, request_id, endpoint, wire = message
            task = asyncio.create_task(self._infer(worker, request_id, endpoint, wire))
            worker.tasks[request_id] = task
        elif kind == "asgi" and self.forward_app is not None:
            _, request_id, scope, body = message
            task = asyncio.create_task(self._asgi(worker, request_id, scope, body))
            worker.tasks[request_id] = task
        elif kind == "done":
            regions = worker.held.pop(message[1], None)
            if regions and worker.link is not None:
                worker.link.release(regions)
        elif kind == "cancel":
            running = worker.tasks.get(message[1])
            if running is not None:
                running.cancel()
        elif kind == "ready":
            if worker.ready is not None and not worker.ready.done():
                worker.ready.set_result(None)
        elif kind == "failed":
            if worker.ready is not None and not worker.ready.done():
                worker.ready.set_result(str(message[1]))
        else:
            log.error("%s worker %d sent an unknown message %r", self.spec.what, worker.index,
                      kind)  # fmt: skip

    async def _infer(self, worker: _Worker, request_id: int, endpoint: str, wire: Any) -> None:
        link = worker.link
        assert link is not None
        try:
            try:
                with _as_error():
                    request = request_from_wire(link, wire)
                response = await self.core.infer(request, endpoint)
                regions: list[Region] = []
                answer: tuple[Any, ...] = (
                    "ok",
                    request_id,
                    response_to_wire(link, response, regions),
                )
                worker.held[request_id] = regions
            except ServerError as exc:
                reason = exc.reason.value if exc.reason is not None else None
                answer = ("err", request_id, exc.code.value, exc.message, reason)
            link.send(*answer)
        except asyncio.CancelledError:
            # The client went away, or the worker did; the core counted it as cancelled.
            if not link.closed:
                with contextlib.suppress(LinkClosed):
                    link.send("err", request_id, ErrorCode.CANCELLED.value, "cancelled", None)
        except LinkClosed:
            pass
        finally:
            worker.tasks.pop(request_id, None)

    async def _asgi(self, worker: _Worker, request_id: int, scope: Any, placed: Any) -> None:
        """Answer a passed-on HTTP request with the front end's own application."""
        link = worker.link
        assert link is not None and self.forward_app is not None
        body = bytes(link.view(placed))
        status = 500
        headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []
        answered = asyncio.Event()
        delivered = False
        streamed = False

        async def receive() -> MutableMapping[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await answered.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            nonlocal status, headers, streamed
            if message["type"] == "http.response.start":
                status = int(message["status"])
                headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
            elif message["type"] == "http.response.body":
                chunk = bytes(message.get("body", b""))
                if not message.get("more_body", False):
                    chunks.append(chunk)
                    return
                # A streamed answer (generate_stream's events): each chunk goes now.
                if not streamed:
                    streamed = True
                    link.send("start", request_id, status, headers)
                if chunk:
                    link.send("part", request_id, chunk)

        try:
            full = dict(scope)
            full["headers"] = [(bytes(k), bytes(v)) for k, v in scope["headers"]]
            full["asgi"] = {"version": "3.0", "spec_version": "2.3"}
            full["state"] = {}
            try:
                await self.forward_app(full, receive, send)
            finally:
                answered.set()
            regions: list[Region] = []
            content = link.place(memoryview(b"".join(chunks)), regions)
            worker.held[request_id] = regions
            link.send("ok", request_id, (status, headers, content))
        except Exception as exc:
            if isinstance(exc, LinkClosed):
                return
            log.exception("a passed-on HTTP request failed")
            with contextlib.suppress(LinkClosed):
                link.send("err", request_id, ErrorCode.INTERNAL.value, f"internal error: {exc!r}",
                          None)  # fmt: skip
        except asyncio.CancelledError:
            with contextlib.suppress(LinkClosed):
                if not link.closed:
                    link.send("err", request_id, ErrorCode.CANCELLED.value, "cancelled", None)
        finally:
            worker.tasks.pop(request_id, None)

    def _link_closed(self, worker: _Worker) -> None:
        for task in list(worker.tasks.values()):
            task.cancel()
        worker.held.clear()
        if worker.ready is not None and not worker.ready.done():
            worker.ready.set_result("its link closed before it listened")


@contextlib.contextmanager
def _as_error() -> Any:
    """A request the worker could not have sent: INTERNAL, not a crash of this process."""
    try:
        yield
    except ServerError:
        raise
    except Exception as exc:
        raise ServerError(ErrorCode.INTERNAL, f"bad request from a worker: {exc!r}") from exc
