"""One ModelStreamInfer call: many requests in flight, answered on one response stream.

A reader task reads requests off the stream and starts one task per request; every task
is kept in a set until it ends. The handler is the single writer: it yields what the
tasks put on an output queue.

Like Triton:
- Responses of a model that is not decoupled are written in request order (each task
  waits for its predecessor's turn before it puts its response), while the requests run
  concurrently. Responses of a decoupled model are written as they are produced.
- Every streamed response carries `triton_final_response`: true on the last response of its
  request (for a decoupled model, the one its COMPLETE_FINAL flag came with). A decoupled
  request that ends with the flag on its own gets an empty final response only when the
  client sent `triton_enable_empty_final_response: true`.
- An error is an in-stream `error_message` (with the request's `id`) and the stream stays
  open, unless the client sent the `triton_grpc_error: true` header: then the first error
  ends the stream with its gRPC status. A decoupled model's error response also names the
  model and carries `triton_final_response`, and its later responses follow it.
- When the stream ends early (the client cancels it or goes away, or an error closes it),
  the tasks still in flight are cancelled, which drops their queued requests.
- When the server stops (`stop_reading()`), the stream reads no further request, answers
  those it has read, and then ends UNAVAILABLE ("Server is shutting down"): any request the
  client wrote after that point was never read, and the status says so, where OK would
  claim every request was answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

from ge_serve.protos import grpc_service_pb2 as pb

from ..errors import ServerError, decoding, shutting_down
from ..inference.core import InferenceServer
from ..inference.header_forward import HeaderForward
from ..inference.types import InferResponse
from ..observability.fronttrace import FrontTrace
from . import codec
from .errors import Undecodable, abort, as_server_error

log = logging.getLogger(__name__)

GRPC_ERROR_HEADER: Final = "triton_grpc_error"
# Backpressure: a stream reads no further request while this many are in flight, and its
# request tasks wait while this many responses are queued but not yet written; so a client
# that stops reading its responses sends no more requests. A decoupled model's own sends
# are not held back: what it sends meanwhile waits in its request's ResponseQueue.
MAX_IN_FLIGHT: Final = 1024
MAX_UNWRITTEN: Final = 128


@dataclass(frozen=True, slots=True)
class _Close:
    """Ends the stream with an error status (triton_grpc_error mode)."""

    error: ServerError


@dataclass(frozen=True, slots=True)
class _Traced:
    """A traced request's response, marked GRPC_SEND_START/END as it is written; with no
    response, the request's last item: its trace is written then."""

    front: FrontTrace
    response: pb.ModelStreamInferResponse | None = None


_END: Final = object()
_Out = pb.ModelStreamInferResponse | _Close | _Traced | object


def metadata_value(context: Any, key: str) -> str:
    """A call's metadata entry (the client's `traceparent`, say), "" when absent."""
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value.decode() if isinstance(value, bytes) else str(value)
    return ""


def wants_grpc_errors(context: Any) -> bool:
    for key, value in context.invocation_metadata() or ():
        if key.lower() == GRPC_ERROR_HEADER:
            text = value.decode() if isinstance(value, bytes) else str(value)
            return text.strip().lower() == "true"
    return False


