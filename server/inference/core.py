"""The in-process API that every front end calls, and that users can call directly.

`InferenceServer` is the facade: health and metadata, the three ways into inference
(`infer`, `infer_step` for an ensemble's steps, `infer_responses` for decoupled models),
the repository, statistics, trace and log settings. The request path itself, from
admission to the observers, is infer_path.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from ge_serve.backends.config_json import as_served
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.correlation import END_KEY, ID_KEY, START_KEY
from ge_serve.scheduler.ensemble import StepCall, StepResult
from ge_serve.scheduler.ensemble_shapes import batch_reshape
from ge_serve.scheduler.work import Timings

from ..control.logsettings import LogControl
from ..control.model_control import CONTROL_DISABLED, ModelControl
from ..control.sharedmemory import SharedMemoryManager
from ..errors import ErrorCode, ServerError
from ..models.lifecycle import ModelLifecycle
from ..observability.statistics import StatisticsCollector
from ..observability.tracing import Trace, TraceControl, current_trace
from .cancellation import Cancellation
from .infer_path import InferPath
from .model import ModelVersion, TensorSpec
from .reports import ModelMetadata, ModelStatistics, RepositoryEntry, ServerMetadata, TensorMetadata
from .responsecache import ResponseCache
from .types import DataType, InferRequest, InferResponse, ParamValue, Tensor

SERVER_NAME = "triton"
SERVER_VERSION = "2.51.0"


@dataclass(slots=True)
class ServerInfo:
    name: str = SERVER_NAME
    version: str = SERVER_VERSION
    extensions: tuple[str, ...] = (
        "classification",
        "sequence",
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
        # Every request's way from admission to its response (infer_path.py).
        self.path = InferPath(lifecycle, self.shared_memory, cache, self.stats)
        # Told how each request ended; statistics first, metrics join them.
        self.observers = self.path.observers
        lifecycle.steps.runner = self.infer_step
        lifecycle.steps.streamer = self.infer_step_responses
        self._live = True
        self._draining = False

    # --- health and metadata -------------------------------------------------------------

    def live(self) -> bool:
        return self._live

    def fail_initialization(self) -> None:
        """Not live and not ready from now on: the server could not initialize (its
        model repository is missing) and runs on only because --exit-on-error=false."""
        self._live = False

    def ready(self) -> bool:
        if not self.accepting():
            return False
        return self.lifecycle.all_ready() if self.strict_readiness else True

    def begin_draining(self) -> None:
        """Report not ready from now on, so that balancers send new work elsewhere, while
        the requests the front ends have taken in are still served."""
        self._draining = True

    def stopping(self) -> bool:
        """Whether the server's stop has begun (begin_draining)."""
        return self._draining

    def stop_accepting(self) -> None:
        self.path.accepting = False

    def end_running(self) -> int:
        """At a stopping server's exit timeout: refuse every request from now on, and end
        the ones still running with UNAVAILABLE, so that the front ends answer them before
        they close (cutoff.py). Returns how many were running."""
        self.stop_accepting()
        return self.path.cutoff.cut()

    def metadata(self) -> ServerMetadata:
        # Triton lists system_shared_memory whether --allow-client-shm is on or not.
        return ServerMetadata(self.info.name, self.info.version, self.info.extensions)

    def accepting(self) -> bool:
        """Whether the server takes requests: live and not stopping (Triton's
        SERVER_READY, which strict readiness does not touch)."""
        return self._live and not self._draining and self.path.accepting

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
        """The config as loaded (auto-completed), with the defaults Triton's core fills in
        (`as_served`); each front end prints it its own way."""
        return as_served(self.lifecycle.get(name, version).config)

    # --- inference -----------------------------------------------------------------------

    async def infer(
        self,
        request: InferRequest,
        endpoint: str = "infer",
        parent: Trace | None = None,
        sampled: bool = True,
    ) -> InferResponse:
        """One request, one response. `endpoint` names the caller in a decoupled model's
        error (Triton's "HTTP end point"); `parent`: the trace of a BLS call's caller;
        `sampled`: whether the request may be traced on its own (a client's), not only
        as `parent`'s child (a BLS call, as in Triton)."""
        path = self.path
        path.admit(request)
        started = time.monotonic_ns()
        model = path.serving(request.model_name, request.model_version, endpoint)
        trace = None
        if self.tracing.active:
            trace = self._begin(model, request, started, parent, sampled)
        response, _ = await path.run(request, model, started, trace)
        return response

    def _begin(
        self,
        model: ModelVersion,
        request: InferRequest,
        started: int,
        parent: Trace | None,
        sampled: bool,
    ) -> Trace | None:
        if parent is None and not sampled:
            return None
        return self.tracing.begin(
            model.name,
            model.version,
            request.id,
            request.traceparent,
            started,
            parent,
            request.front,
        )

    async def infer_step(self, call: StepCall) -> StepResult:
        """One step of an ensemble request, as a request to the step's model: its scheduler
        (so steps batch), its statistics and metrics. The arrays pass as they are; a step
        in flight finishes even once the server stops accepting new requests. The step
        request names the ensemble request's sequence as a client's request would."""
        started = time.monotonic_ns()
        model = self.path.serving(call.model_name, call.model_version, "An ensemble step")
        request = _step_request(call, model)
        trace = self._step_trace(model)
        response, item = await self.path.run(request, model, started, trace)
        outputs = {tensor.name: tensor.data for tensor in response.outputs}
        batch = _step_batch(request, model)
        return StepResult(outputs, item.timings, response.parameters, batch_size=batch)

    async def infer_step_responses(self, call: StepCall) -> AsyncGenerator[StepResult, None]:
        """A decoupled step of an ensemble: each response of the step request as it comes,
        through the model's decoupled path (its statistics count the request once). An
        error response of the step raises, failing the ensemble's request, as in Triton."""
        model = self.lifecycle.get(call.model_name, call.model_version)
        if not model.decoupled:  # reloaded as a model that answers once
            yield await self.infer_step(call)
            return
        request = _step_request(call, model)
        batch = _step_batch(request, model)
        trace = self._step_trace(model)
        release = call.releases.hold() if call.releases is not None else None
        try:
            # Closed with this generator, not later by the loop's finalizer: the step's
            # request ends (and is counted) when its ensemble request does.
            responses = self.path.responses(
                request,
                model,
                admitted=True,
                trace=trace,
                released=release.done if release is not None else None,
            )
            async with contextlib.aclosing(responses):
                async for response in responses:
                    outputs = {tensor.name: tensor.data for tensor in response.outputs}
                    parameters, final = response.parameters, response.final
                    yield StepResult(outputs, Timings(), parameters, final, batch)
        except BaseException:
            if release is not None:
                release.drop()  # failed before its release was set up, or released already
            raise

    def _step_trace(self, model: ModelVersion) -> Trace | None:
        """An ensemble step's trace: a child of its ensemble request's, when that is
        traced (it is current in the ensemble's task)."""
        parent = current_trace() if self.tracing.active else None
        return self.tracing.child(parent, model.name, model.version, "") if parent else None

    def is_decoupled(self, name: str, version: str = "") -> bool:
        """Whether the model may answer a request with zero or several responses (Triton's
        `model_transaction_policy { decoupled: true }`)."""
        return self.lifecycle.get(name, version).decoupled

    async def infer_responses(
        self,
        request: InferRequest,
        errors_inline: bool = False,
        parent: Trace | None = None,
        cancellation: Cancellation | None = None,
        sampled: bool = True,
    ) -> AsyncGenerator[InferResponse, None]:
        """Every response one request produces, each as soon as it is produced.

        The seam for decoupled models. A model that is not decoupled yields exactly one
        response. A decoupled backend may yield zero or more, and the iterator ending is
        Triton's COMPLETE_FINAL flag sent on its own; a streaming front end marks each
        response `triton_final_response: false` and, when the client asked for it, sends an
        empty final response when the iterator ends. Every backend but a request-level one
        (Python) answers a request once, so this yields `infer()`'s response.

        A decoupled model's error response raises, ending the iteration, unless
        `errors_inline`: then it is a response with `error` set, and the responses after
        it follow (Triton's stream, `/generate_stream` and BLS deliver them all).
        `parent`: the trace of a BLS call's caller; `cancellation`: how that caller may
        cancel the call (cancellation.py); `sampled`: as for `infer`.
        """
        model = self.lifecycle.get(request.model_name, request.model_version)
        if not model.decoupled:
            response = await self.infer(request, parent=parent, sampled=sampled)
            response.final = True  # its one response comes with the final flag
            yield response
            return
        trace = None
        if self.tracing.active:
            trace = self._begin(model, request, time.monotonic_ns(), parent, sampled)
        responses = self.path.responses(
            request, model, errors_inline, trace=trace, cancellation=cancellation
        )
        async with contextlib.aclosing(responses):  # as in infer_step_responses
            async for response in responses:
                yield response

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

    async def unload_model(
        self, name: str, unload_dependents: bool = False, forget: bool = False
    ) -> None:
        if self.control is None:
            raise ServerError(ErrorCode.UNAVAILABLE, CONTROL_DISABLED)
        await self.control.unload(name, unload_dependents, forget)

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


