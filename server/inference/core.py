"""The in-process API that every front end calls, and that users can call directly."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from ge_serve.backends.base import ShapeRejected
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.ensemble import StepCall
from ge_serve.scheduler.work import Array, Timings, WorkItem

from ..control.logsettings import LogControl
from ..control.model_control import CONTROL_DISABLED, ModelControl
from ..control.sharedmemory import SharedMemoryManager
from ..errors import (
    ErrorCode,
    FailureReason,
    SchedulerClosed,
    ServerError,
    request_cancelled,
    shutting_down,
)
from ..models.lifecycle import ModelLifecycle
from ..observability.statistics import StatisticsCollector
from ..observability.tracing import Trace, TraceControl, current_trace, submit_traced
from .model import ModelVersion, TensorSpec
from .reports import ModelMetadata, ModelStatistics, RepositoryEntry, ServerMetadata, TensorMetadata
from .request_level import (
    ResponseQueue,
    decoupled_unsupported,
    model_error,
    request_context,
    response_of,
)
from .responsecache import Lookup, ResponseCache, enabled_for
from .types import DataType, InferRequest, InferResponse, SharedMemoryRef, Tensor, check_shape
from .validation import build_response, prepare
from .wire import tensor_to_raw

# How often a request refused by a retiring version is retried on its replacement.
_SWAP_RETRIES = 3

SERVER_NAME = "triton"
SERVER_VERSION = "2.51.0"


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


@dataclass(slots=True)
class ServerInfo:
    name: str = SERVER_NAME
    version: str = SERVER_VERSION
    extensions: tuple[str, ...] = (
        "classification",
        "model_repository",
        "model_repository(unload_dependents)",
        "model_configuration",
        "binary_tensor_data",
        "parameters",
        "schedule_policy",
        "statistics",
        "logging",
        "system_shared_memory",
        "trace",
    )


class InferenceServer:
    """Health, metadata, config and inference over the model lifecycle.

    Nothing here knows HTTP, gRPC or JSON; the front ends encode what comes back.
    """

    def __init__(
        self,
        lifecycle: ModelLifecycle,
        info: ServerInfo | None = None,
        strict_readiness: bool = True,
        control: ModelControl | None = None,
        log_control: LogControl | None = None,
        shared_memory: SharedMemoryManager | None = None,
        cache: ResponseCache | None = None,
        tracing: TraceControl | None = None,
    ) -> None:
        self.lifecycle = lifecycle
        # --cache-config: the response cache of the models that enable it.
        self.cache = cache
        # The trace extension; inactive (one attribute read a request) unless enabled.
        self.tracing = tracing or TraceControl()
        # Client-registered shared-memory regions; both front ends answer the extension's
        # calls from it, and infer() maps the tensors that live there.
        self.shared_memory = shared_memory or SharedMemoryManager()
        self.control = control
        self.info = info or ServerInfo()
        self.strict_readiness = strict_readiness
        self.stats = StatisticsCollector(lifecycle)
        self.log_control = log_control or LogControl()
        self.observers: list[InferObserver] = [self.stats]
        lifecycle.step_runner = self.infer_step
        self._live = True
        self._draining = False
        self._accepting = True

    # --- health and metadata -------------------------------------------------------------

    def live(self) -> bool:
        return self._live

    def ready(self) -> bool:
        if not self._live or self._draining or not self._accepting:
            return False
        return self.lifecycle.all_ready() if self.strict_readiness else True

    def begin_draining(self) -> None:
        """Report not ready from now on, so that balancers send new work elsewhere, while
        the requests the front ends have taken in are still served."""
        self._draining = True

    def stop_accepting(self) -> None:
        self._accepting = False

    def metadata(self) -> ServerMetadata:
        extensions = self.info.extensions
        if not self.shared_memory.enabled:
            extensions = tuple(e for e in extensions if e != "system_shared_memory")
        return ServerMetadata(self.info.name, self.info.version, extensions)

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.lifecycle.is_ready(name, version)

    def model(self, name: str, version: str = "") -> ModelVersion:
        return self.lifecycle.get(name, version)

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        model = self.lifecycle.get(name, version)
        record = self.lifecycle.models[self.lifecycle.resolve(name)]
        versions = tuple(v for v in sorted(record.versions) if record.versions[v].model)
        lead = (-1,) if model.max_batch_size > 0 else ()

        def describe(specs: dict[str, TensorSpec]) -> tuple[TensorMetadata, ...]:
            return tuple(TensorMetadata(s.name, s.datatype, lead + s.dims) for s in specs.values())

        return ModelMetadata(
            name=model.name,
            versions=versions,
            platform=_platform(model),
            inputs=describe(model.inputs),
            outputs=describe(model.outputs),
        )

    def model_config(self, name: str, version: str = "") -> model_config_pb2.ModelConfig:
        """The config as loaded (auto-completed); each front end prints it its own way."""
        return self.lifecycle.get(name, version).config

    # --- inference -----------------------------------------------------------------------

    async def infer(
        self, request: InferRequest, endpoint: str = "infer", parent: Trace | None = None
    ) -> InferResponse:
        """One request, one response. `endpoint` names the caller in a decoupled model's
        error (Triton's "HTTP end point"); `parent`: the trace of a BLS call's caller."""
        if not self._accepting:
            raise shutting_down()
        # The front ends check shapes as they decode; this is for in-process callers,
        # before any shape reaches numpy (shared memory views are shaped below).
        for tensor in request.inputs:
            check_shape(tensor.shape, tensor.name, tensor.datatype.itemsize)
        started = time.monotonic_ns()
        model = self.lifecycle.get(request.model_name, request.model_version)
        if model.decoupled:
            raise decoupled_unsupported(endpoint)
        trace = None
        if self.tracing.active:
            trace = self.tracing.begin(
                model.name, model.version, request.id, request.traceparent, started, parent
            )
        response, _ = await self._infer(request, model, started, trace)
        return response

    async def infer_step(self, call: StepCall) -> tuple[dict[str, Array], Timings]:
        """One step of an ensemble request, as a request to the step's model: its scheduler
        (so steps batch), its statistics and metrics. The arrays pass as they are; a step
        in flight finishes even once the server stops accepting new requests."""
        started = time.monotonic_ns()
        model = self.lifecycle.get(call.model_name, call.model_version)
        if model.decoupled:
            raise decoupled_unsupported("An ensemble step")
        inputs = []
        for name, array in call.inputs.items():
            spec = model.inputs.get(name)
            datatype = spec.datatype if spec is not None else DataType.from_numpy(array.dtype)
            inputs.append(Tensor(name, datatype, tuple(array.shape), array))
        request = InferRequest(
            model_name=call.model_name,
            model_version=call.model_version,
            inputs=inputs,
            priority=call.priority,
            timeout_us=call.timeout_us,
        )
        parent = current_trace() if self.tracing.active else None
        trace = self.tracing.child(parent, model.name, model.version, "") if parent else None
        response, item = await self._infer(request, model, started, trace)
        return {tensor.name: tensor.data for tensor in response.outputs}, item.timings

    async def _infer(
        self, request: InferRequest, model: ModelVersion, started: int, trace: Trace | None
    ) -> tuple[InferResponse, WorkItem]:
        # Like Triton's front ends, shared-memory references are resolved before the
        # request is counted; the views keep their regions mapped until the request ends.
        shm_outputs = self._map_shared_memory(request)
        item: WorkItem | None = None
        outputs: dict[str, Array] | None = None
        cached: Lookup | None = None
        try:
            for _ in range(_SWAP_RETRIES):
                if model.retiring:
                    model = self._replacement(request, model)
                item = prepare(request, model)
                item.enqueue_ns = started
                if model.loaded.per_request:
                    item.context = request_context(request, trace=trace)
                cached = self._cache_lookup(model, item, bool(shm_outputs))
                if cached is not None and cached.found is not None:
                    outputs = cached.found.outputs
                    if item.context is not None:
                        item.context.response_parameters = cached.found.parameters
                    break
                try:
                    if trace is None:
                        outputs = await model.scheduler.submit(item)
                    else:
                        outputs = await submit_traced(model.scheduler, item, trace)
                    break
                except SchedulerClosed:
                    # Refused before it ran: the version was swapped out under us.
                    model = self._replacement(request, model)
            else:
                raise ServerError(ErrorCode.UNAVAILABLE, "model is being reloaded, retry")
            if item.context is not None:
                if item.context.error is not None:
                    raise model_error(item.context.error)
                parameters = item.context.response_parameters
                response = response_of(request, model, outputs, item.batch_size, parameters)
            else:
                response = build_response(request, model, outputs, item.batch_size)
            if cached is not None and cached.found is None and self.cache is not None:
                context = item.context
                kept = self.cache.insert(
                    cached, outputs, context.response_parameters if context else {}
                )
                self.stats.cache_miss(model, kept)
            if shm_outputs:
                self._write_shared_memory(response, shm_outputs)
        except ServerError as exc:
            self._notify(model, item, exc, started, trace=trace)
            raise
        except asyncio.CancelledError:
            if item is not None and item.context is not None:
                item.context.cancelled = True
            self._notify(model, item, request_cancelled(), started, trace=trace)
            raise
        except Exception as exc:
            # Anything unexpected out of the scheduler is the model's execution failing.
            during_execution = item is not None and outputs is None
            reason = FailureReason.BACKEND if during_execution else FailureReason.OTHER
            error = ServerError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}", reason)
            if isinstance(exc, ShapeRejected):  # shapes the model cannot run: the input's fault
                error = ServerError(ErrorCode.INVALID_ARG, str(exc), FailureReason.OTHER)
            self._notify(model, item, error, started, trace=trace)
            raise error from exc
        hit = cached.lookup_ns if cached is not None and cached.found is not None else None
        self._notify(model, item, None, started, hit, trace)
        assert item is not None
        return response, item

    def _cache_lookup(
        self, model: ModelVersion, item: WorkItem, shm_outputs: bool
    ) -> Lookup | None:
        """The response cache's answer for a request of a model that enables it; None when
        the request bypasses the cache (no cache, outputs into shared memory)."""
        if self.cache is None or shm_outputs or not enabled_for(model):
            return None
        return self.cache.lookup(model, item.inputs)

    def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the model may answer a request with zero or several responses (Triton's
        `model_transaction_policy { decoupled: true }`)."""
        model = self.lifecycle.get(name, version)
        return bool(model.config.model_transaction_policy.decoupled)

    async def infer_responses(self, request: InferRequest) -> AsyncGenerator[InferResponse, None]:
        """Every response one request produces, each as soon as it is produced.

        The seam for decoupled models. A model that is not decoupled yields exactly one
        response. A decoupled backend may yield zero or more, and the iterator ending is
        Triton's COMPLETE_FINAL flag sent on its own; a streaming front end marks each
        response `triton_final_response: false` and, when the client asked for it, sends an
        empty final response when the iterator ends. Every backend but a request-level one
        (Python) answers a request once, so this yields `infer()`'s response.
        """
        model = self.lifecycle.get(request.model_name, request.model_version)
        if not model.decoupled:
            yield await self.infer(request)
            return
        async for response in self._infer_decoupled(request, model):
            yield response

    async def _infer_decoupled(
        self, request: InferRequest, model: ModelVersion
    ) -> AsyncIterator[InferResponse]:
        """A decoupled model's responses: the request runs through the scheduler like any
        other (its execution may end long before its responses do), and each response
        the backend sends comes out as it arrives, until the final flag."""
        if not self._accepting:
            raise shutting_down()
        for tensor in request.inputs:
            check_shape(tensor.shape, tensor.name, tensor.datatype.itemsize)
        if any(o.shm is not None for o in request.outputs):
            raise ServerError(
                ErrorCode.UNSUPPORTED,
                "shared-memory outputs are not supported for decoupled models",
            )
        started = time.monotonic_ns()
        self._map_shared_memory(request)
        sink = ResponseQueue(asyncio.get_running_loop())
        item: WorkItem | None = None
        submitted: asyncio.Task[dict[str, Array]] | None = None
        try:
            item = prepare(request, model)
            item.enqueue_ns = started
            item.context = request_context(request, sink)
            submitted = asyncio.ensure_future(model.scheduler.submit(item))
            submitted.add_done_callback(lambda task: _submit_ended(task, sink))
            while True:
                outputs, error, final, parameters = await sink.get()
                if error is not None:
                    raise error
                if outputs is not None:
                    response = response_of(request, model, outputs, item.batch_size, parameters)
                    response.final = final
                    yield response
                if final:
                    break
        except ServerError as exc:
            self._notify(model, item, exc, started)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away: a model that asks is_cancelled() learns it.
            if item is not None and item.context is not None:
                item.context.cancelled = True
            if submitted is not None and not submitted.done():
                submitted.cancel()
            self._notify(model, item, request_cancelled(), started)
            raise
        self._notify(model, item, None, started)

    def _map_shared_memory(
        self, request: InferRequest
    ) -> dict[str, tuple[SharedMemoryRef, memoryview]]:
        """Give inputs that live in shared memory their zero-copy views, and return where
        each shared-memory output goes."""
        shm = self.shared_memory
        for tensor in request.inputs:
            if tensor.shm is not None:
                tensor.data = shm.input_array(
                    tensor.shm, tensor.datatype, tensor.shape, tensor.name, request.model_name
                )
        return {o.name: (o.shm, shm.window(o.shm)) for o in request.outputs if o.shm is not None}

    @staticmethod
    def _write_shared_memory(
        response: InferResponse, targets: dict[str, tuple[SharedMemoryRef, memoryview]]
    ) -> None:
        for tensor in response.outputs:
            target = targets.get(tensor.name)
            if target is not None:
                ref, window = target
                SharedMemoryManager.write_output(window, tensor_to_raw(tensor), tensor.name)
                tensor.shm = ref

    def _replacement(self, request: InferRequest, old: ModelVersion) -> ModelVersion:
        """The version that now serves this request after `old` was retired."""
        model = self.lifecycle.get(request.model_name, request.model_version)
        if model is old:
            raise ServerError(ErrorCode.UNAVAILABLE, "model version is being unloaded")
        return model

    def _notify(
        self,
        model: ModelVersion,
        item: WorkItem | None,
        error: ServerError | None,
        started: int,
        cache_hit_ns: int | None = None,
        trace: Trace | None = None,
    ) -> None:
        """Every observer learns how the request ended; one answered from the response
        cache is counted by statistics as a hit, not as an inference. A trace ends here."""
        finished = time.monotonic_ns()
        if trace is not None:
            trace.end(finished)
        for observer in self.observers:
            if cache_hit_ns is not None and observer is self.stats:
                self.stats.cache_hit(model, cache_hit_ns, started, finished)
            else:
                observer.request_done(model, item, error, started, finished)

    # --- repository ----------------------------------------------------------------------

    async def repository_index(self, ready_only: bool = False) -> list[RepositoryEntry]:
        """The repository index; the folder scan runs off the event loop."""
        scanned: list[str] = []
        if not ready_only:
            with contextlib.suppress(ServerError):
                scanned = list(await asyncio.to_thread(self.lifecycle.repository.scan))
        return self.lifecycle.index(ready_only, scanned)

    async def load_model(
        self, name: str, config_json: str | None = None, files: dict[str, bytes] | None = None
    ) -> None:
        """Load or reload a model, optionally with a JSON config and file overrides.

        `files` maps `<version>/<file>` (the part after `file:`; a `file:` prefix is also
        accepted) to the raw, already base64-decoded content.
        """
        if self.control is None:
            raise ServerError(ErrorCode.UNAVAILABLE, CONTROL_DISABLED)
        await self.control.load(name, config_json, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        if self.control is None:
            raise ServerError(ErrorCode.UNAVAILABLE, CONTROL_DISABLED)
        await self.control.unload(name, unload_dependents)

    # --- statistics and logging -----------------------------------------------------------

    def statistics(self, name: str = "", version: str = "") -> tuple[ModelStatistics, ...]:
        """Triton's statistics extension: every model's, one model's or one version's,
        by name then version."""
        return self.stats.statistics(name, version)

    def trace_settings(self, model: str = "") -> dict[str, str | list[str]]:
        """Triton's trace extension: the global settings, or one model's."""
        self._trace_model(model)
        return self.tracing.settings(model)

    def update_trace_settings(
        self, model: str, changes: dict[str, list[str] | None]
    ) -> dict[str, str | list[str]]:
        self._trace_model(model)
        return self.tracing.update(model, changes)

    def _trace_model(self, model: str) -> None:
        if model and not self.lifecycle.is_ready(model):
            raise ServerError(ErrorCode.INVALID_ARG, f"Request for unknown model : {model}")

    def log_settings(self) -> dict[str, Any]:
        """Triton's logging extension: log_file, log_info, log_warning, log_error,
        log_verbose_level, log_format."""
        return self.log_control.settings()

    def update_log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply the given settings (the rest stay) and return all of them."""
        return self.log_control.update(changes)


def _submit_ended(task: asyncio.Task[dict[str, Array]], sink: ResponseQueue) -> None:
    """A decoupled request's execution ended: only a failure says anything (its
    responses, and the final flag, come through the sink)."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is None:
        return
    if isinstance(exc, ServerError):
        sink.fail(exc)
    else:
        sink.fail(ServerError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}"))


def _platform(model: ModelVersion) -> str:
    if model.config.platform:
        return str(model.config.platform)
    return {"onnxruntime": "onnxruntime_onnx", "ge": "npu_ge"}.get(model.backend, model.backend)
