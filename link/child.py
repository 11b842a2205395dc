"""Starting a supervised child process, and the policy for starting it again.

`start_child` makes the socket pair, starts the process with its end (the child's argv
names the fd: `argv(fd)`), and hands back a `Child`: the process and this side's socket,
for a driver (loop.py, thread.py) to wrap. A child's exit can be waited for blocking
(`wait`) or on an event loop (`exited`, through a pidfd, so no thread and no asyncio
child watcher is needed).

A child tells it serves with the link's `Ready` message (messages.py): the health signal
the supervisor waits for after each start. When a child dies the supervisor starts it
again after `Backoff.next_delay()`: the delay doubles while starts keep failing, up to a
most, and begins again from the first once a child had been serving a while.

A child leaves SIGINT and SIGTERM to its supervisor (`leave_stop_signals_to_parent`):
those reach the whole process group at once (Ctrl-C in a terminal, systemd's default
stop, `timeout`, `kill -- -PGID`), and the supervisor, which gets them too, ends its
children itself, in order: over the link, then SIGKILL past its grace. A child starts
with the two blocked, so that one sent while it is still starting waits for its handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

# What a supervised child leaves to its supervisor.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Child:
    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self.process = process
        self.sock = sock
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.process.poll() is None:
                self.process.send_signal(signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def wait(self, timeout: float) -> int | None:
        """Its exit code, killing it if it has not exited in `timeout`; None if even
        that did not end it."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            try:
                return self.process.wait(5)
            except subprocess.TimeoutExpired:
                return None

    async def exited(self) -> int:
        """Wait on the running loop until the process has exited; its exit code."""
        code = self.process.poll()
        if code is not None:
            return code
        loop = asyncio.get_running_loop()
        gone: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            if not gone.done():
                gone.set_result(None)

        try:
            fd = os.pidfd_open(self.process.pid)
        except ProcessLookupError:
            return self.process.wait()
        try:
            loop.add_reader(fd, readable)
            try:
                await gone
            finally:
                loop.remove_reader(fd)
        finally:
            os.close(fd)
        return self.process.wait()


def start_child(
    argv: Callable[[int], Sequence[str]],
    pass_fds: Sequence[int] = (),
    env: Mapping[str, str] | None = None,
) -> Child:
    """Start `argv(child's socket fd)`, with SIGINT and SIGTERM blocked until it calls
    `leave_stop_signals_to_parent`; OSError when the process cannot start."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # The child inherits this thread's signal mask: blocked, a stop signal sent to the
    # whole group while the child is still importing stays pending until the child has
    # taken it over (leave_stop_signals_to_parent), instead of killing it.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        process = subprocess.Popen(
            list(argv(theirs.fileno())),
            pass_fds=(theirs.fileno(), *pass_fds),
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        theirs.close()
    return Child(process, ours)


def leave_stop_signals_to_parent() -> None:
    """Make SIGINT and SIGTERM do nothing in this (child) process, as Triton's Python stub
    does (pb_stub.cc), and unblock them (`start_child` started it with them blocked): call
    it first thing, on the main thread. A handler that does nothing rather than SIG_IGN:
    an ignored signal stays ignored across exec, so the processes a model starts would
    ignore it too, while a handler goes back to the default there. Code run later (a
    model's) may set its own."""
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _left_to_parent)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    # A process forked from here (a model's multiprocessing pool) would keep the handler,
    # and its own parent's terminate() (SIGTERM) would then never end it: it gets the
    # default back, with the two blocked across the fork so that one sent at once waits
    # for it rather than meeting the handler.
    os.register_at_fork(
        before=_block_stop_signals,
        after_in_parent=_unblock_stop_signals,
        after_in_child=_default_stop_signals,
    )


def _left_to_parent(signum: int, frame: FrameType | None) -> None:
    return None


def _block_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)


def _unblock_stop_signals() -> None:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


def _default_stop_signals() -> None:
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    _unblock_stop_signals()


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


class Backoff:
    """The delays between starts of a child that keeps dying or failing to start."""

    def __init__(self, first_s: float, most_s: float, settled_s: float | None = None) -> None:
        """`settled_s`: a child that served this long before it died starts again after
        `first_s` (it was no crash loop); None: only `reset` starts again from there."""
        self.first_s = first_s
        self.most_s = most_s
        self.settled_s = settled_s
        self._delay = first_s

    def reset(self) -> None:
        self._delay = self.first_s

    def next_delay(self, served_s: float = 0.0) -> float:
        if self.settled_s is not None and served_s > self.settled_s:
            self.reset()
        delay = self._delay
        self._delay = min(delay * 2, self.most_s)
        return delay
