"""How the process exits once the server has stopped: without waiting on an execution that
outlived the exit timeout."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

log = logging.getLogger("ge_serve")


def is_grpc_poller(thread: threading.Thread) -> bool:
    """grpc.aio's completion-queue poller: a daemon thread that waits in grpc core and ends
    when grpc shuts down at exit. It runs no model, so exit neither waits for it nor names
    it. (grpcio names it after its target, newer releases "grpc-aio-poller".)"""
    return thread.daemon and (
        thread.name == "grpc-aio-poller" or thread.name.endswith("(_poll_wrapper)")
    )


def leave_running_executions(code: int, grace_s: float = 2.0) -> None:
    """Exit at once when a model execution outlived --exit-timeout-secs.

    A running onnxruntime or ACL call cannot be interrupted, and letting the interpreter
    finalize under it aborts the process (SIGABRT from the runtime's destructors). Closed
    executor threads that are idle end within the grace period; a busy one means exit now.
    """
    deadline = time.monotonic() + grace_s
    others = [
        t
        for t in threading.enumerate()
        if t is not threading.current_thread() and not is_grpc_poller(t)
    ]
    for thread in others:
        thread.join(max(deadline - time.monotonic(), 0.0))
    busy = [t.name for t in others if t.is_alive()]
    if busy:
        log.warning(
            "exiting without waiting for %d thread(s) still running (an execution past "
            "--exit-timeout-secs?): %s",
            len(busy),
            ", ".join(busy),
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
