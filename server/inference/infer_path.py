"""The infer path: one request from admission to its response, in steps, each in one place.

Every way into the core runs through here: `InferenceServer.infer` (a client's request),
`infer_step` (one step of an ensemble) and `infer_responses` for a decoupled model.

1. Admission (`admit`): refused once the server stops accepting; shapes checked before
   any reaches numpy. An ensemble step is not admitted again: it belongs to a request
   already admitted, and finishes even once the server stops accepting.
2. Shared memory (shared_tensors.py): inputs mapped and output targets found before the
   request is counted, outputs written once the response is built.
3. The work item (`_work_item`): the request checked against the model
   (validation.py), with its context when the backend takes requests one by one.
4. The response cache (`_from_cache`, `_keep_in_cache`): asked before the scheduler,
   filled after; a request with shared-memory outputs bypasses it.
5. The scheduler (`_execute`); a version retired under the request (a swap) hands it
   to its replacement, a few times at most.
6. Failures classified once (failures.py), and every observer told how the request ended
   (`_finished`), which also ends its trace.

While it runs, a request is held in `cutoff` (cutoff.py), which a stopping server uses to
answer what is still running at its exit timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Protocol

from ge_serve.scheduler.ensemble import EnsembleScheduler
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.work import Array, Timings, WorkItem

from ..control.sharedmemory import Held, SharedMemoryManager
from ..errors import ErrorCode, SchedulerClosed, ServerError, cut_off_at_exit, shutting_down
from ..models.lifecycle import ModelLifecycle
from ..observability.statistics import StatisticsCollector
from ..observability.tracing import Trace, submit_traced, traced_context
from .cancellation import Cancellation
from .cutoff import CutOff, Responses
from .failures import failure_of, unlinked
from .model import ModelVersion
from .request_level import (
    ResponseQueue,
    decoupled_unsupported,
    error_response,
    model_error,
    request_context,
    response_of,
)
from .responsecache import Lookup, ResponseCache, enabled_for
from .shared_tensors import map_request, write_outputs
from .types import InferRequest, InferResponse, check_shape
from .validation import build_response, prepare

# How often a request refused by a retiring version is retried on its replacement.
_SWAP_RETRIES = 3


class InferObserver(Protocol):
    """Told about every finished request; statistics and metrics implement it."""

    def request_done(
        self,
        model: ModelVersion,
        item: WorkItem | None,
        error: ServerError | None,
        started_ns: int,
        finished_ns: int,
    ) -> None: ...

    def cache_hit(
        self, model: ModelVersion, queue_ns: int, lookup_ns: int, started_ns: int, finished_ns: int
    ) -> None:
        """A request answered from the response cache: a success, queued (until the
        lookup began) but never computed."""
        ...

    def cache_miss(self, model: ModelVersion, ns: int) -> None:
        """A miss's outputs were offered to the cache; `ns`: lookup and insert."""
        ...


@dataclass(slots=True)
class _Stream:
    """A decoupled request as its end needs it: what it runs on, how far it got, and
    what its release tells."""

    model: ModelVersion
    started: int
    trace: Trace | None
    released: Callable[[Timings], None] | None
    held: Responses
    item: WorkItem | None = None
    queued: int = 0  # when it went to the scheduler


@dataclass(slots=True)
class _Attempt:
    """How far one request got, which is what a failure is classified and counted by:
    the version serving it, its work item once checked, the outputs once produced."""

    model: ModelVersion
    item: WorkItem | None = None
    outputs: dict[str, Array] | None = None
    cached: Lookup | None = None


