"""Config auto-completion: backend choice, tensors from the model file, scheduler defaults."""

from __future__ import annotations

import logging
from pathlib import Path

from ge_serve.backends.base import Backend
from ge_serve.backends.onnx_io import read_onnx_io
from ge_serve.backends.paths import OutsideFolder, resolve_inside
from ge_serve.backends.python.host.backend import PythonBackend, missing_model_file
from ge_serve.backends.python.host.based import PythonBasedBackend
from ge_serve.protos import model_config_pb2

from ..errors import ErrorCode, ServerError
from . import unhonoured
from .io_shapes import check_io_shapes

log = logging.getLogger(__name__)

# Names a config may use for a backend, mapped to the backend that serves them.
BACKEND_ALIASES = {
    "onnxruntime": "onnxruntime",
    "onnxruntime_onnx": "onnxruntime",
    "ge": "ge",
    "npu_ge": "ge",
    "python": "python",
    "llm": "llm",
}
ORT_PLATFORM = "onnxruntime_onnx"
# Backends whose instances run on the host CPU unless the config says otherwise.
HOST_BACKENDS = ("onnxruntime", "python")


def resolve_backend(
    config: model_config_pb2.ModelConfig,
    backends: dict[str, Backend],
    default: str,
    version_dir: Path | None = None,
) -> Backend:
    """Pick the backend: `backend`, then `platform`, then Python for a version folder that
    holds a `model.py` (and no ONNX model), then the default for ONNX files.

    A config that names no backend goes to the default, except KIND_CPU instance groups,
    which mean the host CPU (onnxruntime) as they do in Triton, and models an NPU cannot
    hold (string and bfloat16 tensors), which stay on the host CPU too. Dims other than the
    batch that change at run time go to GE like the rest: with no gears or ranges they run
    as GE dynamic shape (npu_ge's default mode), and the GE backend logs the mode.
    """
    named = config.backend or config.platform
    if named:
        key = BACKEND_ALIASES.get(named)
        if key is None:
            based = _python_based(config, backends)
            if based is not None:
                return based
            raise ServerError(
                ErrorCode.UNSUPPORTED,
                f"backend '{named}' is not supported; available: {sorted(BACKEND_ALIASES)}, "
                "or a Python-based backend in --backend-directory",
            )
    elif _python_model(config, version_dir):
        key = "python"
    else:
        only_cpu = bool(config.instance_group) and all(
            g.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU for g in config.instance_group
        )
        key = "onnxruntime" if only_cpu else default
        reason = _host_only(config, version_dir) if key != "onnxruntime" else None
        if reason:
            log.info(
                "model '%s' has %s: serving it on the host CPU (onnxruntime). Name "
                'backend "npu_ge" to run it through GE anyway.',
                config.name,
                reason,
            )
            key = "onnxruntime"
    backend = backends.get(key)
    if backend is None:
        raise ServerError(ErrorCode.UNAVAILABLE, f"backend '{key}' is not available")
    return backend


def _python_based(
    config: model_config_pb2.ModelConfig, backends: dict[str, Backend]
) -> Backend | None:
    """A backend ge-serve does not have, found as `<backend directory>/<name>/model.py`
    and served by the Python backend, as Triton finds a Python-based backend."""
    python = backends.get("python")
    if not config.backend or not isinstance(python, PythonBackend):
        return None
    try:
        return python.python_based(config.backend)
    except ValueError as exc:
        raise ServerError(ErrorCode.INVALID_ARG, str(exc)) from None


def _python_model(config: model_config_pb2.ModelConfig, version_dir: Path | None) -> bool:
    """A Triton Python model with no config naming its backend (Triton infers it too)."""
    if version_dir is None:
        return False
    filename = config.default_model_filename
    if filename:
        return filename.endswith(".py") and _resolved(version_dir, filename).is_file()
    onnx = _resolved(version_dir, "model.onnx")
    return not onnx.exists() and _resolved(version_dir, "model.py").is_file()


