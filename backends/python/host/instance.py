"""One instance of a Python model: its executor slot, and the worker process behind it.

`PythonInstance` is a RequestExecutor: the scheduler hands it a batch as its requests,
it writes their inputs into the worker's view of shared memory, asks the worker to
execute them, and gives each request its outputs or its error. A decoupled model's
responses go to each request's sink as they arrive, long after execute may have
returned; its input memory is kept until the request's final response.

When the worker dies (a crash, a kill), its requests fail with the reason, the model is
reported unavailable, and a new worker is started and initialized in the background;
the model is available again once it is up; not once the server's stop has begun, as
the model is about to be unloaded then. What the worker itself starts (BLS calls,
metrics, log lines, `is_cancelled`) is answered in `hosting`.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ge_serve.backends.base import (
    Array,
    ModelError,
    ModelRequest,
    RequestContext,
    SlotInfo,
)
from ge_serve.link.child import Backoff
from ge_serve.link.messages import Region
from ge_serve.link.tensors import regions_of

from ..messages import Encoded, Execute, Finalize, Init, Request, Respond
from .hosting import Hosting, Shared
from .worker import Launch, WorkerDied, WorkerProcess

log = logging.getLogger(__name__)

# How long a restart waits after a failed attempt, doubling up to the most.
_RETRY_FIRST_S = 0.5
_RETRY_MOST_S = 30.0


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One model instance, as Triton describes it to `initialize`."""

    model_name: str
    version: int
    instance_name: str
    kind: str  # CPU, GPU or MODEL
    device_id: int
    model_path: Path
    model_dir: Path
    config_json: str
    decoupled: bool
    output_names: tuple[str, ...]
    launch: Launch
    finalize_timeout_s: float = 30.0
    # A Python-based backend's model.py, run in the model's stead (based.py).
    backend_file: Path | None = None

    def init_payload(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "instance_name": self.instance_name,
            "decoupled": self.decoupled,
            "model_path": str(self.model_path),
            "backend_file": str(self.backend_file or ""),
            "args": {
                "model_config": self.config_json,
                "model_instance_kind": self.kind,
                "model_instance_name": self.instance_name,
                "model_instance_device_id": str(self.device_id),
                "model_repository": str(self.model_dir),
                "model_version": str(self.version),
                "model_name": self.model_name,
            },
        }


@dataclass(slots=True)
class Pending:
    """A request handed to a worker and not yet finished."""

    key: int
    context: RequestContext
    regions: list[Region]
    worker: WorkerProcess
    done: threading.Event = field(default_factory=threading.Event)
    # A default-mode model answering through its response sender.
    response: Encoded | None = None
    error: ModelError | None = None


