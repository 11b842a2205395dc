"""`triton_python_backend_utils` (3/5): requests, responses, the response sender, BLS.

One `InferenceRequest` class serves both ways, as in Triton: `execute` receives them, and
a model builds one to call another model (BLS) with `exec()` / `async_exec()`. A BLS
call goes to the server, which runs it through the called model's scheduler exactly as it
runs a client's request; its answer comes back as an `InferenceResponse` whose error, if
any, says why it failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
import weakref
from typing import Any

from ..messages import Bls, BlsCancel, BlsRequest, Encoded, ErrorText, Respond
from .pb_tensor import Tensor
from .pb_types import (
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    TritonError,
    TritonModelException,
    code_name,
    code_of,
)
from .runtime import Decoded, Gone, Runtime, current

# An argument left out (None is refused where Triton's binding refuses it).
_DEFAULT: Any = object()


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes | bytearray) else str(value)


def _parameters(value: Any) -> dict[str, Any]:
    """A model's `parameters=`: None or a dict of str keys and bool, int or str values,
    refused with Triton's messages (PyParametersToJSON) otherwise."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TritonModelException(f"Expect dict, got {type(value)}")
    for key, item in value.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(item, bool | int | str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(item)}"
            )
    return dict(value)


def _received_parameters(text: str) -> dict[str, Any]:
    """Parameters the server sent (a client's may hold any JSON value): taken as they are."""
    value = json.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


def _no_none(where: str, **arguments: Any) -> None:
    """pybind11 refuses None for an argument that is not optional, with a TypeError."""
    for name, value in arguments.items():
        if value is None:
            raise TypeError(
                f"{where}(): incompatible constructor arguments: '{name}' may not be None"
            )


class InferenceResponse:
    def __init__(
        self,
        output_tensors: list[Tensor] | tuple[Tensor, ...] = (),
        error: TritonError | None = None,
        parameters: Any = None,
    ) -> None:
        if not isinstance(output_tensors, list | tuple):
            # Triton's is a list of Tensor objects (None included: a TypeError).
            raise TypeError(
                "InferenceResponse.__init__(): incompatible constructor arguments: "
                f"output_tensors must be a list of pb_utils.Tensor, not {type(output_tensors)}"
            )
        outputs = list(output_tensors)
        for tensor in outputs:
            if not isinstance(tensor, Tensor):
                raise TypeError(
                    "InferenceResponse.__init__(): incompatible constructor arguments: "
                    f"output_tensors must hold pb_utils.Tensor objects, not {type(tensor)}"
                )
        if error is not None and not isinstance(error, TritonError):
            error = TritonError(str(error))
        self._outputs = outputs
        self._error = error
        self._parameters = _parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def encode(self, runtime: Runtime) -> Encoded:
        parameters = json.dumps(self._parameters)
        if self._error is not None:
            error = ErrorText(code_name(self._error.code()), self._error.message())
            return Encoded([], error, parameters)
        tensors = [(t.name(), t.data()) for t in self._outputs]
        return Encoded(runtime.encode_tensors(tensors), None, parameters)


def response_from(value: Any) -> InferenceResponse:
    """What the server answered to a BLS call, as the model sees it."""
    if isinstance(value, Decoded):
        failed = value.error
        error = None if failed is None else TritonError(failed.message, code_of(failed.code))
        tensors = [Tensor(name, value.outputs[name]) for name in value.order]
        response = InferenceResponse(tensors, error)
        response._parameters = _received_parameters(value.parameters)
        return response
    if isinstance(value, Gone):
        return InferenceResponse(error=TritonError(value.reason))
    return InferenceResponse()


class InferenceResponseSender:
    """Sends a request's responses as they are ready (decoupled models, or a default-mode
    model that answers through it: then exactly one response)."""

    def __init__(self, runtime: Runtime, key: int, decoupled: bool) -> None:
        self._runtime = runtime
        self._key = key
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._sent = 0
        self.closed = False
        # A default-mode request holds its instance until its final response. Once no
        # one can send it any more (the sender is collected), it is ended here, so a
        # model that forgot to answer fails that request instead of jamming the instance;
        # a model that answers later from a thread keeps the sender, and so the request.
        self._abandoned = (
            None if decoupled else weakref.finalize(self, _end_abandoned, runtime, key)
        )

    def settled(self) -> None:
        """The request was answered otherwise (execute's return, or its error)."""
        if self._abandoned is not None:
            self._abandoned.detach()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        # Triton's CheckResponseSenderArguments: FINAL is the only flag there is.
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if response is None and not final:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException("send() takes a pb_utils.InferenceResponse")
        with self._lock:
            self._count(response is not None, final)
            encoded = None if response is None else response.encode(self._runtime)
            self._runtime.send(Respond(self._key, encoded, final))
            if final:
                self.settled()

    def returned(self) -> None:
        """execute returned a response for this request: it counts as one sent with the
        final flag (Triton's ProcessReturnedResponses), so a default-mode model that
        answered through the sender already fails its execute, and the client keeps the
        response that was sent."""
        with self._lock:
            self._count(True, True)

    def _count(self, response: bool, final: bool) -> None:
        """Triton's ResponseSender::UpdateStateAndCounters: its rules, in its order."""
        if not self._decoupled:
            if response and self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one "
                    "response."
                )
            if not response and final and not self._sent:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete "
                    "final before sending a response."
                )
        if self.closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        self._sent += 1
        if final:
            self.closed = True

    def is_cancelled(self) -> bool:
        return bool(self._runtime.request("is_cancelled", self._key))