def _host_only(config: model_config_pb2.ModelConfig, version_dir: Path | None) -> str | None:
    """Why a model can only run on the host: string or bfloat16 tensors. None otherwise.

    Uses the config's tensors, and the ONNX file for what the config leaves out.
    """
    batching = config.max_batch_size > 0
    tensors: dict[str, tuple[int, tuple[int, ...]]] = {}
    if not (config.input and config.output) and version_dir is not None:
        path = _resolved(version_dir, config.default_model_filename or "model.onnx")
        if path.suffix.lower() == ".onnx" and path.is_file():
            try:
                inputs, outputs = read_onnx_io(path)
            except ValueError:
                inputs, outputs = [], []  # the chosen backend reports the bad file
            found = inputs + outputs
            # Auto-complete batches when every tensor has a dynamic first dim.
            dynamic_first = bool(found) and all(t.dims and t.dims[0] == -1 for t in found)
            batching = batching or dynamic_first
            for t in found:
                tensors[t.name] = (t.data_type, t.dims[1:] if batching else t.dims)
    for entry in list(config.input) + list(config.output):
        dims = tuple(entry.reshape.shape) if entry.HasField("reshape") else tuple(entry.dims)
        known_type, known_dims = tensors.get(entry.name, (model_config_pb2.TYPE_INVALID, ()))
        tensors[entry.name] = (entry.data_type or known_type, dims or known_dims)
    if any(t == model_config_pb2.TYPE_STRING for t, _ in tensors.values()):
        return "string tensors, which an NPU cannot hold"
    if any(t == model_config_pb2.TYPE_BF16 for t, _ in tensors.values()):
        return "bfloat16 tensors, which ge-serve's GE path does not carry yet"
    return None


def resolve_model_file(model_dir: Path, version: str, filename: str) -> Path:
    """Where a version's model file is (`default_model_filename`, or the backend's default,
    such as a Python backend's `model.py`); OutsideFolder when it leaves the model folder."""
    return resolve_inside(
        model_dir, filename, f"default_model_filename {filename!r}", under=version
    )


def model_file(config: model_config_pb2.ModelConfig, backend: Backend, version_dir: Path) -> Path:
    """The model file a backend opens, in `version_dir` (`<model folder>/<version>`)."""
    return _resolved(version_dir, config.default_model_filename or backend.default_model_filename())


def _resolved(version_dir: Path, filename: str) -> Path:
    try:
        return resolve_model_file(version_dir.parent, version_dir.name, filename)
    except OutsideFolder as exc:
        raise ServerError(ErrorCode.INVALID_ARG, str(exc)) from None


def complete(
    config: model_config_pb2.ModelConfig, backend: Backend, model_path: Path, from_file: bool
) -> None:
    """Fill what the config leaves out. `from_file=False` (auto-complete off) skips the
    model file but still applies the defaults every Triton config ends up with."""
    if from_file:
        # A Python-based backend runs its own model.py: the model's may well not exist.
        if not model_path.exists() and not isinstance(backend, PythonBasedBackend):
            absent = (
                missing_model_file(model_path)
                if isinstance(backend, PythonBackend)
                else f"model file '{model_path}' does not exist"
            )
            raise ServerError(ErrorCode.INVALID_ARG, absent)
        try:
            backend.autocomplete(config, model_path)
        except ValueError as exc:
            raise ServerError(ErrorCode.INVALID_ARG, str(exc)) from None
        # Whether a batching model gets `dynamic_batching {}` is the backend's choice, as
        # in Triton (onnxruntime's auto-complete adds it; a Python model asks for it with
        # set_dynamic_batching): without it, each request executes alone.
    else:
        missing = [
            kind
            for kind, entries in (("inputs", config.input), ("outputs", config.output))
            if not entries
        ]
        if missing:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"model '{config.name}': the config lists no {' and no '.join(missing)}, and "
                "auto-complete is disabled (--disable-auto-complete-config), so they are not "
                "read from the model file",
            )
    ort = config.platform == ORT_PLATFORM and backend.name == "onnxruntime"
    if not config.backend and (not config.platform or ort):
        # Triton's AutoCompleteBackendFields (core model_config_utils.cc), which runs
        # with auto-complete off too: `platform: "onnxruntime_onnx"` shows its backend.
        config.backend = backend.name
    if config.backend == "onnxruntime" and not config.platform:
        config.platform = ORT_PLATFORM
    if not config.instance_group:
        group = config.instance_group.add()
        group.name = config.name
        group.count = 1
        # A device backend (GE: an NPU, real or simulated) places its instances itself,
        # from npu_ge's device parameters: Triton's KIND_MODEL, not KIND_GPU, which would
        # name a CUDA device to Triton users.
        group.kind = (
            model_config_pb2.ModelInstanceGroup.KIND_CPU
            if backend.name in HOST_BACKENDS or isinstance(backend, PythonBasedBackend)
            else model_config_pb2.ModelInstanceGroup.KIND_MODEL
        )
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.count < 1:
            group.count = 1
    if not config.default_model_filename:
        # The name, not the resolved path's: a link in the version folder keeps its name.
        config.default_model_filename = backend.default_model_filename()


