"""Triton's trace extension: which requests are traced, the timestamps they collect, and
where finished traces go.

A request is traced when its model's settings (a model's own, else the global ones) have
a level and the sampling rate picks it (every `rate`-th request, while `count` lasts), or,
in OpenTelemetry mode, when the client sent a valid W3C `traceparent`. Settings change at run
time through the extension (`update`).

The core checks `TraceControl.active` (one attribute) before anything else, so a server
that traces nothing pays only that per request. A traced request collects Triton's
timestamps: REQUEST_START, QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END,
COMPUTE_OUTPUT_START, COMPUTE_END, REQUEST_END, in the steady clock's nanoseconds (the
compute points are placed from the durations the executor measured). Ensemble steps run
inside the ensemble request's task, so the trace reaches them through a context variable
and each step's trace names the ensemble's as its parent. A Python model's BLS call runs
in a task of its own: the model names the request it calls for (`trace=request.trace()`,
as in Triton), and the call's trace becomes that request's child. Only a client's request
is sampled: a BLS call whose caller is not traced is not traced either, as in Triton.

The HTTP and gRPC front ends add Triton's timestamps of their own (`FrontTrace`):
HTTP_RECV_START/END, or GRPC_WAITREAD_START/END, then INFER_RESPONSE_COMPLETE and
HTTP_SEND_START/END or GRPC_SEND_START/END. A front end makes a `FrontTrace` only while
tracing is active, and hands it to the core with the request; when the core samples the
request, the trace waits for the front end to let it go (after its send marks) before it
is written, as Triton writes a trace when its last holder releases it.

Finished traces go to Triton's trace file format (triton mode, tracefile.py) or become
OpenTelemetry spans exported over OTLP (otel.py). Everything here runs on the event loop.
"""

from __future__ import annotations

import contextvars
import dataclasses
import itertools
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ge_serve.scheduler.work import Timings

from ..errors import ErrorCode, ServerError, invalid_arg
from .fronttrace import FrontTrace
from .traceconfig import OPENTELEMETRY, TRITON, TraceSettings

# W3C trace context: a valid `traceparent` (not version ff, ids not all zero) forces a
# trace, as in Triton; a malformed one would not make the span a child, so it does not.
_TRACEPARENT = re.compile(
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
)
_CURRENT: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("trace", default=None)
_INT32_MAX = 2**31 - 1
_UINT32_MAX = 2**32 - 1


class TraceSink(Protocol):
    def started(self, trace: Trace) -> None: ...

    def finished(self, trace: Trace) -> None: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class Trace:
    id: int
    model_name: str
    model_version: int
    request_id: str
    level: tuple[str, ...]
    mode: str
    parent: Trace | None = None
    traceparent: str = ""
    marks: list[tuple[str, int]] = field(default_factory=list)
    # (activity, name, datatype, shape, data) for the TENSORS level.
    tensors: list[tuple[str, str, str, tuple[int, ...], str]] = field(default_factory=list)
    # What the sink keeps while the trace is open (OpenTelemetry spans).
    spans: Any = None
    sink: TraceSink | None = None
    # Who still holds the trace: the core until its request ends, and a front end that
    # traces its own timestamps until it has sent the answer. Written when none does.
    holds: int = 1

    @property
    def parent_id(self) -> int:
        return self.parent.id if self.parent is not None else 0

    def mark(self, name: str, ns: int | None = None) -> None:
        self.marks.append((name, time.monotonic_ns() if ns is None else ns))

    def executed(self, queued_ns: int, timings: Timings, enqueue_ns: int) -> None:
        """The compute points, from when the execution began and the durations the
        executor measured. Where no execution stamped its start (an ensemble's), a
        scheduler counts `queue_ns` from the item's `enqueue_ns` (the core sets it to the
        request's start), so the compute starts there plus `queue_ns`; counted from
        QUEUE_START instead it would land late, past REQUEST_END for a fast model. Never
        before QUEUE_START: an ensemble has no queue of its own."""
        start = max(queued_ns, timings.compute_start_ns or enqueue_ns + timings.queue_ns)
        input_end = start + timings.compute_input_ns
        output_start = input_end + timings.compute_infer_ns
        self.marks += [
            ("COMPUTE_START", start),
            ("COMPUTE_INPUT_END", input_end),
            ("COMPUTE_OUTPUT_START", output_start),
            ("COMPUTE_END", output_start + timings.compute_output_ns),
        ]

    def record_tensors(self, activity: str, arrays: Mapping[str, Any]) -> None:
        if "TENSORS" not in self.level:
            return
        for name, array in arrays.items():
            values = np.asarray(array)
            flat = values.reshape(-1).tolist()
            text = ",".join(
                v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat
            )
            shape = tuple(int(d) for d in values.shape)
            self.tensors.append((activity, name, _dtype_name(values), shape, text))

    def end(self, ns: int | None = None) -> None:
        self.mark("REQUEST_END", ns)
        self.release()

    def release(self) -> None:
        self.holds -= 1
        if self.holds == 0 and self.sink is not None:
            self.sink.finished(self)