def _step_request(call: StepCall, model: ModelVersion) -> InferRequest:
    """A step's request: the ensemble request's ID and parameters, and the sequence the
    step is in, named as a client's request would name it. A tensor made without batching
    gets a batch dimension of 1 into a model that batches, and one made with a batch of 1
    loses it into a model that does not, where its shape says so (ensemble_shapes.py)."""
    inputs = []
    batching = model.max_batch_size > 0
    for name, array in call.inputs.items():
        spec = model.inputs.get(name)
        datatype = spec.datatype if spec is not None else DataType.from_numpy(array.dtype)
        made = call.batch_sizes.get(name)
        if spec is not None and made is not None:
            shape = batch_reshape(spec.dims, batching, made, array.shape)
            if shape != array.shape:
                array = array.reshape(shape)
        inputs.append(Tensor(name, datatype, tuple(array.shape), array))
    sequence = call.sequence
    parameters: dict[str, ParamValue] = dict(call.parameters)
    if sequence.in_sequence or sequence.start or sequence.end:
        parameters[ID_KEY] = sequence.correlation_id
        parameters[START_KEY] = sequence.start
        parameters[END_KEY] = sequence.end
    return InferRequest(
        model_name=call.model_name,
        model_version=call.model_version,
        id=call.request_id,
        inputs=inputs,
        parameters=parameters,
        priority=call.priority,
        timeout_us=call.timeout_us,
    )


def _step_batch(request: InferRequest, model: ModelVersion) -> int:
    """A step request's batch size, as Triton's request has it: 0 for a model that does
    not batch, else its inputs' first dimension."""
    if model.max_batch_size <= 0 or not request.inputs or not request.inputs[0].shape:
        return 0
    return request.inputs[0].shape[0]


def _platform(model: ModelVersion) -> str:
    if model.config.platform:
        return str(model.config.platform)
    return {"onnxruntime": "onnxruntime_onnx", "ge": "npu_ge"}.get(model.backend, model.backend)
