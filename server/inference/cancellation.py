"""A request cancelled by the one who made it, as Triton's request cancellation does it.

`TRITONSERVER_InferenceRequestCancel` only marks the request: a request still in its
queue is then refused CANCELLED when the scheduler reaches it, and one already running
goes on; its model may ask `is_cancelled()` and stop, or ignore it, and the responses it
sends still reach the caller. A Python model's `ResponseIterator.cancel()` on a decoupled
BLS call is that (python_backend's qa decoupled_bls_cancel, with and without the called
model honouring it).

It differs from a client that goes away (`Responses.cancel`), whose request is stopped
and whose responses have nowhere to go. The cancel may come before the request reaches
the core, so it is kept until the request is bound to it.
"""

from __future__ import annotations

from ..errors import request_cancelled
from .cutoff import Responses


class Cancellation:
    """One request's cancellation by its caller. On the event loop."""

    def __init__(self) -> None:
        self._held: Responses | None = None
        self._queues = False
        self._requested = False

    def cancel(self) -> None:
        self._requested = True
        if self._held is not None:
            _mark(self._held, self._queues)

    def bind(self, held: Responses, queues: bool) -> None:
        """The request is in the core now, with its work item and execution. `queues`:
        whether its scheduler queues requests and sets their queue time as it hands them
        to a slot (an ensemble and a generation run theirs at once)."""
        self._held = held
        self._queues = queues
        if self._requested:
            _mark(held, queues)


def _mark(held: Responses, queues: bool) -> None:
    item, submitted = held.item, held.submitted
    if item is None:
        return
    if item.context is not None:
        item.context.cancelled = True
    # A queueing scheduler sets the queue time when it hands the request to a slot: none
    # yet means it is still queued, and is refused as Triton's queue refuses a cancelled
    # request.
    queued = queues and item.timings.queue_ns == 0
    if submitted is not None and not submitted.done() and queued:
        submitted.cancel()
        held.sink.fail(request_cancelled())
