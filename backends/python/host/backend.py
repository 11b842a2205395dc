"""`PythonBackend`: loads a Triton Python model as one worker process per instance.

A version loads once every instance's worker has run the model's `initialize` (they
start side by side) and the `model_warmup` samples ran; the loaded model's executors
take requests one by one (`per_request`), so `execute` gets one InferenceRequest per
client request of the batch the scheduler formed.

The model's static `auto_complete_config`, where it has one, runs in a short-lived
worker of its own before the load, as Triton runs it in an interpreter that then goes.
BLS and model-control calls reach the core through the `CoreCalls` the composition root
attaches (`attach_core`) before models load.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

from google.protobuf import json_format
from prometheus_client.metrics_core import Metric

from ge_serve.backends.base import LoadedModel, ModelSpec, SlotInfo
from ge_serve.backends.config_json import as_served, config_to_json
from ge_serve.backends.warmup import run_warmup
from ge_serve.link.messages import Message
from ge_serve.protos import model_config_pb2

from ..messages import Autocomplete
from .based import PythonBasedBackend, find_backend_file
from .calls import CoreCalls
from .env import ExecutionEnvs
from .hosting import ModelHealth, Shared
from .instance import InstanceSpec, PythonInstance
from .metrics import CustomMetrics
from .worker import Launch, WorkerProcess

log = logging.getLogger(__name__)

NAME = "python"
_KINDS = {
    model_config_pb2.ModelInstanceGroup.KIND_GPU: "GPU",
    model_config_pb2.ModelInstanceGroup.KIND_MODEL: "MODEL",
}
_AUTOCOMPLETE_TIMEOUT_S = 120.0


class PythonBackend:
    name = NAME

    def __init__(
        self, core: CoreCalls | None = None, backend_directory: Path | None = None
    ) -> None:
        self._core = core
        # Where Python-based backends are (`--backend-directory`); None: nowhere.
        self.backend_directory = backend_directory
        self.metrics = CustomMetrics()
        self._envs = ExecutionEnvs()
        self._lock = threading.Lock()
        self._instances: weakref.WeakSet[PythonInstance] = weakref.WeakSet()

    def attach_core(self, core: CoreCalls) -> None:
        """Where BLS calls go (the server's core); set before models load."""
        self._core = core

    def default_model_filename(self) -> str:
        return "model.py"

    def python_based(self, name: str) -> PythonBasedBackend | None:
        """The Python-based backend `name` (its `<backend directory>/<name>/model.py`),
        None if there is none; ValueError for a name that is not one folder name."""
        found = find_backend_file(self.backend_directory, name)
        return None if found is None else PythonBasedBackend(self, name, found)

    def autocomplete(
        self,
        config: model_config_pb2.ModelConfig,
        model_path: Path,
        backend_file: Path | None = None,
    ) -> None:
        """`backend_file`: a Python-based backend's model.py, run in the model's stead."""
        if backend_file is None and not model_path.is_file():
            raise ValueError(missing_model_file(model_path))
        # Without the name in its source, or in a module beside it that it may inherit the
        # method from, the model has no auto_complete_config, and a worker would start
        # only to find none (Triton starts one for every load to ask).
        model_dir = _model_dir(config, model_path)
        source = backend_file or model_path
        if not _names_autocomplete(source, model_dir):
            return
        _check_stub_name(config.name)
        launch = self._envs.launch(config, model_dir)
        worker = WorkerProcess(f"{config.name}-autocomplete", launch, _NoHost())
        try:
            worker.start()
            config_json = json.dumps(config_to_json(config))
            done = worker.call(
                lambda number: Autocomplete(
                    number, str(model_path), config_json, str(backend_file or "")
                ),
                timeout=_AUTOCOMPLETE_TIMEOUT_S,
            )
            text = done.text or ""
        except (RuntimeError, TimeoutError) as exc:
            raise ValueError(
                f"auto_complete_config of model '{config.name}' failed: {exc}"
            ) from None
        finally:
            worker.stop(5)
        completed = model_config_pb2.ModelConfig()
        try:
            json_format.ParseDict(json.loads(text), completed)
        except (json_format.ParseError, ValueError) as exc:
            raise ValueError(
                f"auto_complete_config of model '{config.name}' returned a config that is "
                f"not valid: {exc}"
            ) from None
        for field in ("name", "backend", "platform"):
            if getattr(completed, field) != getattr(config, field):
                raise ValueError(
                    f"auto_complete_config of model '{config.name}' changed its {field} "
                    f"to '{getattr(completed, field)}'; it may complete the config, not "
                    "make it another model's"
                )
        config.CopyFrom(completed)

    def load(self, spec: ModelSpec, backend_file: Path | None = None) -> LoadedModel:
        """`backend_file`: a Python-based backend's model.py, run in the model's stead."""
        if backend_file is None and not spec.model_path.is_file():
            raise FileNotFoundError(missing_model_file(spec.model_path))
        config = spec.config
        launch = self._envs.launch(config, spec.model_dir)
        shared = Shared(self.metrics, lambda: self._core, ModelHealth(spec.events))
        # As Triton's core hands it to the backend: with its filled-in defaults.
        config_json = json.dumps(config_to_json(as_served(config)))
        slots = _slots(spec)
        for slot, _ in slots:
            _check_stub_name(slot.name)
        instances = [
            PythonInstance(
                slot,
                self._instance_spec(spec, slot, kind, launch, config_json, backend_file),
                shared,
            )
            for slot, kind in slots
        ]
        # Known before they start: close() at server exit must reach a worker whose
        # initialize never returns.
        with self._lock:
            self._instances.update(instances)
        try:
            _start_all(instances)
            run_warmup(spec, instances)
        except BaseException:
            for instance in instances:
                instance.kill()
                instance.close()
            with self._lock:
                self._instances.difference_update(instances)
            raise
        log.info(
            "model '%s' version %d: %d Python instance(s)%s",
            spec.name,
            spec.version,
            len(instances),
            ", decoupled" if config.model_transaction_policy.decoupled else "",
        )
        return LoadedModel(executors=list(instances), per_request=True)

    def _instance_spec(
        self,
        spec: ModelSpec,
        slot: SlotInfo,
        kind: str,
        launch: Launch,
        config_json: str,
        backend_file: Path | None,
    ) -> InstanceSpec:
        config = spec.config
        return InstanceSpec(
            model_name=spec.name,
            version=spec.version,
            instance_name=slot.name,
            kind=kind,
            device_id=slot.device_id,
            model_path=spec.model_path,
            model_dir=spec.model_dir,
            config_json=config_json,
            decoupled=bool(config.model_transaction_policy.decoupled),
            output_names=tuple(o.name for o in config.output),
            launch=launch,
            backend_file=backend_file,
        )

    def retire(self, loaded: LoadedModel) -> None:
        """A version was unloaded: end any worker an endless execute still holds."""
        for executor in loaded.executors:
            if isinstance(executor, PythonInstance):
                worker = executor.worker
                if worker is not None and worker.alive:
                    executor.kill()

    def collect(self) -> Iterator[Metric]:
        """The models' custom metrics (a prometheus_client collector)."""
        return self.metrics.collect()

    def close(self) -> None:
        """At server exit: no worker outlives the server."""
        with self._lock:
            instances = list(self._instances)
        for instance in instances:
            instance.kill()
        self._envs.close()


def missing_model_file(model_path: Path) -> str:
    """Triton's words (the stub's ModelContext::Init), which qa's tests look for."""
    return f"Failed to preinitialize Python stub: Python model file not found in '{model_path}'"


def _names_autocomplete(model_path: Path, model_dir: Path) -> bool:
    """Whether the model file, or a Python file beside it or in the model folder, names
    auto_complete_config."""
    files = {model_path, *model_path.parent.glob("*.py"), *model_dir.glob("*.py")}
    for path in files:
        with contextlib.suppress(OSError):
            if "auto_complete_config" in path.read_text(encoding="utf-8", errors="replace"):
                return True
    return False


# python_backend's INVALID_CHARS (pb_utils.h): characters a stub's name may not hold.
_INVALID_STUB_CHARS = frozenset(";|&$`<>()[]{}\\\"'*?~#!")


def _check_stub_name(name: str) -> None:
    """python_backend's check of the name its stub process is started with (the model's
    for auto-complete, the instance's otherwise): a load error."""
    if not name or not _INVALID_STUB_CHARS.isdisjoint(name):
        raise ValueError("Invalid stub name: contains invalid characters")


def _model_dir(config: model_config_pb2.ModelConfig, model_path: Path) -> Path:
    """The model folder, from the model file: `<model>/<version>/<default_model_filename>`."""
    depth = len(Path(config.default_model_filename or "model.py").parts)
    return model_path.parents[depth]


def _slots(spec: ModelSpec) -> list[tuple[SlotInfo, str]]:
    """One slot per instance, named as Triton names instances: `<group name>_<index>`."""
    found = []
    for group_index, group in enumerate(spec.config.instance_group):
        group_name = group.name or f"{spec.name}_{group_index}"
        kind = _KINDS.get(group.kind, "CPU")
        devices = list(group.gpus) if kind == "GPU" and group.gpus else [0]
        index = 0
        for device in devices:
            for _ in range(max(group.count, 1)):
                slot = SlotInfo(
                    name=f"{group_name}_{index}",
                    device="cpu" if kind != "GPU" else f"gpu{device}",
                    device_id=device,
                    stream=index,
                )
                found.append((slot, kind))
                index += 1
    if not found:
        found.append((SlotInfo(name=f"{spec.name}_0", device="cpu"), "CPU"))
    return found


def _start_all(instances: list[PythonInstance]) -> None:
    """Start every instance side by side; the first failure is the load's."""
    errors: list[BaseException] = []

    def start(instance: PythonInstance) -> None:
        try:
            instance.start()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,), daemon=True) for i in instances]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


class _NoHost:
    """A worker that only completes a config asks nothing of the server."""

    def on_message(self, worker: WorkerProcess, message: Message) -> None:
        return None

    def on_exit(self, worker: WorkerProcess, reason: str) -> None:
        return None
