"""What a model instance's worker asks of the server on its own, and how it is answered.

Called on the worker's reader thread, so nothing here may wait long: a BLS call is
handed to the core (which answers on its event loop, the answer then goes out on the
worker's writer thread), model-control calls run on a thread of their own, the rest are
answered at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ge_serve.backends.base import ModelError, ModelEvents, RequestContext
from ge_serve.link.messages import Message, Region

from ..messages import (
    Bls,
    BlsAnswer,
    BlsCancel,
    BlsRequest,
    Call,
    Encoded,
    ErrorText,
    Log,
    MetricDelete,
    MetricUpdate,
    Reply,
    Respond,
)
from .calls import CallControl, CoreCall, CoreCalls, CoreResponse
from .metrics import CustomMetrics
from .worker import WorkerDied, WorkerProcess

log = logging.getLogger("ge_serve.backends.python.model")

_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}


class ModelHealth:
    """A model version's instances, down or up; the version is unavailable while any
    instance is down, with that instance's reason."""

    def __init__(self, events: ModelEvents | None) -> None:
        self._events = events
        self._lock = threading.Lock()
        self._down: dict[str, str] = {}

    def report(self, instance: str, reason: str | None) -> None:
        with self._lock:
            if reason is None:
                self._down.pop(instance, None)
            else:
                self._down[instance] = reason
            first = next(iter(self._down.values()), None)
        if self._events is None:
            return
        if first is None:
            self._events.available()
        else:
            self._events.unavailable(first)


@dataclass(frozen=True, slots=True)
class Shared:
    """What the instances of all Python models share: the custom metrics, the core (once
    the server has handed it over), and their own model version's health."""

    metrics: CustomMetrics
    core: Callable[[], CoreCalls | None]
    health: ModelHealth


class Instance(Protocol):
    """The model instance a worker serves (instance.PythonInstance)."""

    @property
    def name(self) -> str: ...

    def context_of(self, key: int) -> RequestContext | None: ...

    def responded(self, worker: WorkerProcess, message: Respond) -> None: ...

    def worker_ended(self, worker: WorkerProcess, reason: str) -> None: ...