def refuse_cache_when_decoupled(config: model_config_pb2.ModelConfig) -> None:
    """The cache keeps one result per request, which a decoupled model's stream does not
    fit; as Triton does, refuse the load rather than serve the model with the cache its
    config asks for silently off. Also run once an ensemble's decoupling is known."""
    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"Response Cache does not currently support model {config.name} with "
            "'decoupled' transaction policy. Please disable the response cache.",
        )


def check(config: model_config_pb2.ModelConfig) -> None:
    """Refuse configs that cannot serve, with a reason a person can act on."""
    if config.max_batch_size < 0:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"'max_batch_size' must be non-negative value for {config.name}",
        )
    # After auto-complete, since a Python model's auto_complete_config may make it
    # decoupled.
    refuse_cache_when_decoupled(config)
    # No inputs is fine, as in Triton's core: a Python model may make its outputs itself
    # (qa's bls, custom_metrics); an ONNX model that needs inputs is refused by its
    # backend's own check against the file. No outputs is fine for a Python model too, as
    # Triton's Python backend loads one (its requests get empty responses); the other
    # backends here read their outputs off the config.
    if not config.output and config.backend != "python":
        raise ServerError(ErrorCode.INVALID_ARG, f"model '{config.name}' has no outputs")
    for entry in list(config.input) + list(config.output):
        if entry.data_type == model_config_pb2.TYPE_INVALID:
            raise ServerError(ErrorCode.INVALID_ARG, f"tensor '{entry.name}' has no data_type")
        if len(entry.dims) == 0:
            # Triton refuses empty dims even with a reshape (a scalar is dims [1] with an
            # empty reshape).
            raise ServerError(ErrorCode.INVALID_ARG, f"tensor '{entry.name}' has no dims")
    check_io_shapes(config)
    _check_instance_groups(config)
    # The last check: the fields Triton's proto has and ge-serve ignores, or refuses.
    for line in unhonoured.check(config):
        log.warning("%s", line)


def _check_instance_groups(config: model_config_pb2.ModelConfig) -> None:
    """Triton's ValidateInstanceGroup (model_config_utils.cc) for the kinds that name no
    device: KIND_CPU and KIND_MODEL groups may not list GPUs. KIND_GPU's ids are left to
    the backend (ge-serve reads them as NPU ids); ensembles have no instances."""
    if config.HasField("ensemble_scheduling"):
        return
    kinds = model_config_pb2.ModelInstanceGroup.Kind
    for group in config.instance_group:
        if group.gpus and group.kind in (kinds.KIND_CPU, kinds.KIND_MODEL):
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"instance group {group.name} of model {config.name} has kind "
                f"{kinds.Name(group.kind)} but specifies one or more GPUs",
            )