def _end_abandoned(runtime: Runtime, key: int) -> None:
    """A final flag with no response: the server fails the request, saying none came."""
    # When the server is gone, nothing waits for the request any more.
    with contextlib.suppress(Exception):
        runtime.send(Respond(key, None, True))


class ResponseIterator:
    """A decoupled BLS call's responses, each as the called model sends it; the last is
    empty when the model ended with a flag-only final response."""

    def __init__(self, runtime: Runtime, number: int, answers: queue.SimpleQueue[Any]) -> None:
        self._runtime = runtime
        self._number = number
        self._answers = answers
        self._done = False
        # Every response, kept: a finished iterator iterated again yields them again
        # from the first (Triton's ResponseIterator::Iter rewinds).
        self._responses: list[InferenceResponse] = []
        self._index = 0
        self.started = False

    def __iter__(self) -> ResponseIterator:
        if self._done and self._index >= len(self._responses):
            self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._done:
            if self._index >= len(self._responses):
                raise StopIteration
            self._index += 1
            return self._responses[self._index - 1]
        value, final = self._answers.get()
        response = response_from(value)
        self._responses.append(response)
        if final:
            self._done = True
            self._index = len(self._responses)
        return response

    def cancel(self) -> None:
        if not self._done:
            self._runtime.send(BlsCancel(self._number))


class InferenceTrace:
    """A request's trace as its model sees it (`request.trace()`). Given as a BLS
    request's `trace`, it makes the call's trace a child of the request's, when the
    request is traced."""

    def __init__(self, key: int | None = None) -> None:
        self._key = key

    def get_context(self, mode: str = "opentelemetry") -> str | None:
        """Triton's OpenTelemetry context of the trace; the server does not hand it to
        models, so there is none."""
        return None