def front_end_mark(name: str) -> bool:
    """Whether a timestamp is a front end's (Triton puts them on the request's root span)."""
    return name.startswith(("HTTP_", "GRPC_")) or name == "INFER_RESPONSE_COMPLETE"


def _dtype_name(values: Any) -> str:
    from ..inference.types import DataType

    try:
        return DataType.from_numpy(values.dtype).value
    except ServerError:
        return str(values.dtype)


def traced_context(trace: Trace) -> contextvars.Context:
    """A copy of the running context with `trace` current: for a task that runs a traced
    request's execution apart from the task that reads its responses (decoupled)."""
    context = contextvars.copy_context()
    context.run(_CURRENT.set, trace)
    return context


def current_trace() -> Trace | None:
    """The trace of the request whose task is running (an ensemble's, for its steps)."""
    return _CURRENT.get()


async def submit_traced(scheduler: Any, item: Any, trace: Trace) -> Any:
    """`scheduler.submit(item)` with the trace's queue and compute timestamps, and the
    trace current for whatever the scheduler runs in this task (ensemble steps)."""
    queued = time.monotonic_ns()
    trace.mark("QUEUE_START", queued)
    trace.record_tensors("TENSOR_QUEUE_INPUT", item.inputs)
    token = _CURRENT.set(trace)
    try:
        outputs = await scheduler.submit(item)
    finally:
        _CURRENT.reset(token)
    trace.executed(queued, item.timings, item.enqueue_ns)
    trace.record_tensors("TENSOR_BACKEND_OUTPUT", outputs)
    return outputs


@dataclass(slots=True)
class _Sampler:
    """Every `rate`-th request, while `count` lasts (-1: no limit)."""

    seen: int = 0
    remaining: int = -1


_NAMES = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file")