class PythonInstance:
    def __init__(self, slot: SlotInfo, spec: InstanceSpec, shared: Shared) -> None:
        self.slot = slot
        self.spec = spec
        self._shared = shared
        self._lock = threading.Lock()
        self._worker: WorkerProcess | None = None
        # The worker whose initialize is running, not in service yet: kill() must reach it
        # too, or a model whose initialize never returns would hold the server's exit.
        self._booting: WorkerProcess | None = None
        self.pending: dict[int, Pending] = {}
        self._keys = itertools.count(1)
        self._closing = threading.Event()
        self._restarter: threading.Thread | None = None
        self._down: str | None = None
        self._hosting = Hosting(self, shared)

    # --- starting ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker and run the model's initialize (blocking); raises RuntimeError
        saying why the instance cannot serve."""
        worker = self._spawn()
        with self._lock:
            self._worker = worker
            closed = self._closing.is_set()
        if closed:  # killed as its initialize ended: kill() may have found neither worker
            worker.kill()

    def _spawn(self) -> WorkerProcess:
        worker = WorkerProcess(self.spec.instance_name, self.spec.launch, self._hosting)
        with self._lock:
            if self._closing.is_set():
                raise RuntimeError(f"model instance '{self.spec.instance_name}' was closed")
            self._booting = worker
        try:
            worker.start()
            if self._closing.is_set():  # killed while the process started
                raise WorkerDied("the model instance was closed")
            payload = self.spec.init_payload()
            worker.call(lambda number: Init(number, payload))
        except BaseException as exc:
            worker.kill()
            worker.wait(5)
            if isinstance(exc, WorkerDied):
                detail = str(exc)
                raise RuntimeError(
                    f"{self._unhealthy()} {detail[:1].upper()}{detail[1:]} while it initialized"
                ) from None
            raise
        finally:
            with self._lock:
                self._booting = None
        log.info(
            "model '%s' instance %s: worker process %d ready",
            self.spec.model_name,
            self.spec.instance_name,
            worker.pid,
        )
        return worker

    @property
    def name(self) -> str:
        return self.spec.instance_name

    @property
    def worker(self) -> WorkerProcess | None:
        return self._worker

    def context_of(self, key: int) -> RequestContext | None:
        """The context of a request still in the worker's hands (any thread)."""
        with self._lock:
            pending = self.pending.get(key)
        return None if pending is None else pending.context

    # --- executing ---------------------------------------------------------------------------

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """One request (a warmup sample)."""
        context = RequestContext(responses=_Discard() if self.spec.decoupled else None)
        outputs = self.execute_requests([ModelRequest(inputs, context)])[0]
        if context.error is not None:
            raise RuntimeError(context.error.message)
        return outputs

    def execute_requests(self, requests: Sequence[ModelRequest]) -> list[dict[str, Array]]:
        worker = self._worker
        empty: list[dict[str, Array]] = [{} for _ in requests]
        if worker is None or not worker.alive:
            reason = self._down or "the model instance is not running"
            for request in requests:
                self._fail(request.context, ModelError("UNAVAILABLE", reason))
            return empty
        pendings: list[Pending] = []
        try:
            batch = [self._hand_over(worker, request, pendings) for request in requests]
            answer = worker.call(lambda number: Execute(number, batch))
        except WorkerDied as exc:
            for pending in pendings:
                self._finish(pending, self._died(str(exc)))
            for request in requests[len(pendings) :]:
                self._fail(request.context, self._died(str(exc)))
            return empty
        except RuntimeError as exc:  # execute raised: every request of the batch fails,
            # but one a default-mode model already answered through its sender keeps
            # that answer (Triton's frontend takes a request's first response).
            results: list[dict[str, Array]] = []
            for pending in pendings:
                sent = None if self.spec.decoupled else pending.response
                if sent is None:
                    results.append({})
                    self._finish(pending, ModelError("INTERNAL", str(exc)))
                    continue
                outputs, unread = self._read(worker, pending, sent)
                results.append(outputs)
                self._finish(pending, unread)
            return results
        if self.spec.decoupled:
            return empty  # the responses come through each request's sink
        returned = answer.responses
        if returned is None:
            returned = [None] * len(pendings)
        results = []
        for pending, encoded in zip(pendings, returned, strict=True):
            if encoded is not None:
                outputs, unread = self._read(worker, pending, encoded)
                results.append(outputs)
                self._finish(pending, unread)
                continue
            # Answered through its response sender: wait for the request's final response
            # (or the worker's end).
            pending.done.wait()
            if pending.error is None and pending.response is None:
                pending.error = ModelError(
                    "INTERNAL",
                    "the model's execute returned None, and sent no response for the request",
                )
            response = pending.response
            error = pending.error
            if error is not None or response is None:
                result: dict[str, Array] = {}
            else:
                result, error = self._read(worker, pending, response)
            self._finish(pending, error)
            results.append(result)
        return results

    def _hand_over(
        self, worker: WorkerProcess, request: ModelRequest, pendings: list[Pending]
    ) -> Request:
        context = request.context
        regions: list[Region] = []
        inputs = worker.write_tensors(list(request.inputs.items()), regions)
        pending = Pending(next(self._keys), context, regions, worker)
        with self._lock:
            self.pending[pending.key] = pending
        pendings.append(pending)
        requested = list(context.requested_outputs) or list(self.spec.output_names)
        parameters = json.dumps(dict(context.parameters))
        return Request(
            pending.key,
            context.id,
            inputs,
            requested,
            parameters,
            context.correlation_id,
            context.flags,
            context.timeout_us,
        )

    def _read(
        self, worker: WorkerProcess, pending: Pending, encoded: Encoded
    ) -> tuple[dict[str, Array], ModelError | None]:
        """A response's outputs, or why they could not be read (the worker ended as they
        were): every request of a batch is finished, whatever happens to one of them."""
        try:
            return self._outputs(worker, pending, encoded), None
        except Exception as exc:
            return {}, ModelError("INTERNAL", f"the model's response could not be read: {exc}")

    def _outputs(
        self, worker: WorkerProcess, pending: Pending, encoded: Encoded
    ) -> dict[str, Array]:
        if encoded.error is not None:
            pending.context.error = ModelError(encoded.error.code, encoded.error.message)
            return {}
        pending.context.response_parameters = _response_parameters(encoded.parameters)
        return worker.read_tensors(encoded.outputs)

    def _finish(self, pending: Pending, error: ModelError | None) -> None:
        """The request is answered: its inputs' memory is free again."""
        with self._lock:
            self.pending.pop(pending.key, None)
        if error is not None:
            self._fail(pending.context, error)
        pending.worker.free(pending.regions)
        pending.regions = []

    def _fail(self, context: RequestContext, error: ModelError) -> None:
        if context.responses is not None:
            context.responses.send(None, error, True)
        else:
            context.error = error

    def _died(self, reason: str) -> ModelError:
        if self._closing.is_set():
            then = "it was being unloaded"
        elif self._server_stopping():
            then = "the server is stopping"
        else:
            then = "it is being restarted"
        return ModelError(
            "UNAVAILABLE",
            f"{self._unhealthy()} model instance '{self.spec.instance_name}' of "
            f"'{self.spec.model_name}' failed: {reason}; {then}",
        )

    def _unhealthy(self) -> str:
        """Triton's words for a stub process that died (python_be.cc, stub_launcher.cc),
        which qa's tests look for; ge-serve's detail follows them."""
        return f"Stub process '{self.spec.instance_name}' is not healthy."

    # --- the worker's own messages (its reader thread) -----------------------------------

    def responded(self, worker: WorkerProcess, message: Respond) -> None:
        key, encoded, final = message.key, message.response, message.final
        with self._lock:
            pending = self.pending.get(key)
            if pending is not None and final and self.spec.decoupled:
                del self.pending[key]
        if pending is None or pending.worker is not worker:
            if encoded is not None:
                worker.release(regions_of(encoded.outputs), urgent=True)
            return
        if not self.spec.decoupled:
            if encoded is not None and pending.response is None:
                pending.response = encoded
            elif encoded is not None:
                worker.release(regions_of(encoded.outputs), urgent=True)
            if final:
                pending.done.set()
            return
        outputs = None
        error = None
        parameters: dict[str, Any] = {}
        if encoded is not None:
            if encoded.error is not None:
                error = ModelError(encoded.error.code, encoded.error.message)
            else:
                outputs = worker.read_tensors(encoded.outputs)
                parameters = _response_parameters(encoded.parameters)
                worker.release([], urgent=True)
        sink = pending.context.responses
        if sink is not None:
            sink.send(outputs, error, final, parameters)
        if final:
            worker.free(pending.regions)
            pending.regions = []

    def worker_ended(self, worker: WorkerProcess, reason: str) -> None:
        with self._lock:
            lost = [p for p in self.pending.values() if p.worker is worker]
            for pending in lost:
                del self.pending[pending.key]
            in_service = worker is self._worker
        error = self._died(reason)
        restarting = in_service and not self._closing.is_set()
        if restarting and self._server_stopping():
            restarting = False
            log.info(
                "model '%s' instance %s: %s as the server stops",
                self.spec.model_name,
                self.spec.instance_name,
                reason,
            )
            self._set_down(
                f"{self._unhealthy()} model instance '{self.spec.instance_name}' ended as "
                f"the server stops: {reason}"
            )
        if restarting:
            # Down before the lost requests fail: a client that sees its error and looks at
            # the model's state must find it restarting, never still READY.
            log.error(
                "model '%s' instance %s: %s; restarting it",
                self.spec.model_name,
                self.spec.instance_name,
                reason,
            )
            self._set_down(
                f"{self._unhealthy()} model instance '{self.spec.instance_name}' is "
                f"restarting: {reason}"
            )
        for pending in lost:
            if pending.context.responses is not None:
                pending.context.responses.send(None, error, True)
            else:
                pending.error = error
                pending.done.set()
        if not restarting:
            return
        restarter = threading.Thread(
            target=self._restart, args=(reason,), name=f"pb-restart-{self.slot.name}", daemon=True
        )
        self._restarter = restarter
        restarter.start()

    # --- restarting and closing ----------------------------------------------------------

    def _server_stopping(self) -> bool:
        core = self._shared.core()
        return core is not None and core.stopping()

    def _set_down(self, reason: str | None) -> None:
        self._down = reason
        self._shared.health.report(self.spec.instance_name, reason)

    def _restart(self, reason: str) -> None:
        backoff = Backoff(_RETRY_FIRST_S, _RETRY_MOST_S)
        while not self._closing.is_set() and not self._server_stopping():
            try:
                worker = self._spawn()
            except Exception as exc:
                self._set_down(
                    f"{self._unhealthy()} model instance '{self.spec.instance_name}' is "
                    f"restarting: {reason}; the last attempt failed: {exc}"
                )
                if self._closing.wait(backoff.next_delay()):
                    return
                continue
            with self._lock:
                if self._closing.is_set():
                    worker.stop(5)
                    return
                # One that died already is not taken; one that dies from here on finds
                # itself in service, and its end starts the next restart.
                started = worker.exited is None
                if started:
                    self._worker = worker
            if not started:
                continue
            self._set_down(None)
            log.info(
                "model '%s' instance %s is serving again",
                self.spec.model_name,
                self.spec.instance_name,
            )
            return

    def kill(self) -> None:
        """Stop at once, whatever the worker is doing (an execute that never returns)."""
        with self._lock:
            self._closing.set()
            workers = [self._worker, self._booting]
        for worker in workers:
            if worker is not None:
                worker.kill()

    def close(self) -> None:
        """Run the model's finalize and end the worker (the slot thread, at unload)."""
        self._closing.set()
        restarter = self._restarter
        if restarter is not None:
            restarter.join(10)
        worker = self._worker
        if worker is None:
            return
        if worker.alive:
            try:
                worker.call(Finalize, timeout=self.spec.finalize_timeout_s)
            except (WorkerDied, TimeoutError):
                pass
            except RuntimeError as exc:
                log.error(
                    "model '%s' instance %s: finalize failed: %s",
                    self.spec.model_name,
                    self.spec.instance_name,
                    exc,
                )
        worker.stop(5)


class _Discard:
    """Where a decoupled model's warmup responses go."""

    def send(
        self,
        outputs: dict[str, Array] | None,
        error: ModelError | None,
        final: bool,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        return None


def _response_parameters(text: Any) -> dict[str, Any]:
    """A response's parameters, as the worker sent them (JSON text; checked there)."""
    if not text:
        return {}
    value = json.loads(text)
    return value if isinstance(value, dict) else {}
