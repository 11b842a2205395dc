"""The server's side of its front-end workers: starts, serves and restarts them.

Each worker is a supervised child on the process link (ge_serve.link.child): started with
its end of a socket pair, it sends `Ready` once it listens (or why it cannot), and when it
dies it is started again after the link's backoff. Its decoded requests run through
`InferenceServer.infer` as this process's own do: through the one scheduler of each
model, so requests from every worker batch together, and through the one set of
statistics and metrics.

A worker that dies takes only its own requests with it (they end as cancelled, as when
their clients go away); the others keep serving. A worker whose link ends exits.

At the server's stop each worker is told so over its link (`Stop`) and drains, and is
killed if it has not exited within the grace. Workers leave SIGINT and SIGTERM to this
process: sent to the whole process group, they must not start a worker's stop on its
own, nor end one that the supervisor would then start again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ge_serve.link.child import Backoff, Child, exit_reason, start_child
from ge_serve.link.frames import LinkClosed
from ge_serve.link.loop import LoopLink
from ge_serve.link.messages import Message, Ready, Region

from ..errors import ErrorCode, ServerError
from ..inference.core import InferenceServer
from .codec import request_from_wire, response_to_wire
from .messages import INLINE_MAX, TO_SERVER, Answer, Cancel, Done, Failed, Infer, Stop

log = logging.getLogger(__name__)

# How long a new worker may take to report that it listens.
START_TIMEOUT_S = 60.0
# How many times a worker is started before the front end gives up on it at start-up.
START_TRIES = 3
# Restarts of a worker that keeps dying wait longer each time, up to this.
MAX_RESTART_DELAY_S = 5.0
# A worker that fails to start again the same way is logged this often, not every try.
REPEAT_LOG_S = 60.0


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What to run: `python -m module` with `config` (JSON) as its one argument; the
    link's file descriptor is added to the config as `link_fd`."""

    module: str
    what: str  # "gRPC", "HTTP": for logs and errors
    count: int
    config: dict[str, Any]
    pass_fds: tuple[int, ...] = ()
    # Variables set in the workers' environment on top of this process's.
    env: dict[str, str] = field(default_factory=dict)


@dataclass(eq=False)
class _Worker:
    index: int
    child: Child | None = None
    link: LoopLink | None = None
    ready: asyncio.Future[str | None] | None = None
    tasks: dict[int, asyncio.Task[None]] = field(default_factory=dict)
    # A response's regions of this process's arena, until the worker has sent it.
    held: dict[int, list[Region]] = field(default_factory=dict)


