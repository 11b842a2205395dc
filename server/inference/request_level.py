"""The core's side of request-level backends (a Python model's `execute(requests)`).

Such a backend sees each request's context (id, parameters, requested outputs, whether
the client went away), may fail one request of a batch on its own (a response with an
error), and, for a decoupled model, answers through a sink: any number of responses,
each as it is produced, then the final flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping

from ge_serve.backends.base import Array, ModelError, ParamValue, RequestContext
from ge_serve.scheduler.correlation import (
    FLAG_END,
    FLAG_START,
    SEQUENCE_KEYS,
    SequenceFlags,
)

from ..errors import ErrorCode, FailureReason, ServerError
from .model import ModelVersion
from .types import InferRequest, InferResponse, RequestedOutput
from .validation import build_response

_CODES = {code.value: code for code in ErrorCode}


def request_context(
    request: InferRequest,
    sink: ResponseQueue | None = None,
    trace: object | None = None,
    sequence: SequenceFlags | None = None,
) -> RequestContext:
    """The context a request-level backend sees. The sequence parameters become the
    correlation ID and flags, as Triton's front ends lift them (a Python model reads them
    with `correlation_id()` and `flags()`, not in `parameters()`)."""
    parameters = request.parameters
    if sequence is None:
        return RequestContext(
            id=request.id,
            parameters=dict(parameters),
            requested_outputs=tuple(o.name for o in request.outputs),
            responses=sink,
            trace=trace,
            timeout_us=request.timeout_us,
        )
    return RequestContext(
        id=request.id,
        parameters={k: v for k, v in parameters.items() if k not in SEQUENCE_KEYS},
        requested_outputs=tuple(o.name for o in request.outputs),
        responses=sink,
        trace=trace,
        correlation_id=sequence.correlation_id,
        flags=(FLAG_START if sequence.start else 0) | (FLAG_END if sequence.end else 0),
        timeout_us=request.timeout_us,
    )


def model_error(error: ModelError) -> ServerError:
    """A model's error for one request, as the client sees it, with the model's code
    (UNKNOWN included: gRPC UNKNOWN, HTTP 400, as in Triton)."""
    code = _CODES.get(error.code, ErrorCode.INTERNAL)
    return ServerError(code, error.message, FailureReason.BACKEND)


def decoupled_unsupported(endpoint: str) -> ServerError:
    """Triton's answer when a one-response endpoint is asked of a decoupled model."""
    return ServerError(
        ErrorCode.UNSUPPORTED,
        f"{endpoint} doesn't support models with decoupled transaction policy",
    )


def response_of(
    request: InferRequest,
    model: ModelVersion,
    outputs: dict[str, Array],
    batch_size: int,
    parameters: Mapping[str, ParamValue] | None = None,
) -> InferResponse:
    """A response with the outputs the model produced: the requested ones, or, when none
    were named, every output of the config it gave (a Python model may leave some out),
    and the parameters the model gave it."""
    if not request.outputs:
        present = [RequestedOutput(name) for name in model.outputs if name in outputs]
        request = dataclasses.replace(request, outputs=present)
    response = build_response(request, model, outputs, batch_size)
    if parameters:
        response.parameters = dict(parameters)
    return response


def error_response(request: InferRequest, error: ServerError, final: bool) -> InferResponse:
    """A decoupled model's error response, named as the request named its model (as
    Triton names a failed stream response)."""
    return InferResponse(
        request.model_name, request.model_version, request.id, final=final, error=error
    )


_Item = tuple[dict[str, Array] | None, ServerError | None, bool, Mapping[str, ParamValue]]


class ResponseQueue:
    """A ResponseSink the backend's threads send to, read on the event loop in order.
    Nothing is taken after the final response."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._closed = False

    def send(
        self,
        outputs: dict[str, Array] | None,
        error: ModelError | None,
        final: bool,
        parameters: Mapping[str, ParamValue] | None = None,
    ) -> None:
        failure = None if error is None else model_error(error)
        item = (outputs, failure, final, parameters or {})
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
            self._loop.call_soon_threadsafe(self._put, item)

    def fail(self, error: ServerError) -> None:
        """On the loop: the request failed before the backend could answer it."""
        self._put((None, error, True, {}))

    def _put(self, item: _Item) -> None:
        if self._closed:
            return
        if item[2]:
            self._closed = True
        self._queue.put_nowait(item)

    async def get(self) -> _Item:
        return await self._queue.get()
