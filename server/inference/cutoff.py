"""The requests running in the core, so that a stopping server can answer the ones still
running when its exit timeout runs out.

On SIGTERM the front ends take no new requests and wait, up to `--exit-timeout-secs`,
for the ones they took (server/control/stopping.py). Whatever still runs then used to be
cancelled by the front ends as they closed: an HTTP client got a text/plain 500, or a
stream cut mid-body; a gRPC client grpc core's "Cancelling all calls". So at the exit
timeout the core ends each of them itself, with UNAVAILABLE (`cut_off_at_exit`), as an
unload ends a generation in flight, and the front ends answer that as any error: 503 and
the error body (OpenAI's error object on /v1), an error event in a stream, gRPC
UNAVAILABLE or an error response on a stream. They have `ANSWER_S` (stopping.py) to send
it before they close. What is ended is told it was cancelled (`RequestContext.cancelled`,
the engine drops its sequence), as when a client goes away.

Each kind of request is held the cheapest way for it, since every request pays for this:
- One request, one response (`InferPath.run`): the task awaiting it, counted while it is
  in the core. The cut cancels the task, and `run` turns that CancelledError, once it
  comes back up, into the error; the scheduler below sees a client that went away (a
  queued request leaves its queue, an execution already running finishes on its slot and
  its result is dropped).
- A decoupled request's responses (`InferPath.responses`): the error goes into its
  response queue as the final response, and its execution is cancelled. The task reading
  the responses is not cancelled: it may be in the front end, writing the response before,
  and then reads the error next.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from ge_serve.scheduler.work import Array, WorkItem

from ..errors import cut_off_at_exit
from .request_level import ResponseQueue

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class Responses:
    """A decoupled request whose responses are being read: what the cut ends."""

    sink: ResponseQueue
    item: WorkItem | None = None
    submitted: asyncio.Future[dict[str, Array]] | None = None

    def cancel(self) -> None:
        """Its reader went away, or the cut came: a model that asks is_cancelled() learns
        it, and an execution not yet done is cancelled."""
        if self.item is not None and self.item.context is not None:
            self.item.context.cancelled = True
        if self.submitted is not None and not self.submitted.done():
            self.submitted.cancel()

    def cut(self) -> None:
        self.cancel()
        # Final: what the model still sends is dropped (ResponseQueue takes nothing after).
        self.sink.fail(cut_off_at_exit())


class CutOff:
    def __init__(self) -> None:
        # The tasks in `run`, each with how many runs deep it is (an ensemble's step can
        # run in its request's task).
        self._tasks: dict[asyncio.Task[Any], int] = {}
        # The tasks the cut cancelled, until the CancelledError has come back to `run`.
        self._cut: set[asyncio.Task[Any]] = set()
        self.responses: set[Responses] = set()

    def enter(self) -> asyncio.Task[Any] | None:
        """Hold the task now entering `run`; pair with `leave` in a finally."""
        task = asyncio.current_task()
        if task is not None:
            tasks = self._tasks
            tasks[task] = tasks.get(task, 0) + 1
        return task

    def leave(self, task: asyncio.Task[Any] | None) -> None:
        if task is None:
            return
        tasks = self._tasks
        depth = tasks[task] - 1
        if depth:
            tasks[task] = depth
            return
        del tasks[task]
        if self._cut and task in self._cut:
            # Cancelled by the cut, but the cancellation never came back up (the request
            # ended first, or something below kept it): withdraw it, as nothing will.
            self._cut.discard(task)
            task.uncancel()

    def caught(self, task: asyncio.Task[Any] | None) -> bool:
        """Whether the CancelledError that `run`, in `task`, caught is the cut's. If so, the
        cancellation is withdrawn (the task goes on, to answer with the error)."""
        if task is None or task not in self._cut:
            return False
        self._cut.discard(task)
        task.uncancel()
        return True

    def cut(self) -> int:
        """End every request running in the core with `cut_off_at_exit()`; how many."""
        for responses in list(self.responses):
            responses.cut()
        tasks = [task for task in self._tasks if not task.done() and task not in self._cut]
        for task in tasks:
            self._cut.add(task)
            task.cancel()
        count = len(self.responses) + len(tasks)
        if count:
            # An ensemble's steps are requests of their own, counted with it.
            log.warning(
                "%d request(s) (ensemble steps included) still running at the exit timeout "
                "are ended UNAVAILABLE",
                count,
            )
        return count
