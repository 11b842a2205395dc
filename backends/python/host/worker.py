"""A worker process as the server sees it: started, talked to, and seen to end.

`WorkerProcess` starts `python -m ge_serve.backends.python.child.stub` with the server's
own interpreter and import path (plus what an execution environment adds), as a child on
the process link (ge_serve.link.child, thread driver). Its reader thread takes every
message the worker sends: answers to the server's calls (init, execute, finalize)
complete the call waiting on them; everything the model starts itself (responses through
a sender, BLS calls, metrics, log lines) goes to the `WorkerHost`, the model instance it
serves. A writer thread sends what the event loop hands it (BLS answers), so the loop
never waits on the socket or copies tensors.

When the socket reaches its end, the worker is gone: every call still waiting fails with
`WorkerDied`, saying how the process ended (its exit code or the signal that killed it).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import os
import queue
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ge_serve.link.child import Child, exit_reason, start_child
from ge_serve.link.frames import LinkClosed
from ge_serve.link.messages import Message, Ready, Region
from ge_serve.link.tensors import ArenaTensor, Array, read_tensor, regions_of, write_tensor
from ge_serve.link.thread import ThreadLink

from ..messages import TO_SERVER, Autocomplete, Done, Execute, Finalize, Init

log = logging.getLogger(__name__)

MODULES = Path(__file__).resolve().parent.parent / "child" / "modules"
# Releases owed to a worker are sent at once past this many (else with the next message).
_RELEASE_BATCH = 64
# How long a new worker may take to say it is up.
START_TIMEOUT_S = 60.0

# The server's calls, each answered with a `Done`; `number` is set by `call`.
CallMessage = Init | Execute | Autocomplete | Finalize


class WorkerDied(RuntimeError):
    """The worker process ended (or could not start) while a call waited on it."""


@dataclass(frozen=True, slots=True)
class Launch:
    """How worker processes start: the interpreter, the import path put first, and
    environment variables to set."""

    python: str = sys.executable
    path: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        # The server's own import path, so the worker imports this very ge_serve (and the
        # model, numpy) as the server does; our triton_python_backend_utils goes first.
        entries = [str(MODULES), *self.path, *[p for p in sys.path if p]]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(entries))
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env


class WorkerHost(Protocol):
    """What a worker's own messages go to (called on its reader thread)."""

    def on_message(self, worker: WorkerProcess, message: Message) -> None: ...

    def on_exit(self, worker: WorkerProcess, reason: str) -> None: ...