class TraceControl:
    """The trace settings (global and per model), sampling, and the finished traces' sink."""

    def __init__(self, startup: TraceSettings | None = None, sink: TraceSink | None = None):
        self.startup = startup or TraceSettings()
        self._global = self.startup
        # A model's own settings: only the fields it set; the rest follow the global ones.
        self._models: dict[str, dict[str, Any]] = {}
        self._samplers: dict[str, _Sampler] = {"": _Sampler(remaining=self.startup.count)}
        self._ids = itertools.count(1)
        self.sink = sink
        self.active = _can_trace(self.startup)

    # --- sampling (hot path once active) ---------------------------------------------------

    def settings_for(self, model: str) -> TraceSettings:
        own = self._models.get(model)
        return dataclasses.replace(self._global, **own) if own else self._global

    def begin(
        self,
        model: str,
        version: int,
        request_id: str,
        traceparent: str,
        started_ns: int,
        parent: Trace | None = None,
        front: FrontTrace | None = None,
    ) -> Trace | None:
        """A trace for this request, or None when it is not sampled. A request made for a
        traced one (`parent`, a BLS call) is always traced, as its child. `front`: the
        front end's timestamps, which the trace then waits for."""
        if parent is not None:
            return self.child(parent, model, version, request_id, started_ns)
        settings = self.settings_for(model)
        if not _can_trace(settings):
            return None
        forced = (
            bool(traceparent)
            and settings.mode == OPENTELEMETRY
            and _TRACEPARENT.fullmatch(traceparent) is not None
        )
        sampler = self._samplers.get(model if model in self._models else "")
        if sampler is None:
            sampler = self._samplers[model] = _Sampler(remaining=settings.count)
        picked = False
        if settings.rate:
            sampler.seen += 1
            picked = sampler.seen % settings.rate == 0 and sampler.remaining != 0
            if picked and sampler.remaining > 0:
                sampler.remaining -= 1
        if not (picked or forced):
            return None
        trace = Trace(
            next(self._ids),
            model,
            version,
            request_id,
            settings.level,
            settings.mode,
            traceparent=traceparent,
            sink=self.sink,
        )
        trace.mark("REQUEST_START", started_ns)
        if front is not None:
            front.attach(trace)
        if self.sink is not None:
            self.sink.started(trace)
        return trace

    def child(
        self,
        parent: Trace,
        model: str,
        version: int,
        request_id: str,
        started_ns: int | None = None,
    ) -> Trace:
        """The trace of a request that `parent`'s request made (an ensemble step, a BLS
        call)."""
        trace = Trace(
            next(self._ids),
            model,
            version,
            request_id,
            parent.level,
            parent.mode,
            parent=parent,
            sink=self.sink,
        )
        trace.mark("REQUEST_START", started_ns)
        if self.sink is not None:
            self.sink.started(trace)
        return trace

    # --- the extension -----------------------------------------------------------------------

    def settings(self, model: str = "") -> dict[str, str | list[str]]:
        """The settings as the extension reports them: strings, the level a list."""
        current = self.settings_for(model)
        sampler = self._samplers.get(model if model in self._models else "", _Sampler())
        found: dict[str, str | list[str]] = {
            "trace_level": list(current.level) or ["OFF"],
            "trace_rate": str(current.rate),
            "trace_count": str(sampler.remaining),
        }
        if current.mode == TRITON:
            found["log_frequency"] = str(current.log_frequency)
            found["trace_file"] = current.file
        found["trace_mode"] = current.mode
        if current.mode == OPENTELEMETRY:
            otel = current.otel
            found["url"] = otel.url
            found["bsp_max_queue_size"] = str(otel.bsp_max_queue_size)
            found["bsp_schedule_delay"] = str(otel.bsp_schedule_delay_ms)
            found["bsp_max_export_batch_size"] = str(otel.bsp_max_export_batch_size)
        return found

    def update(
        self, model: str, changes: Mapping[str, list[str] | None]
    ) -> dict[str, str | list[str]]:
        """Apply the given settings (a None value clears a model's own one back to the
        global); a model named with no settings drops all of its own. Every change is
        checked first, so a bad request changes nothing."""
        if "trace_file" in changes:
            raise ServerError(
                ErrorCode.UNSUPPORTED,
                "trace file location can not be updated through network protocol",
            )
        unknown = [key for key in changes if key not in _NAMES]
        if unknown:
            raise invalid_arg(
                f"unknown trace setting '{unknown[0]}': expected one of " + ", ".join(_NAMES[:-1])
            )
        parsed = {_FIELD[key]: _parse(key, values) for key, values in changes.items()}
        models = dict(self._models)
        new_global = self._global
        if model:
            own = {} if not changes else dict(models.get(model, {}))
            for key, value in parsed.items():
                if value is None:
                    own.pop(key, None)
                else:
                    own[key] = value
            if own:
                models[model] = own
            else:
                models.pop(model, None)
        else:
            values = {k: (getattr(self.startup, k) if v is None else v) for k, v in parsed.items()}
            new_global = dataclasses.replace(self._global, **values)
        # Triton's rule: a setting an update makes must be able to trace, or trace
        # nothing (a level without a file would keep every trace in memory, unwritten).
        # A model whose own settings are cleared takes the global ones as they are.
        checked = ([model] if model in models else []) if model else ["", *models]
        for name in checked:
            mine = models.get(name)
            effective = dataclasses.replace(new_global, **mine) if mine else new_global
            reason = _invalid_reason(effective)
            if reason:
                raise invalid_arg(f"Attempting to set invalid trace setting :{reason}")
        self._models, self._global = models, new_global
        if model:
            if model in models:
                self._samplers[model] = _Sampler(remaining=self.settings_for(model).count)
            else:
                self._samplers.pop(model, None)
        else:
            # Triton makes every setting anew on a global update, so sampling counts
            # from the update on, for the models that follow the global rate too.
            for sampler in self._samplers.values():
                sampler.seen = 0
            if "count" in parsed:
                # Models that do not set their own count follow the global one, as in
                # Triton.
                self._samplers[""] = _Sampler(remaining=new_global.count)
                for name, settings in models.items():
                    if "count" not in settings:
                        self._samplers[name] = _Sampler(remaining=new_global.count)
        self.active = _can_trace(new_global) or any(
            _can_trace(self.settings_for(name)) for name in models
        )
        return self.settings(model)

    def exhausted(self, model: str) -> bool:
        """Whether the traces `count` allowed for `model` have all been taken."""
        sampler = self._samplers.get(model if model in self._models else "")
        return sampler is not None and sampler.remaining == 0

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()