class StreamSession:
    def __init__(
        self,
        core: InferenceServer,
        requests: AsyncIterable[pb.ModelInferRequest],
        context: Any,
        max_in_flight: int = MAX_IN_FLIGHT,
        max_unwritten: int = MAX_UNWRITTEN,
        forward: HeaderForward | None = None,
    ) -> None:
        self._core = core
        # The stream's metadata, forwarded into each of its requests (Triton: the same).
        self._forward = forward
        self._requests = requests
        self._context = context
        self._grpc_errors = wants_grpc_errors(context)
        self._out: asyncio.Queue[_Out] = asyncio.Queue()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(max_in_flight)
        self._unwritten = asyncio.Semaphore(max_unwritten)
        self._reader: asyncio.Task[None] | None = None
        self._reading = True
        self._stopped = False
        # Reading was cut short by stop_reading() before the client finished writing.
        self._cut = False
        self._ended = False
        # The turn of the last non-decoupled request: done once its response is queued.
        self._last_turn: asyncio.Future[None] | None = None

    async def run(self) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """The responses to write, until the client is done and every request answered."""
        if self._stopped:
            self._reading = False
            self._cut = True
            self._maybe_end()
        else:
            self._reader = asyncio.create_task(self._read(), name="grpc-stream-reader")
        try:
            while True:
                item = await self._out.get()
                if item is _END:
                    if self._cut:
                        await abort(self._context, shutting_down())
                    return
                if isinstance(item, _Close):
                    await self._cancel_all()
                    await abort(self._context, item.error)
                if isinstance(item, _Traced):
                    if item.response is None:
                        item.front.release()
                        continue
                    item.front.mark("GRPC_SEND_START")
                    yield item.response
                    item.front.mark("GRPC_SEND_END")
                else:
                    assert isinstance(item, pb.ModelStreamInferResponse)
                    yield item
                self._unwritten.release()
        finally:
            await self._cancel_all()
            # Traced requests whose answers were never written: their traces end here.
            while not self._out.empty():
                left = self._out.get_nowait()
                if isinstance(left, _Traced):
                    left.front.release()

    def stop_reading(self) -> None:
        """Read no more requests; the stream ends once those in flight are answered."""
        self._stopped = True
        if self._reader is not None:
            self._reader.cancel()

    # --- reading -------------------------------------------------------------------------

    async def _read(self) -> None:
        iterator = aiter(self._requests)
        try:
            while True:
                await self._slots.acquire()
                # Triton's GRPC_WAITREAD_START: the wait for the next request begins.
                waiting = time.monotonic_ns() if self._core.tracing.active else 0
                try:
                    message = await anext(iterator)
                except StopAsyncIteration:
                    self._slots.release()
                    return
                self._start(message, waiting)
        except asyncio.CancelledError:
            # stop_reading(), or the whole stream is going away
            self._cut = self._stopped
        except Exception as exc:
            log.warning("ModelStreamInfer: reading the request stream failed: %s", exc)
            self._out.put_nowait(_Close(as_server_error(exc)))
        finally:
            self._reading = False
            self._maybe_end()

    def _start(self, message: pb.ModelInferRequest | Undecodable, waiting: int = 0) -> None:
        front = None
        if waiting and self._core.tracing.active:
            front = FrontTrace("GRPC_WAITREAD_START", deferred=True, ns=waiting)
            front.mark("GRPC_WAITREAD_END")
        failure: ServerError | None = None
        if isinstance(message, Undecodable):
            # Answered in its turn like any request, with no id to give back.
            failure, message = message.error, pb.ModelInferRequest()
        decoupled = failure is None and self._is_decoupled(message)
        previous: asyncio.Future[None] | None = None
        turn: asyncio.Future[None] | None = None
        if not decoupled:
            previous = self._last_turn
            turn = asyncio.get_running_loop().create_future()
            self._last_turn = turn
        task = asyncio.create_task(self._serve(message, decoupled, previous, turn, failure, front))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _is_decoupled(self, message: pb.ModelInferRequest) -> bool:
        try:
            return self._core.is_decoupled(message.model_name, message.model_version)
        except ServerError:
            return False  # the request itself reports the error, in order

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("ModelStreamInfer: request task failed", exc_info=task.exception())
        self._maybe_end()

    def _maybe_end(self) -> None:
        if not self._reading and not self._tasks and not self._ended:
            self._ended = True
            self._out.put_nowait(_END)

    # --- answering -----------------------------------------------------------------------

    async def _serve(
        self,
        message: pb.ModelInferRequest,
        decoupled: bool,
        previous: asyncio.Future[None] | None,
        turn: asyncio.Future[None] | None,
        failure: ServerError | None = None,
        front: FrontTrace | None = None,
    ) -> None:
        try:
            if decoupled:
                await self._serve_decoupled(message, front)
                return
            if failure is not None:
                answer = self._error(message, failure)
            else:
                answer = await self._answer_once(message, front)
            if previous is not None:
                await previous
            await self._emit(answer, front)
        finally:
            if turn is not None and not turn.done():
                turn.set_result(None)
            if front is not None:
                # After the request's answers: the writer lets its trace go once they
                # are written.
                self._out.put_nowait(_Traced(front))

    def _decode(self, message: pb.ModelInferRequest, front: FrontTrace | None) -> Any:
        with decoding("inference request"):
            decoded = codec.decode_infer_request(message)
        if self._forward is not None:
            self._forward.apply(decoded.request, self._context.invocation_metadata() or ())
        if front is not None:
            decoded.request.traceparent = metadata_value(self._context, "traceparent")
            decoded.request.front = front
        return decoded

    async def _answer_once(self, message: pb.ModelInferRequest, front: FrontTrace | None) -> _Out:
        try:
            decoded = self._decode(message, front)
            response = await self._core.infer(decoded.request)
            encoded = codec.encode_infer_response(response)
            if front is not None:
                front.mark("INFER_RESPONSE_COMPLETE")
            return codec.stream_response(encoded, final=True)
        except Exception as exc:
            return self._error(message, exc)

    async def _serve_decoupled(
        self, message: pb.ModelInferRequest, front: FrontTrace | None
    ) -> None:
        try:
            decoded = self._decode(message, front)
            ended = False
            responses = self._core.infer_responses(decoded.request, errors_inline=True)
            first = front is not None
            async with contextlib.aclosing(responses):
                async for response in responses:
                    ended = response.final
                    if response.error is not None:
                        answer = self._error(message, response.error, response)
                        await self._emit(answer, front)
                        if isinstance(answer, _Close):
                            return
                        continue
                    encoded = codec.encode_infer_response(response)
                    if first and front is not None:
                        # Triton marks the first response of a stream's request.
                        front.mark("INFER_RESPONSE_COMPLETE")
                        first = False
                    await self._emit(codec.stream_response(encoded, final=ended), front)
            if decoded.enable_empty_final_response and not ended:
                await self._emit(codec.empty_final_response(message), front)
        except Exception as exc:
            await self._emit(self._error(message, exc), front)

    async def _emit(self, item: _Out, front: FrontTrace | None = None) -> None:
        """Queue an item for the writer; a response waits while too many are unwritten."""
        if not isinstance(item, _Close):
            await self._unwritten.acquire()
            if front is not None:
                assert isinstance(item, pb.ModelStreamInferResponse)
                item = _Traced(front, item)
        self._out.put_nowait(item)

    def _error(
        self, message: pb.ModelInferRequest, exc: Exception, response: InferResponse | None = None
    ) -> _Out:
        """The error's answer; `response` is a decoupled model's error response."""
        error = as_server_error(exc)
        if not isinstance(exc, ServerError):
            log.error("ModelStreamInfer: request '%s' failed", message.id, exc_info=exc)
        if self._grpc_errors:
            return _Close(error)
        if response is not None:
            return codec.stream_error_response(response, error)
        return codec.stream_error(message, error)

    async def _cancel_all(self) -> None:
        """Cancel the reader and every request in flight, and wait for them to unwind."""
        pending: list[asyncio.Task[None]] = list(self._tasks)
        if self._reader is not None:
            pending.append(self._reader)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