class FrontEndWorkers:
    """Starts, serves and restarts the worker processes of one front end."""

    def __init__(self, core: InferenceServer, spec: WorkerSpec) -> None:
        self.core = core
        self.spec = spec
        self._workers = [_Worker(index) for index in range(spec.count)]
        self._supervisors: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Start every worker and wait until each listens; a ServerError says why not."""
        for worker in self._workers:
            self._spawn(worker)
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
        """Ask every worker to drain and exit (`Stop`) within `grace_s`, then kill the
        ones left."""
        for task in self._supervisors:
            task.cancel()
        for task in self._supervisors:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        running = [w.child for w in self._workers if w.child is not None]
        for worker in self._workers:
            if worker.link is not None:
                # A closed link: the worker has ended, or ends as it sees that.
                with contextlib.suppress(LinkClosed):
                    worker.link.send(Stop())
        waits = [asyncio.ensure_future(c.exited()) for c in running]
        if waits:
            _done, late = await asyncio.wait(waits, timeout=grace_s + 1.0)
            for child in running:
                if child.returncode is None:
                    log.warning("%s worker %d did not exit in time: killed", self.spec.what,
                                child.pid)  # fmt: skip
                    child.kill()
            if late:
                await asyncio.wait(late, timeout=5.0)
        for worker in self._workers:
            if worker.link is not None:
                worker.link.close()

    # --- processes -----------------------------------------------------------------------

    def _spawn(self, worker: _Worker) -> None:
        def argv(fd: int) -> list[str]:
            config = {**self.spec.config, "link_fd": fd, "index": worker.index}
            return [sys.executable, "-m", self.spec.module, json.dumps(config)]

        env = {**os.environ, **self.spec.env} if self.spec.env else None
        worker.child = child = start_child(argv, self.spec.pass_fds, env)
        worker.ready = asyncio.get_running_loop().create_future()
        label = f"{self.spec.what.lower()}-worker-{worker.index}"
        worker.link = LoopLink(
            child.sock,
            TO_SERVER,
            label,
            lambda message: self._received(worker, message),
            lambda: self._link_closed(worker),
            INLINE_MAX,
        )

    async def _wait_ready(self, worker: _Worker) -> None:
        assert worker.ready is not None and worker.child is not None
        wait: asyncio.Future[Any] = asyncio.ensure_future(worker.child.exited())
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
            exit_reason(worker.child.returncode) if wait in done else "did not start"
        )
        # A worker that will not serve is ended here, so that whoever starts it again (a
        # retried start, or the supervisor waiting for its exit) never waits on it.
        worker.child.kill()
        await worker.child.exited()
        if worker.link is not None:
            worker.link.close()
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
            self._spawn(worker)

    async def _supervise(self, worker: _Worker) -> None:
        """Start the worker again whenever it exits, until the front end stops."""
        backoff = Backoff(0.1, MAX_RESTART_DELAY_S, settled_s=10 * MAX_RESTART_DELAY_S)
        while True:
            child = worker.child
            assert child is not None
            code = await child.exited()
            if worker.link is not None:
                worker.link.close()
            log.warning(
                "%s worker %d (pid %d) %s: starting it again",
                self.spec.what, worker.index, child.pid, exit_reason(code),
            )  # fmt: skip
            await self._restart(worker, backoff)

    async def _restart(self, worker: _Worker, backoff: Backoff) -> None:
        """Start the worker until it listens. A start that fails (a certificate file
        gone, say) is tried again after the backoff; the same failure again is logged
        once a minute, not at every try."""
        said, said_at = "", 0.0
        while True:
            assert worker.child is not None
            started = worker.child.started_at
            await asyncio.sleep(backoff.next_delay(time.monotonic() - started))
            try:
                self._spawn(worker)
                await self._wait_ready(worker)
                return
            except (ServerError, OSError) as exc:
                reason = exc.message if isinstance(exc, ServerError) else str(exc)
                if reason != said or time.monotonic() - said_at >= REPEAT_LOG_S:
                    log.error("%s (trying again)", reason)
                    said, said_at = reason, time.monotonic()

    # --- requests ------------------------------------------------------------------------

    def _received(self, worker: _Worker, message: Message) -> None:
        link = worker.link
        assert link is not None
        if isinstance(message, Infer):
            worker.tasks[message.id] = asyncio.create_task(self._infer(worker, message))
        elif isinstance(message, Done):
            regions = worker.held.pop(message.id, None)
            if regions:
                link.free(regions)
        elif isinstance(message, Cancel):
            running = worker.tasks.get(message.id)
            if running is not None:
                running.cancel()
        elif isinstance(message, Ready):
            if worker.ready is not None and not worker.ready.done():
                worker.ready.set_result(message.failure)
        else:
            log.error("%s worker %d sent an unexpected message %s", self.spec.what,
                      worker.index, type(message).__name__)  # fmt: skip

    async def _infer(self, worker: _Worker, message: Infer) -> None:
        link = worker.link
        assert link is not None
        request_id = message.id
        try:
            try:
                with _as_error():
                    request = request_from_wire(link, message.request)
                response = await self.core.infer(request, message.endpoint)
                regions: list[Region] = []
                try:
                    wire = response_to_wire(link, response, regions)
                except Exception as exc:  # the worker waits for an answer, whatever happens
                    link.free(regions)
                    text = f"the response cannot be passed on: {exc}"
                    raise ServerError(ErrorCode.INTERNAL, text) from None
                answer: Answer | Failed = Answer(request_id, wire)
                if regions:  # the worker sends Done only for an answer that holds some
                    worker.held[request_id] = regions
            except ServerError as exc:
                reason = exc.reason.value if exc.reason is not None else None
                answer = Failed(request_id, exc.code.value, exc.message, reason)
            try:
                link.send(answer)
            except (msgspec.EncodeError, OverflowError, TypeError) as exc:
                link.free(worker.held.pop(request_id, []))
                text = f"the response cannot be passed on: {exc}"
                link.send(Failed(request_id, ErrorCode.INTERNAL.value, text))
        except asyncio.CancelledError:
            # The client went away, or the worker did; the core counted it as cancelled.
            if not link.closed:
                with contextlib.suppress(LinkClosed):
                    link.send(Failed(request_id, ErrorCode.CANCELLED.value, "cancelled"))
        except LinkClosed:
            pass
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