def _can_trace(settings: TraceSettings) -> bool:
    """A level, and somewhere for the traces to go: triton mode writes them to a file."""
    return bool(settings.level) and (settings.mode != TRITON or bool(settings.file))


def _invalid_reason(settings: TraceSettings) -> str:
    """Why a setting with a level cannot trace (Triton's words); empty when it can."""
    if not settings.level:
        return ""
    if settings.rate == 0:
        return "sample rate must be non-zero"
    if settings.mode == TRITON and not settings.file:
        return "trace file name is not given"
    return ""


_INTEGER = re.compile(r"-?[0-9]+")

_FIELD = {
    "trace_level": "level",
    "trace_rate": "rate",
    "trace_count": "count",
    "log_frequency": "log_frequency",
}


def _parse(key: str, values: list[str] | None) -> Any:
    """A setting's new value in TraceSettings' terms; None clears it."""
    if values is None:
        return None
    if key == "trace_level":
        if "OFF" in values and len(values) > 1:
            raise invalid_arg("Expect only one trace level 'OFF' is specified")
        levels = [v for v in values if v in ("TIMESTAMPS", "TENSORS")]
        unknown = [v for v in values if v not in ("OFF", "TIMESTAMPS", "TENSORS")]
        if unknown:
            raise invalid_arg(f"Unable to parse 'trace_level', got: {unknown[0]}")
        return tuple(dict.fromkeys(levels))
    if len(values) > 1:
        raise invalid_arg(f"expect only 1 value for '{key}'")
    text = values[0] if values else ""
    low, high = (-1, _INT32_MAX) if key == "trace_count" else (0, _UINT32_MAX)
    try:
        # ASCII digits, with a sign for trace_count's -1: int() alone also reads `1_0`,
        # `+5`, ` 5` and other scripts' digits, which are no number a client wrote.
        if _INTEGER.fullmatch(text) is None:
            raise ValueError(text)
        number = int(text)
    except ValueError:
        raise invalid_arg(f"Unable to parse '{key}', got: {text}") from None
    if key == "trace_count" and number < low:
        raise invalid_arg(f"Unable to parse 'trace_count'. Expecting value >= -1, got:{text}")
    if not low <= number <= high:
        raise invalid_arg(
            f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {text}"
        )
    return number
