"""A worker process as the server sees it: started, talked to, and seen to end.

`WorkerProcess` starts `python -m ge_serve.backends.python.stub` with the server's own
interpreter and import path (plus what an execution environment adds), over a Unix
socket pair. Its reader thread takes every message the worker sends: answers to the
server's calls (init, execute, finalize) complete the call waiting on them; everything the
model starts itself (responses through a sender, BLS calls, metrics, log lines) goes to
the `WorkerHost`, the model instance it serves. A writer thread sends what the event loop
hands it (BLS answers), so the loop never waits on the socket or copies tensors.

When the socket reaches its end, the worker is gone: every call still waiting fails with
`WorkerDied`, saying how the process ended (its exit code or the signal that killed it).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .channel import Channel, ChannelClosed, Message
from .shm import Arena, PeerSegments, Region
from .tensors import Array, TensorDesc, read_tensor, write_tensor

log = logging.getLogger(__name__)

MODULES = Path(__file__).resolve().parent / "modules"
# Releases owed to a worker are sent at once past this many (else with the next message).
_RELEASE_BATCH = 64


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


def exit_reason(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


class WorkerProcess:
    def __init__(self, name: str, launch: Launch, host: WorkerHost) -> None:
        self.name = name
        self._launch = launch
        self._host = host
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: Channel | None = None
        self.peers = PeerSegments()
        self.arena = Arena(self._announce, f"ge-serve-pb-{name}")
        self._numbers = itertools.count(1)
        self._calls: dict[int, concurrent.futures.Future[tuple[Any, str | None]]] = {}
        self._lock = threading.Lock()
        self._released: list[Region] = []
        self._urgent = False
        self._writer_jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        self.exited: str | None = None

    @property
    def pid(self) -> int:
        return self._process.pid if self._process is not None else -1

    @property
    def alive(self) -> bool:
        return self.exited is None and self._process is not None

    def start(self) -> None:
        """Start the process and its threads (blocking only for the fork and exec)."""
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._process = subprocess.Popen(
                [
                    self._launch.python,
                    "-m",
                    "ge_serve.backends.python.stub",
                    str(child_end.fileno()),
                ],
                pass_fds=(child_end.fileno(),),
                env=self._launch.environment(),
                stdin=subprocess.DEVNULL,
            )
        except OSError as exc:
            parent_end.close()
            raise WorkerDied(f"the worker process could not start: {exc}") from exc
        finally:
            child_end.close()
        self._channel = Channel(parent_end)
        self._reader = threading.Thread(
            target=self._read, name=f"pb-reader-{self.name}", daemon=True
        )
        self._reader.start()
        threading.Thread(target=self._write, name=f"pb-writer-{self.name}", daemon=True).start()

    # --- talking to the worker ---------------------------------------------------------------

    def send(self, message: Message) -> None:
        channel = self._channel
        if channel is None or self.exited is not None:
            raise WorkerDied(self.exited or "the worker is not running")
        with self._lock:
            released, self._released = self._released, []
            self._urgent = False
        try:
            if released:
                channel.send(("release", released), message)
            else:
                channel.send(message)
        except ChannelClosed as exc:
            raise WorkerDied(self.exited or f"the worker's socket closed: {exc}") from exc

    def call(self, kind: str, *args: Any, timeout: float | None = None) -> Any:
        """Send `(kind, number, *args)` and wait for the worker's answer; raises
        WorkerDied if it ends first, RuntimeError with the worker's text if it failed."""
        number = next(self._numbers)
        future: concurrent.futures.Future[tuple[Any, str | None]] = concurrent.futures.Future()
        with self._lock:
            if self.exited is not None:
                raise WorkerDied(self.exited)
            self._calls[number] = future
        try:
            self.send((kind, number, *args))
            try:
                value, error = future.result(timeout)
            except concurrent.futures.TimeoutError:
                raise TimeoutError(f"the worker did not answer '{kind}' in {timeout}s") from None
        finally:
            with self._lock:
                self._calls.pop(number, None)
        if error is not None:
            raise RuntimeError(error)
        return value

    def post(self, job: Callable[[], None]) -> None:
        """Run `job` on the writer thread (from the event loop: never block there)."""
        self._writer_jobs.put(job)

    def write_tensors(self, tensors: Sequence[tuple[str, Array]]) -> list[TensorDesc]:
        return [write_tensor(self.arena, name, array) for name, array in tensors]

    def read_tensors(self, descs: Sequence[TensorDesc]) -> dict[str, Array]:
        """Copy tensors out of the worker's memory; their regions go back to it."""
        found = {desc[0]: read_tensor(self.peers, desc, copy=True) for desc in descs}
        self.release([desc[3] for desc in descs])
        return found

    def release(self, regions: list[Region], urgent: bool = False) -> None:
        with self._lock:
            self._released.extend(regions)
            self._urgent = self._urgent or urgent

    # --- ending ----------------------------------------------------------------------------

    def stop(self, timeout: float) -> None:
        """Close the socket (the worker exits when it sees that), wait, kill if need be;
        returns once the worker's end has been handled (its host told)."""
        channel = self._channel
        if channel is not None:
            channel.close()
        self.wait(timeout)
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout)

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()

    def wait(self, timeout: float) -> int | None:
        process = self._process
        if process is None:
            return None
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            try:
                return process.wait(5)
            except subprocess.TimeoutExpired:
                return None

    # --- threads ----------------------------------------------------------------------------

    def _announce(self, seg: int, fd: int, size: int) -> None:
        channel = self._channel
        if channel is None:
            raise WorkerDied("the worker is not running")
        channel.send(("segment", seg, size), fds=[fd])

    def _read(self) -> None:
        channel = self._channel
        assert channel is not None
        try:
            while True:
                for message in channel.receive():
                    self._dispatch(message)
                self._flush_releases()
        except ChannelClosed:
            pass
        except BaseException:
            log.exception("worker %s: reading its messages failed", self.name)
        self._ended()

    def _dispatch(self, message: Message) -> None:
        kind = message[0]
        if kind == "done":
            _kind, number, value, error = message
            with self._lock:
                future = self._calls.get(number)
            if future is not None and not future.done():
                future.set_result((value, error))
        elif kind == "segment":
            assert self._channel is not None
            self.peers.add(message[1], self._channel.take_fd(), message[2])
        elif kind == "release":
            for region in message[1]:
                self.arena.free(tuple(region))
        else:
            self._host.on_message(self, message)

    def _flush_releases(self) -> None:
        with self._lock:
            if not self._released or not (self._urgent or len(self._released) > _RELEASE_BATCH):
                return
            released, self._released = self._released, []
            self._urgent = False
        channel = self._channel
        if channel is not None:
            with contextlib.suppress(ChannelClosed):
                channel.send(("release", released))

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
        process = self._process
        code = None
        if process is not None:
            try:
                code = process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()  # it closed its socket but lives on: it is no use any more
                code = process.wait(5)
        reason = f"the worker process (pid {self.pid}) {exit_reason(code)}"
        with self._lock:
            self.exited = reason
            calls, self._calls = self._calls, {}
        for future in calls.values():
            if not future.done():
                future.set_exception(WorkerDied(reason))
        self._writer_jobs.put(None)
        if self._channel is not None:
            self._channel.close()
        self._host.on_exit(self, reason)