class Hosting:
    """The WorkerHost of one instance."""

    def __init__(self, instance: Instance, shared: Shared) -> None:
        self._instance = instance
        self._shared = shared
        self._lock = threading.Lock()
        # Each worker's BLS calls in flight: what cancels each.
        self._calls: dict[tuple[int, int], CallControl | None] = {}

    def on_message(self, worker: WorkerProcess, message: Message) -> None:
        if isinstance(message, Respond):
            self._instance.responded(worker, message)
        elif isinstance(message, Bls):
            self._bls(worker, message.number, message.request, message.decoupled)
        elif isinstance(message, BlsCancel):
            with self._lock:
                control = self._calls.get((id(worker), message.number))
            if control is not None:
                control.cancel()
        elif isinstance(message, Call):
            self._call(worker, message.number, message.name, tuple(message.args))
        elif isinstance(message, MetricUpdate):
            self._shared.metrics.update(message.id, message.op, message.value)
        elif isinstance(message, MetricDelete):
            self._shared.metrics.delete(worker, message.id)
        elif isinstance(message, Log):
            level = _LEVELS.get(message.level, logging.INFO)
            log.log(level, "%s (%s): %s", self._instance.name, message.where, message.text)

    def on_exit(self, worker: WorkerProcess, reason: str) -> None:
        with self._lock:
            mine = [key for key in self._calls if key[0] == id(worker)]
            controls = [self._calls.pop(key) for key in mine]
        for control in controls:
            if control is not None:
                control.abandon()
        self._shared.metrics.release(worker)
        self._instance.worker_ended(worker, reason)

    # --- BLS -------------------------------------------------------------------------------

    def _bls(self, worker: WorkerProcess, number: int, call: BlsRequest, decoupled: bool) -> None:
        inputs = worker.read_tensors(call.inputs)
        worker.release([], urgent=True)
        core = self._shared.core()
        if core is None:
            error = CoreResponse(
                error=ModelError("UNAVAILABLE", "BLS calls are not available here")
            )
            worker.post(lambda: self._answer(worker, number, error, True))
            return
        request = CoreCall(
            model_name=call.model,
            model_version=call.version,
            request_id=call.id,
            inputs=[(t.name, t.datatype, inputs[t.name]) for t in call.inputs],
            requested_outputs=call.requested,
            parameters=json.loads(call.parameters) if call.parameters else {},
            timeout_us=call.timeout,
            decoupled=decoupled,
            parent_trace=self._parent_trace(call.parent),
            correlation_id=call.correlation_id,
            flags=call.flags,
        )
        key = (id(worker), number)
        with self._lock:
            self._calls[key] = None

        def reply(response: CoreResponse | None, final: bool) -> None:
            if final:
                with self._lock:
                    self._calls.pop(key, None)
            worker.post(lambda: self._answer(worker, number, response, final))

        control = core.infer(request, reply)
        with self._lock:
            if key in self._calls:
                self._calls[key] = control

    def _parent_trace(self, key: int | None) -> object | None:
        """The trace of the request (still in the worker's hands) a call was made for."""
        context = None if key is None else self._instance.context_of(key)
        return None if context is None else context.trace

    def _answer(
        self, worker: WorkerProcess, number: int, response: CoreResponse | None, final: bool
    ) -> None:
        """Writer thread: the response's tensors into shared memory, then the message."""
        encoded = None
        if response is not None:
            failed = response.error
            error = None if failed is None else ErrorText(failed.code, failed.message)
            regions: list[Region] = []
            outputs = [] if error else worker.write_tensors(response.outputs, regions)
            encoded = Encoded(outputs, error, json.dumps(response.parameters))
        worker.send(BlsAnswer(number, encoded, final))

    # --- calls that want an answer ---------------------------------------------------------

    def _call(self, worker: WorkerProcess, number: int, name: str, args: tuple[Any, ...]) -> None:
        metrics = self._shared.metrics
        try:
            if name == "is_cancelled":
                context = self._instance.context_of(int(args[0]))
                value: Any = True if context is None else context.cancelled
            elif name == "metric_family":
                value = metrics.family(worker, str(args[0]), str(args[1]), int(args[2]))
            elif name == "metric":
                pairs = [(str(k), str(v)) for k, v in args[1]]
                value = metrics.metric(worker, int(args[0]), pairs, [float(b) for b in args[2]])
            elif name == "metric_value":
                value = metrics.value(int(args[0]))
            elif name in ("model_ready", "load_model", "unload_model"):
                threading.Thread(
                    target=self._control, args=(worker, number, name, args), daemon=True
                ).start()
                return
            else:
                raise ValueError(f"unknown call '{name}'")
        except (ValueError, TypeError, IndexError) as exc:
            _reply(worker, number, False, str(exc))
            return
        _reply(worker, number, True, value)

    def _control(
        self, worker: WorkerProcess, number: int, name: str, args: tuple[Any, ...]
    ) -> None:
        core = self._shared.core()
        try:
            if core is None:
                raise ValueError("the model control API is not available here")
            if name == "model_ready":
                value: Any = core.model_ready(str(args[0]), str(args[1]))
            elif name == "load_model":
                core.load_model(str(args[0]), str(args[1]), dict(args[2]))
                value = None
            else:
                core.unload_model(str(args[0]), bool(args[1]))
                value = None
        except ValueError as exc:
            _reply(worker, number, False, str(exc))
            return
        _reply(worker, number, True, value)


def _reply(worker: WorkerProcess, number: int, ok: bool, value: Any) -> None:
    with contextlib.suppress(WorkerDied):
        worker.send(Reply(number, ok, value))
