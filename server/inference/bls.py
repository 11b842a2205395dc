"""The core as a Python model's BLS calls reach it (the backend's `CoreCalls`).

A BLS request is built into the core's own request type and goes through
`InferenceServer.infer` (or `infer_responses` for `exec(decoupled=True)`), so it runs
through the called model's scheduler and batcher and counts in its statistics exactly as
a client's request does. Errors come back as the response's error. Calls arrive on the
backend's threads and run on the server's event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from typing import Any

from ge_serve.backends.base import ModelError
from ge_serve.backends.python.host.calls import CallControl, CoreCall, CoreResponse, Reply
from ge_serve.scheduler.correlation import END_KEY, FLAG_END, FLAG_START, ID_KEY, START_KEY

from ..errors import ErrorCode, ServerError
from ..observability.tracing import Trace
from .cancellation import Cancellation
from .core import InferenceServer
from .failures import failure_of
from .types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor

# How long a model's is_model_ready / load_model / unload_model may take.
_CONTROL_TIMEOUT_S = 600.0


class CoreBridge:
    def __init__(self, core: InferenceServer, loop: asyncio.AbstractEventLoop) -> None:
        self._core = core
        self._loop = loop

    def infer(self, call: CoreCall, reply: Reply) -> CallControl:
        cancellation = Cancellation()
        run = self._run(call, reply, cancellation)
        future = asyncio.run_coroutine_threadsafe(run, self._loop)

        def cancel() -> None:
            # A decoupled call is cancelled as Triton cancels a request: marked, its
            # responses still coming (cancellation.py). Only an iterator can cancel, so
            # a call answering once is simply stopped.
            if not call.decoupled:
                future.cancel()
                return
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
                self._loop.call_soon_threadsafe(cancellation.cancel)

        def abandon() -> None:
            future.cancel()

        return CallControl(cancel=cancel, abandon=abandon)

    async def _run(self, call: CoreCall, reply: Reply, cancellation: Cancellation) -> None:
        try:
            request = _request(call)
            try:
                self._core.lifecycle.get(call.model_name, call.model_version)
            except ServerError as exc:
                # python_backend's words for a request the core would not take
                # (request_executor.cc), around Triton's unknown-model error.
                message = f"Model {call.model_name} - Error when running inference: {exc.message}"
                reply(_failed(exc.code.value, message), True)
                return
            # Traced only as its caller's child: Triton samples only a client's requests.
            parent = call.parent_trace if isinstance(call.parent_trace, Trace) else None
            if call.decoupled:
                ended = False
                # An error response is one of the iterator's responses, and the called
                # model's later ones follow it, as python_backend's iterator gives them.
                responses = self._core.infer_responses(
                    request, True, parent, cancellation, sampled=False
                )
                async for response in responses:
                    ended = response.final
                    reply(_answer(response), ended)
                # A final flag sent on its own: the model sees an empty last response.
                if not ended:
                    reply(None, True)
            else:
                answer = await self._core.infer(request, "BLS", parent, sampled=False)
                reply(_response(answer), True)
        except asyncio.CancelledError:
            reply(_failed("CANCELLED", "the BLS request was cancelled"), True)
            raise
        except Exception as exc:
            error = failure_of(exc, executing=False)
            code, message = error.code.value, error.message
            # The error may be `exc`, whose traceback holds this frame: kept in it, the
            # pair would keep the BLS request's tensors until the collector ran.
            del error
            reply(_failed(code, message), True)

    def stopping(self) -> bool:
        return self._core.stopping()

    # --- model control ---------------------------------------------------------------------

    def model_ready(self, name: str, version: str) -> bool:
        async def ready() -> bool:
            return self._core.model_ready(name, version)

        return bool(self._wait(ready()))

    def load_model(self, name: str, config_json: str, files: dict[str, bytes]) -> None:
        self._wait(self._core.load_model(name, config_json or None, files or None))

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        self._wait(self._core.unload_model(name, unload_dependents))

    def _wait(self, coroutine: Any) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(_CONTROL_TIMEOUT_S)
        except ServerError as exc:
            raise ValueError(exc.message) from None
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ValueError("the server did not finish the call in time") from None


def _request(call: CoreCall) -> InferRequest:
    inputs = []
    for name, datatype, data in call.inputs:
        inputs.append(Tensor(name, DataType.parse(datatype), tuple(data.shape), data))
    parameters = dict(call.parameters)
    if not all(isinstance(v, bool | int | float | str) for v in parameters.values()):
        raise ServerError(ErrorCode.INVALID_ARG, "BLS request parameters must be bool, int or str")
    if call.correlation_id not in (0, "") or call.flags:
        # The sequence the model set on its InferenceRequest, in the parameters the core
        # reads a sequence from (Triton sets the request's correlation ID and flags).
        parameters[ID_KEY] = call.correlation_id
        parameters[START_KEY] = bool(call.flags & FLAG_START)
        parameters[END_KEY] = bool(call.flags & FLAG_END)
    return InferRequest(
        model_name=call.model_name,
        model_version=call.model_version,
        id=call.request_id,
        inputs=inputs,
        outputs=[RequestedOutput(name) for name in call.requested_outputs],
        parameters=parameters,
        timeout_us=max(call.timeout_us, 0),
    )


def _response(response: InferResponse) -> CoreResponse:
    return CoreResponse(
        outputs=[(tensor.name, tensor.data) for tensor in response.outputs],
        parameters=dict(response.parameters),
    )


def _answer(response: InferResponse) -> CoreResponse:
    if response.error is not None:
        return _failed(response.error.code.value, response.error.message)
    return _response(response)


def _failed(code: str, message: str) -> CoreResponse:
    return CoreResponse(error=ModelError(code, message))
