"""A request's own chat template (--trust-request-chat-template), rendered in a process
of its own (templatechild.py: why), within a time.

`TemplateProcesses` keeps two such processes, each started on first use and used by one
render at a time, on the threads Catalog keeps for these renders. A render waits for
its answer until its time is up (vLLM's 30 s) or its client has gone; then the process
is killed, whatever it was doing (a loop, a C call that holds its interpreter, a huge
allocation), and the next render starts another. A process that ran out of memory exits
by itself after answering. The server's own memory, loop and other requests never see
the client's code run.
"""

from __future__ import annotations

import os
import queue
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import msgspec

from .errors import OpenAIError
from .templatechild import MAX_FRAME, Failed, Job, Rendered, Reply, frame

# vLLM's VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT default.
REQUEST_TEMPLATE_SECONDS: Final = 30.0
# How often a render waiting for its process looks at its client.
_POLL_S: Final = 0.05
_CHILD: Final = "ge_serve.server.http.openai.templatechild"
_LENGTH_BYTES: Final = 4


class _Binding(threading.local):
    """The processes, deadline and stop of the render running on this thread (set by
    `TemplateProcesses.bound`, read by `render_own`, which template.py calls)."""

    processes: TemplateProcesses | None = None
    deadline = 0.0
    stop: threading.Event | None = None


_bound = _Binding()


class Stopped(Exception):
    """The render's time ran out, or its client left: its process was killed."""


class _Process:
    """One template process, used by one thread at a time. Reaped (killed, its pipes
    closed) when this object goes, or at the interpreter's exit, whichever comes first."""

    def __init__(self) -> None:
        # The running process, in a list the finalizer shares (it must not hold self).
        self._held: list[subprocess.Popen[bytes]] = []
        self._decoder = msgspec.msgpack.Decoder(Reply)
        weakref.finalize(self, _reap, self._held)

    def render(self, job: bytes, deadline: float, stop: threading.Event) -> Reply:
        """The reply to `job` (a frame); Stopped, OSError, DecodeError: killed."""
        proc = self._started()
        assert proc.stdin is not None
        try:
            proc.stdin.write(job)
            proc.stdin.flush()
            length = int.from_bytes(self._read(proc, _LENGTH_BYTES, deadline, stop))
            if length > MAX_FRAME:
                raise OSError("the template process sent more than it may")
            reply = self._decoder.decode(self._read(proc, length, deadline, stop))
        except (Stopped, OSError, msgspec.DecodeError):
            self.kill()
            raise
        if isinstance(reply, Failed) and reply.kind == "memory":
            self.kill()
        return reply

    def _started(self) -> subprocess.Popen[bytes]:
        if self._held and self._held[0].poll() is not None:
            _reap(self._held)
        if not self._held:
            self._held.append(
                subprocess.Popen(
                    [sys.executable, "-m", _CHILD],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    close_fds=True,
                )
            )
        return self._held[0]

    def _read(
        self, proc: subprocess.Popen[bytes], count: int, deadline: float, stop: threading.Event
    ) -> bytes:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        data = bytearray(count)
        view, done = memoryview(data), 0
        while done < count:
            if stop.is_set() or time.monotonic() > deadline:
                raise Stopped
            ready, _, _ = select.select([fd], [], [], _POLL_S)
            if ready:
                more = os.readv(fd, [view[done:]])
                if not more:
                    raise OSError("the template process ended")
                done += more
        return bytes(data)

    def kill(self) -> None:
        _reap(self._held)


def _reap(held: list[subprocess.Popen[bytes]]) -> None:
    while True:
        try:  # the exit's finalizer and a render's thread may both reap
            proc = held.pop()
        except IndexError:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


class TemplateProcesses:
    """The processes requests' own templates render in: `count`, one render each."""

    def __init__(self, count: int = 2, seconds: float = REQUEST_TEMPLATE_SECONDS) -> None:
        self.seconds = seconds
        self._idle: queue.SimpleQueue[_Process] = queue.SimpleQueue()
        for _ in range(count):
            self._idle.put(_Process())

    @contextmanager
    def bound(self, stop: threading.Event) -> Iterator[None]:
        """Renders of a request's own template on this thread, until the block ends, go to
        a process of these, within the time from now; `stop`: its client has gone."""
        _bound.processes, _bound.stop = self, stop
        _bound.deadline = time.monotonic() + self.seconds
        try:
            yield
        finally:
            _bound.processes, _bound.stop = None, None

    def render(
        self, source: str, variables: dict[str, Any], deadline: float, stop: threading.Event
    ) -> Reply:
        """The template rendered with `variables` in a process of these (blocking); the
        client's 400 where it ran out of time."""
        try:
            job = frame(Job(source, variables))
        except (ValueError, TypeError, OverflowError, msgspec.EncodeError) as exc:
            # JSON's integers past 64 bits, and what else msgpack cannot carry.
            raise OpenAIError(
                f"The conversation cannot be given to the request's chat template: {exc}",
                param="chat_template",
            ) from None
        process = self._idle.get()
        try:
            return process.render(job, deadline, stop)
        except Stopped:
            raise OpenAIError(
                f"The request's chat template took more than {self.seconds:g} s to render",
                param="chat_template",
            ) from None
        except (OSError, msgspec.DecodeError) as exc:
            raise OpenAIError(
                f"The request's chat template could not be rendered: {exc}",
                param="chat_template",
            ) from None
        finally:
            self._idle.put(process)

    def close(self) -> None:
        """Kill the processes not rendering (a server that exits closes their pipes, and
        each then ends by itself)."""
        while True:
            try:
                process = self._idle.get_nowait()
            except queue.Empty:
                return
            process.kill()


def render_own(source: str, variables: dict[str, Any]) -> Reply:
    """A request's own template rendered by the processes bound to this thread."""
    processes, stop = _bound.processes, _bound.stop
    if processes is None or stop is None:
        raise RuntimeError("a request's own template renders within TemplateProcesses.bound")
    return processes.render(source, variables, _bound.deadline, stop)


__all__ = ["Failed", "Rendered", "Stopped", "TemplateProcesses", "render_own"]