class InferenceRequest:
    def __init__(
        self,
        model_name: str | bytes,
        inputs: list[Tensor],
        requested_output_names: list[str],
        request_id: str = "",
        correlation_id: int | str = 0,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = _DEFAULT,
        trace: Any = _DEFAULT,
        parameters: Any = None,
    ) -> None:
        # model_name, inputs and requested_output_names have no default, and no argument
        # but parameters may be None: pybind11's TypeError, as in Triton.
        _no_none(
            "InferenceRequest.__init__",
            model_name=model_name,
            inputs=inputs,
            requested_output_names=requested_output_names,
            request_id=request_id,
            correlation_id=correlation_id,
            model_version=model_version,
            flags=flags,
            timeout=timeout,
            preferred_memory=preferred_memory,
            trace=trace,
        )
        self._model_name = _text(model_name)
        self._inputs = list(inputs)
        for tensor in self._inputs:
            if not isinstance(tensor, Tensor):
                raise TypeError(
                    "InferenceRequest.__init__(): incompatible constructor arguments: "
                    f"inputs must hold pb_utils.Tensor objects, not {type(tensor)}"
                )
        self._requested = [_text(n) for n in requested_output_names]
        self._id = _text(request_id)
        if isinstance(correlation_id, int):
            if not 0 <= correlation_id < 1 << 64:
                # Triton's is a uint64; pybind11 refuses what does not fit.
                raise TritonModelException(
                    f"correlation_id must be an unsigned 64-bit integer, got {correlation_id}"
                )
        elif not isinstance(correlation_id, str):
            raise TritonModelException("Correlation ID must be integer or string")
        # int(): a bool (an int to pybind11) travels as the number it is.
        self._correlation_id = (
            int(correlation_id) if isinstance(correlation_id, int) else correlation_id
        )
        self._model_version = int(model_version)
        self._flags = int(flags)
        self._timeout = int(timeout)
        if self._timeout < 0:
            # Triton's is an unsigned count of microseconds; a negative one is no timeout
            # at all, not "none", so it is refused rather than read as 0.
            raise TritonModelException(
                f"timeout must be microseconds >= 0 (0: none), got {self._timeout}"
            )
        self._parameters = _parameters(parameters)
        self._trace = trace if isinstance(trace, InferenceTrace) else InferenceTrace()
        # Set for a request the server handed to execute().
        self._key: int | None = None
        self._sender: InferenceResponseSender | None = None

    @classmethod
    def received(
        cls,
        key: int,
        runtime: Runtime,
        inputs: list[Tensor],
        request_id: str,
        requested: list[str],
        parameters: str,
        decoupled: bool,
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
    ) -> InferenceRequest:
        request = cls(
            runtime.model_name, inputs, requested, request_id, correlation_id,
            flags=flags, timeout=timeout,
        )  # fmt: skip
        request._parameters = _received_parameters(parameters)
        request._key = key
        request._trace = InferenceTrace(key)
        request._sender = InferenceResponseSender(runtime, key, decoupled)
        return request

    # --- what execute() reads --------------------------------------------------------------

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        """The request's sequence flags (SEQUENCE_START, SEQUENCE_END), as a BLS call
        sends them; Triton's is a uint32 setter (InferRequest::SetFlags)."""
        if not isinstance(flags, int) or not 0 <= flags < 1 << 32:
            # pybind11 refuses what is not a uint32 with a TypeError.
            raise TypeError(
                "set_flags(): incompatible function arguments: flags must be an unsigned "
                f"32-bit integer, got {flags!r}"
            )
        self._flags = int(flags)

    def timeout(self) -> int:
        return self._timeout

    def model_name(self) -> str:
        return self._model_name

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def requested_output_names(self) -> list[str]:
        return list(self._requested)

    def trace(self) -> InferenceTrace:
        return self._trace

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException("only a request given to execute() has a response sender")
        return self._sender

    @property
    def sender(self) -> InferenceResponseSender | None:
        return self._sender

    def is_cancelled(self) -> bool:
        if self._key is None:
            return False
        return bool(current().request("is_cancelled", self._key))

    def set_release_flags(self, flags: int) -> None:
        raise TritonModelException(
            "request rescheduling needs sequence_batching with iterative_sequence, which "
            "ge-serve does not support"
        )

    # --- BLS -----------------------------------------------------------------------------

    def _message(self, runtime: Runtime, number: int, decoupled: bool) -> Bls:
        if not self._model_name:
            raise TritonModelException("a BLS request needs a model_name")
        tensors = [(t.name(), t.data()) for t in self._inputs]
        version = "" if self._model_version < 0 else str(self._model_version)
        call = BlsRequest(
            self._model_name,
            version,
            self._id,
            runtime.encode_tensors(tensors),
            self._requested,
            json.dumps(self._parameters),
            self._timeout,
            self._trace._key,
            self._correlation_id,
            self._flags,
        )
        return Bls(number, call, decoupled)

    def exec(self, decoupled: bool = False) -> Any:
        """Run the request on its model and wait: the response, or with `decoupled` an
        iterator of the responses."""
        runtime = current()
        runtime.check_bls()
        number, waiter = runtime.open_call()
        runtime.send(self._message(runtime, number, decoupled))
        if decoupled:
            return ResponseIterator(runtime, number, waiter.answers)
        value, _final = waiter.answers.get()
        return response_from(value)

    def async_exec(self, decoupled: bool = False) -> asyncio.Future[Any]:
        """Like exec(), awaitable; call it from a running event loop (async execute)."""
        runtime = current()
        runtime.check_bls()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        answers: queue.SimpleQueue[Any] = queue.SimpleQueue()
        iterators: list[ResponseIterator] = []

        def settle(value: Any) -> None:
            if not future.done():
                future.set_result(value)

        def on_answer(value: Any, final: bool) -> None:
            # A decoupled call is awaited until its first answer; the iterator then
            # blocks for each further one, as Triton's does.
            if loop.is_closed():  # finalize closed the model's loop: no one awaits it
                return
            if decoupled:
                first = answers.empty() and not iterators[0].started
                answers.put((value, final))
                if first:
                    iterators[0].started = True
                    loop.call_soon_threadsafe(settle, iterators[0])
            else:
                loop.call_soon_threadsafe(settle, response_from(value))

        number = runtime.open_async_call(on_answer)
        iterators.append(ResponseIterator(runtime, number, answers))
        runtime.send(self._message(runtime, number, decoupled))
        return future