class WorkerProcess:
    def __init__(self, name: str, launch: Launch, host: WorkerHost) -> None:
        self.name = name
        self._launch = launch
        self._host = host
        self._child: Child | None = None
        self._link: ThreadLink | None = None
        self._numbers = itertools.count(1)
        self._calls: dict[int, concurrent.futures.Future[Done]] = {}
        self._lock = threading.Lock()
        self._writer_jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()
        self.exited: str | None = None

    @property
    def pid(self) -> int:
        return self._child.pid if self._child is not None else -1

    @property
    def alive(self) -> bool:
        return self.exited is None and self._child is not None

    @property
    def link(self) -> ThreadLink:
        if self._link is None:
            raise WorkerDied("the worker is not running")
        return self._link

    def start(self) -> None:
        """Start the process and its threads, and wait for its health signal (`Ready`);
        WorkerDied if it ends or stays silent first."""
        python = self._launch.python

        def argv(fd: int) -> list[str]:
            return [python, "-m", "ge_serve.backends.python.child.stub", str(fd)]

        try:
            self._child = start_child(argv, env=self._launch.environment())
        except OSError as exc:
            raise WorkerDied(f"the worker process could not start: {exc}") from exc
        self._link = ThreadLink(self._child.sock, TO_SERVER, f"ge-serve-pb-{self.name}",
                                self._dispatch)  # fmt: skip
        self._reader = threading.Thread(
            target=self._read, name=f"pb-reader-{self.name}", daemon=True
        )
        self._reader.start()
        threading.Thread(target=self._write, name=f"pb-writer-{self.name}", daemon=True).start()
        if not self._ready.wait(START_TIMEOUT_S) or self.exited is not None:
            self.kill()
            raise WorkerDied(self.exited or f"the worker did not start in {START_TIMEOUT_S}s")

    # --- talking to the worker ---------------------------------------------------------------

    def send(self, message: Message) -> None:
        link = self._link
        if link is None or self.exited is not None:
            raise WorkerDied(self.exited or "the worker is not running")
        try:
            link.send(message)  # with the releases owed ahead of it
        except LinkClosed as exc:
            raise WorkerDied(self.exited or f"the worker's socket closed: {exc}") from exc

    def call(self, message: Callable[[int], CallMessage], timeout: float | None = None) -> Done:
        """Send `message(number)` and wait for the worker's `Done`; raises WorkerDied if
        it ends first, RuntimeError with the worker's text if it failed."""
        number = next(self._numbers)
        future: concurrent.futures.Future[Done] = concurrent.futures.Future()
        with self._lock:
            if self.exited is not None:
                raise WorkerDied(self.exited)
            self._calls[number] = future
        request = message(number)
        try:
            self.send(request)
            try:
                done = future.result(timeout)
            except concurrent.futures.TimeoutError:
                kind = type(request).__name__.lower()
                raise TimeoutError(f"the worker did not answer '{kind}' in {timeout}s") from None
        finally:
            with self._lock:
                self._calls.pop(number, None)
        if done.error is not None:
            raise RuntimeError(done.error)
        return done

    def post(self, job: Callable[[], None]) -> None:
        """Run `job` on the writer thread (from the event loop: never block there)."""
        self._writer_jobs.put(job)

    def write_tensors(
        self, tensors: Sequence[tuple[str, Array]], regions: list[Region]
    ) -> list[ArenaTensor]:
        arena = self.link.arena
        try:
            return [write_tensor(arena, name, array, regions) for name, array in tensors]
        except LinkClosed as exc:  # the worker went away; its exit may not be seen yet
            raise WorkerDied(self.exited or f"the worker's socket closed: {exc}") from exc

    def read_tensors(self, tensors: Sequence[ArenaTensor]) -> dict[str, Array]:
        """Copy tensors out of the worker's memory; their regions go back to it."""
        peers = self.link.peers
        found = {t.name: read_tensor(peers, t, copy=True) for t in tensors}
        self.release(regions_of(tensors))
        return found

    def free(self, regions: list[Region]) -> None:
        """Regions of this side's arena, done with."""
        link = self._link
        if link is not None:
            link.free(regions)

    def release(self, regions: list[Region], urgent: bool = False) -> None:
        """Regions of the worker's arena, read: owed back to it (ThreadLink.release)."""
        link = self._link
        if link is not None:
            link.release(regions, urgent)

    # --- ending ----------------------------------------------------------------------------

    def stop(self, timeout: float) -> None:
        """Close the socket (the worker exits when it sees that), wait, kill if need be;
        returns once the worker's end has been handled (its host told)."""
        link = self._link
        if link is not None:
            link.close()
        self.wait(timeout)
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout)

    def kill(self) -> None:
        if self._child is not None:
            self._child.kill()

    def wait(self, timeout: float) -> int | None:
        return None if self._child is None else self._child.wait(timeout)

    # --- threads ----------------------------------------------------------------------------

    def _read(self) -> None:
        link = self._link
        assert link is not None
        try:
            link.serve(_RELEASE_BATCH)
        except BaseException:
            log.exception("worker %s: reading its messages failed", self.name)
        self._ended()

    def _dispatch(self, message: Message) -> None:
        if isinstance(message, Done):
            with self._lock:
                future = self._calls.get(message.number)
            if future is not None and not future.done():
                future.set_result(message)
        elif isinstance(message, Ready):
            self._ready.set()
        else:
            self._host.on_message(self, message)

    def _write(self) -> None:
        while True:
            job = self._writer_jobs.get()
            if job is None:
                return
            try:
                job()
            except WorkerDied:
                pass
            except Exception:
                log.exception("worker %s: sending to it failed", self.name)

    def _ended(self) -> None:
        child = self._child
        code = None
        if child is not None:
            # It closed its socket but may live on: it is no use any more.
            code = child.wait(5)
        reason = f"the worker process (pid {self.pid}) {exit_reason(code)}"
        with self._lock:
            self.exited = reason
            calls, self._calls = self._calls, {}
        self._writer_jobs.put(None)
        self._ready.set()
        if self._link is not None:
            self._link.close()
        try:
            # The host first: the model reads as restarting before a caller hears of the
            # end, so a client that sees its error and looks (or retries) finds it down,
            # never READY on a dead worker.
            self._host.on_exit(self, reason)
        finally:
            for future in calls.values():
                if not future.done():
                    future.set_exception(WorkerDied(reason))
