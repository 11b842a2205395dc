"""Config auto-completion: backend choice, tensors from the model file, scheduler defaults."""

from __future__ import annotations

from pathlib import Path

from ge_serve.backends.base import Backend
from ge_serve.protos import model_config_pb2

from .errors import ErrorCode, ServerError

# Names a config may use for a backend, mapped to the backend that serves them.
BACKEND_ALIASES = {
    "onnxruntime": "onnxruntime",
    "onnxruntime_onnx": "onnxruntime",
    "ge": "ge",
    "npu_ge": "ge",
}


def resolve_backend(
    config: model_config_pb2.ModelConfig, backends: dict[str, Backend], default: str
) -> Backend:
    """Pick the backend: `backend`, then `platform`, then the default for ONNX files.

    A config that names no backend goes to the default, except KIND_CPU instance groups,
    which mean the host CPU (onnxruntime) as they do in Triton.
    """
    named = config.backend or config.platform
    if named:
        key = BACKEND_ALIASES.get(named)
        if key is None:
            raise ServerError(
                ErrorCode.UNSUPPORTED,
                f"backend '{named}' is not supported; available: {sorted(BACKEND_ALIASES)}",
            )
    else:
        only_cpu = bool(config.instance_group) and all(
            g.kind == model_config_pb2.ModelInstanceGroup.KIND_CPU for g in config.instance_group
        )
        key = "onnxruntime" if only_cpu else default
    backend = backends.get(key)
    if backend is None:
        raise ServerError(ErrorCode.UNAVAILABLE, f"backend '{key}' is not available")
    return backend


def model_file(config: model_config_pb2.ModelConfig, backend: Backend, version_dir: Path) -> Path:
    return version_dir / (config.default_model_filename or backend.default_model_filename())


def complete(
    config: model_config_pb2.ModelConfig, backend: Backend, model_path: Path, from_file: bool
) -> None:
    """Fill what the config leaves out. `from_file=False` (auto-complete off) skips the
    model file but still applies the defaults every Triton config ends up with."""
    if from_file:
        if not model_path.exists():
            raise ServerError(ErrorCode.INVALID_ARG, f"model file '{model_path}' does not exist")
        try:
            backend.autocomplete(config, model_path)
        except ValueError as exc:
            raise ServerError(ErrorCode.INVALID_ARG, str(exc)) from None
        if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
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
    if not config.backend and not config.platform:
        config.backend = backend.name
    if not config.instance_group:
        group = config.instance_group.add()
        group.name = config.name
        group.count = 1
        group.kind = (
            model_config_pb2.ModelInstanceGroup.KIND_CPU
            if backend.name == "onnxruntime"
            else model_config_pb2.ModelInstanceGroup.KIND_GPU
        )
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.count < 1:
            group.count = 1
    if not config.default_model_filename:
        config.default_model_filename = model_path.name


def check(config: model_config_pb2.ModelConfig) -> None:
    """Refuse configs that cannot serve, with a reason a person can act on."""
    if config.max_batch_size < 0:
        raise ServerError(ErrorCode.INVALID_ARG, "max_batch_size must be >= 0")
    if not config.input:
        raise ServerError(ErrorCode.INVALID_ARG, f"model '{config.name}' has no inputs")
    if not config.output:
        raise ServerError(ErrorCode.INVALID_ARG, f"model '{config.name}' has no outputs")
    for entry in list(config.input) + list(config.output):
        if entry.data_type == model_config_pb2.TYPE_INVALID:
            raise ServerError(ErrorCode.INVALID_ARG, f"tensor '{entry.name}' has no data_type")
        if len(entry.dims) == 0 and not entry.HasField("reshape"):
            raise ServerError(ErrorCode.INVALID_ARG, f"tensor '{entry.name}' has no dims")