class InferPath:
    def __init__(
        self,
        lifecycle: ModelLifecycle,
        shared_memory: SharedMemoryManager,
        cache: ResponseCache | None,
        stats: StatisticsCollector,
    ) -> None:
        self.lifecycle = lifecycle
        self.shared_memory = shared_memory
        self.cache = cache
        self.stats = stats
        self.observers: list[InferObserver] = [stats]
        # Told as each decoupled request's first response goes out (the metrics' first-
        # response histogram); None, nothing is done per response.
        self.first_response: Callable[[ModelVersion, int], None] | None = None
        self.accepting = True
        self.cutoff = CutOff()

    # --- admission -----------------------------------------------------------------------

    def admit(self, request: InferRequest) -> None:
        if not self.accepting:
            raise shutting_down()
        # The front ends check shapes as they decode; this is for in-process callers,
        # before any shape reaches numpy (shared memory views are shaped below).
        for tensor in request.inputs:
            check_shape(tensor.shape, tensor.name, tensor.datatype.itemsize)

    def serving(self, name: str, version: str, endpoint: str) -> ModelVersion:
        """The version a one-response request goes to; `endpoint` names the caller in a
        decoupled model's refusal (Triton's "HTTP end point")."""
        model = self.lifecycle.get(name, version)
        if model.decoupled:
            raise decoupled_unsupported(endpoint)
        return model

    # --- one request, one response ---------------------------------------------------------

    async def run(
        self, request: InferRequest, model: ModelVersion, started: int, trace: Trace | None
    ) -> tuple[InferResponse, WorkItem]:
        held: Held = []
        try:
            targets = map_request(self.shared_memory, request, held)
        except BaseException:
            if trace is not None:
                trace.end()  # refused before it was counted
            raise
        attempt = _Attempt(model)
        cutoff = self.cutoff
        task = cutoff.enter()
        try:
            await self._execute(attempt, request, started, trace, bypass_cache=bool(targets))
            response = self._response(request, attempt)
            self._keep_in_cache(attempt)
            if targets:
                write_outputs(response, targets)
        except (Exception, asyncio.CancelledError) as exc:
            item = attempt.item
            cancelled = isinstance(exc, asyncio.CancelledError)
            # Still running at the exit timeout: ended by the server, which answers it.
            ended = cancelled and cutoff.caught(task)
            if ended:
                error = cut_off_at_exit()
            else:
                error = failure_of(exc, executing=item is not None and attempt.outputs is None)
            if cancelled and item is not None and item.context is not None:
                item.context.cancelled = True
            self._finished(attempt.model, item, error, started, trace=trace)
            if cancelled and not ended:
                raise
            try:
                raise unlinked(error, exc)
            finally:
                del error  # see `unlinked`
        finally:
            cutoff.leave(task)
            if held:
                self.shared_memory.release(held)
        cached = attempt.cached
        hit = cached if cached is not None and cached.found is not None else None
        self._finished(attempt.model, attempt.item, None, started, hit, trace)
        assert attempt.item is not None
        return response, attempt.item

    async def _execute(
        self,
        attempt: _Attempt,
        request: InferRequest,
        started: int,
        trace: Trace | None,
        bypass_cache: bool,
    ) -> None:
        """The request's outputs, from the cache or the model's scheduler, into `attempt`."""
        for _ in range(_SWAP_RETRIES):
            model = attempt.model
            if model.retiring:
                model = attempt.model = self._replacement(request, model)
            item = attempt.item = self._work_item(request, model, started, trace)
            if self._from_cache(attempt, bypass_cache):
                return
            try:
                if trace is None:
                    attempt.outputs = await model.scheduler.submit(item)
                else:
                    attempt.outputs = await submit_traced(model.scheduler, item, trace)
                return
            except SchedulerClosed:
                # Refused before it ran: the version was swapped out under us.
                attempt.model = self._replacement(request, model)
        raise ServerError(ErrorCode.UNAVAILABLE, "model is being reloaded, retry")

    def _replacement(self, request: InferRequest, old: ModelVersion) -> ModelVersion:
        """The version that now serves this request after `old` was retired."""
        model = self.lifecycle.get(request.model_name, request.model_version)
        if model is old:
            raise ServerError(ErrorCode.UNAVAILABLE, "model version is being unloaded")
        return model

    @staticmethod
    def _work_item(
        request: InferRequest,
        model: ModelVersion,
        started: int,
        trace: Trace | None = None,
        sink: ResponseQueue | None = None,
    ) -> WorkItem:
        item = prepare(request, model)
        item.enqueue_ns = started
        if sink is not None or model.loaded.per_request:
            item.context = request_context(request, sink, trace, item.sequence)
        return item

    @staticmethod
    def _response(request: InferRequest, attempt: _Attempt) -> InferResponse:
        item, model, outputs = attempt.item, attempt.model, attempt.outputs
        assert item is not None and outputs is not None
        context = item.context
        if context is None:
            response = build_response(request, model, outputs, item.batch_size)
        elif context.error is not None:
            raise model_error(context.error)
        else:
            parameters = context.response_parameters
            response = response_of(request, model, outputs, item.batch_size, parameters)
        if item.response_parameters:
            response.parameters.update(item.response_parameters)
        return response

    # --- the response cache ----------------------------------------------------------------

    def _from_cache(self, attempt: _Attempt, bypass: bool) -> bool:
        """Whether the response cache answered the request (its outputs, and the response
        parameters the model gave, are then the attempt's). Asked only for a model that
        enables the cache, and never for a request with shared-memory outputs."""
        model, item = attempt.model, attempt.item
        assert item is not None
        if self.cache is None or bypass or not enabled_for(model):
            attempt.cached = None
            return False
        cached = attempt.cached = self.cache.lookup(model, item.inputs)
        if cached.found is None:
            return False
        attempt.outputs = cached.found.outputs
        if item.context is not None:
            item.context.response_parameters = cached.found.parameters
        return True

    def _keep_in_cache(self, attempt: _Attempt) -> None:
        """A miss's outputs go into the cache (it may decline an entry too large)."""
        cached, item, outputs = attempt.cached, attempt.item, attempt.outputs
        if cached is None or cached.found is not None or self.cache is None:
            return
        assert item is not None and outputs is not None
        if any(name not in outputs for name in attempt.model.outputs):
            # Not every output: an ensemble that ran only the steps the request's outputs
            # need, or a Python model that left one out. The key is the inputs alone, so
            # a later request for the others must not find this.
            return
        parameters = item.context.response_parameters if item.context is not None else {}
        kept = self.cache.insert(cached, outputs, parameters)
        for observer in self.observers:
            observer.cache_miss(attempt.model, kept)

    # --- a decoupled model's responses -----------------------------------------------------

    async def responses(
        self,
        request: InferRequest,
        model: ModelVersion,
        errors_inline: bool = False,
        admitted: bool = False,
        trace: Trace | None = None,
        released: Callable[[Timings], None] | None = None,
        cancellation: Cancellation | None = None,
    ) -> AsyncGenerator[InferResponse, None]:
        """A decoupled model's responses: the request runs through the scheduler like any
        other (its execution may end long before its responses do), and each response
        the backend sends comes out as it arrives, until the final flag.

        An error response ends the iteration by raising, unless `errors_inline`: then it
        comes out as a response with `error` set, and later responses follow it, as
        Triton delivers them. The request counts as failed by its first error.
        `admitted`: a decoupled ensemble step, part of a request admitted already.

        A request that succeeded is counted, and its trace ended, once it is released:
        its final flag came and its execution returned (a model may send the final flag
        and go on working), as Triton reports a request's statistics when its backend
        releases it. Before that its compute times are not known. The stream itself
        ends at the final flag. `released` gets the request's timings then (an ensemble
        step's join its ensemble request's); a request that failed is released at once.
        `cancellation`: how its caller may cancel it (cancellation.py)."""
        started = time.monotonic_ns()
        regions: Held = []
        try:
            if not admitted:
                self.admit(request)
            # Each response's outputs go to the same regions, as Triton writes them
            # (stream_infer_handler.cc): a client reads each before the next arrives.
            targets = map_request(self.shared_memory, request, regions)
        except BaseException:
            if trace is not None:
                trace.end()  # refused before it was counted
            raise
        sink = ResponseQueue(asyncio.get_running_loop())
        item: WorkItem | None = None
        failed: ServerError | None = None
        held = Responses(sink)
        self.cutoff.responses.add(held)
        stream = _Stream(model, started, trace, released, held)
        answered = False  # the final response was handed to the reader
        first = self.first_response
        try:
            item = stream.item = held.item = self._work_item(
                request, model, started, trace, sink=sink
            )
            stream.queued = time.monotonic_ns()
            submitted = held.submitted = _submit(model, item, trace, stream.queued)
            submitted.add_done_callback(lambda task: _submit_ended(task, sink))
            if cancellation is not None:
                runs_at_once = (EnsembleScheduler, GenerationScheduler)
                cancellation.bind(held, not isinstance(model.scheduler, runs_at_once))
            while True:
                outputs, error, final, parameters = await sink.get()
                if first is not None:
                    first(model, started)
                    first = None
                if outputs is not None and error is None:
                    try:
                        response = response_of(request, model, outputs, item.batch_size, parameters)
                        if targets:
                            write_outputs(response, targets)
                    except ServerError as exc:
                        if not errors_inline:
                            raise
                        # Without its traceback, whose frames hold the response and the
                        # shared-memory window it failed to fill: kept in `failed`, they
                        # would keep the region mapped until the collector ran.
                        error = exc.with_traceback(None)
                    else:
                        response.final = final
                        if trace is not None:
                            trace.record_tensors("TENSOR_BACKEND_OUTPUT", outputs)
                        answered = final
                        yield response
                if error is not None:
                    if not errors_inline:
                        raise error
                    failed = failed or error
                    answered = final
                    yield error_response(request, error, final)
                    error = None  # not kept alive across the next wait
                if final:
                    break
        except GeneratorExit:
            if not answered:
                self._gone(stream, failed)
                raise
            # Closed at its final response, which was handed out: a normal end.
            self._release_when_done(stream, failed)
            raise
        except (Exception, asyncio.CancelledError) as exc:
            error = failure_of(exc, executing=item is not None)
            gone = isinstance(exc, asyncio.CancelledError)
            if gone:
                held.cancel()  # the client went away
            # A request closed after an inline error (its stream ended there) failed.
            ended = failed if gone and failed else error
            self._released(stream, ended)
            if gone:
                raise
            try:
                raise unlinked(error, exc)
            finally:
                del error  # see `unlinked`
        finally:
            self.cutoff.responses.discard(held)
            if regions:
                self.shared_memory.release(regions)
        self._release_when_done(stream, failed)

    def _gone(self, stream: _Stream, failed: ServerError | None) -> None:
        """The reader closed the stream before its final response: the client went away."""
        stream.held.cancel()
        # A request closed after an inline error (its stream ended there) failed.
        executing = stream.item is not None
        self._released(stream, failed or failure_of(GeneratorExit(), executing=executing))

    def _release_when_done(self, stream: _Stream, failed: ServerError | None) -> None:
        """Released once its execution returned too (a model may go on after its final
        flag)."""
        done = stream.held.submitted
        if done is None or done.done():
            self._released(stream, failed)
        else:
            done.add_done_callback(lambda _: self._released(stream, failed))

    def _released(self, stream: _Stream, error: ServerError | None) -> None:
        """A decoupled request is done with: its compute points traced, its timings
        handed on, every observer told."""
        item, trace = stream.item, stream.trace
        if item is not None:
            if trace is not None:
                trace.executed(stream.queued, item.timings, item.enqueue_ns)
            if stream.released is not None:
                stream.released(item.timings)
        self._finished(stream.model, item, error, stream.started, trace=trace)

    # --- the end of a request --------------------------------------------------------------

    def _finished(
        self,
        model: ModelVersion,
        item: WorkItem | None,
        error: ServerError | None,
        started: int,
        hit: Lookup | None = None,
        trace: Trace | None = None,
    ) -> None:
        """Every observer learns how the request ended; one answered from the response
        cache (`hit`) as a hit, not as an inference. A trace ends here."""
        finished = time.monotonic_ns()
        if trace is not None:
            trace.end(finished)
        if hit is not None:
            queue_ns = hit.started_ns - started
            for observer in self.observers:
                observer.cache_hit(model, queue_ns, hit.lookup_ns, started, finished)
            return
        for observer in self.observers:
            observer.request_done(model, item, error, started, finished)


def _submit(
    model: ModelVersion, item: WorkItem, trace: Trace | None, queued: int
) -> asyncio.Task[dict[str, Array]]:
    """The decoupled request's execution, as a task of its own. A traced request's trace
    is current in it, so a decoupled ensemble's steps name it as their parent."""
    if trace is None:
        return asyncio.ensure_future(model.scheduler.submit(item))
    trace.mark("QUEUE_START", queued)
    trace.record_tensors("TENSOR_QUEUE_INPUT", item.inputs)
    return asyncio.create_task(model.scheduler.submit(item), context=traced_context(trace))


def _submit_ended(task: asyncio.Task[dict[str, Array]], sink: ResponseQueue) -> None:
    """A decoupled request's execution ended: only a failure says anything (its
    responses, and the final flag, come through the sink)."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        sink.fail(failure_of(exc, executing=True))
