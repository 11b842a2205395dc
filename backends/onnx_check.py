"""Checking a model config against an ONNX model's inputs and outputs at load time.

Shared by the backends that run ONNX models (onnxruntime on the host, GE on the NPU): a
config that contradicts the model must fail the load with a reason, as Triton's
onnxruntime backend refuses it (ValidateInputs / ValidateOutputs), not load READY and
then fail every request. The texts are Triton's, which its qa tests grep for.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ge_serve.protos import model_config_pb2

from .onnx_io import TensorInfo
from .scheduled_io import fed_inputs


def check_config_fits(
    name: str,
    config: model_config_pb2.ModelConfig,
    inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo],
    overridable: Sequence[TensorInfo] = (),
) -> None:
    """ValueError when the config's tensors do not fit the model's.

    The model's inputs must be the config's inputs with what the scheduler feeds
    (sequence controls, states, batch inputs); every configured tensor must be a model
    tensor of the same datatype (TYPE_INVALID in `inputs`/`outputs`: not known, not
    checked), and of the same rank and fixed dims where the model declares a shape (a
    rank-0 model tensor, unknown or scalar, is not checked; a config -1 takes any size;
    the batch dim, with max_batch_size > 0, takes any model dim, as a fixed-batch model
    may run row by row). Ragged inputs and batch outputs' targets are batched as one
    flat tensor, so any rank goes for them.

    `overridable` are the model's overridable initializers (graph inputs with a stored
    value): the config may list them as `optional` inputs, which a request may leave out
    to use the stored value. As in Triton, optional inputs are not counted among the
    inputs the model must take, and a batching model takes none (a batch cannot mix rows
    with and without one).
    """
    required = {entry.name for entry in config.input if not entry.optional}
    required |= fed_inputs(config)
    model_names = {info.name for info in inputs}
    if len(required) != len(model_names):
        raise ValueError(
            f"unable to load model '{name}', configuration expects {len(required)} "
            f"inputs, model provides {len(model_names)}"
        )
    flat = {entry.name for entry in config.input if entry.allow_ragged_batch}
    flat.update(target for output in config.batch_output for target in output.target_name)
    sides = (
        ("input", config.input, [*inputs, *overridable]),
        ("output", config.output, outputs),
    )
    for kind, entries, infos in sides:
        by_name = {info.name: info for info in infos}
        for entry in entries:
            optional = isinstance(entry, model_config_pb2.ModelInput) and entry.optional
            if optional and config.max_batch_size > 0:
                raise ValueError(
                    f"unable to load model '{name}', optional input '{entry.name}' is not "
                    "supported for models that support batching"
                )
            info = by_name.get(entry.name)
            if info is None:
                raise ValueError(
                    f"unexpected inference {kind} '{entry.name}', allowed {kind}s are: "
                    f"{', '.join(sorted(by_name))}"
                )
            if info.data_type not in (model_config_pb2.TYPE_INVALID, entry.data_type):
                raise ValueError(
                    f"unable to load model '{name}', configuration expects datatype "
                    f"{model_config_pb2.DataType.Name(entry.data_type)} for {kind} "
                    f"'{entry.name}', model provides "
                    f"{model_config_pb2.DataType.Name(info.data_type)}"  # type: ignore[arg-type]
                )
            if entry.name not in flat and info.dims:
                dims = entry.reshape.shape if entry.HasField("reshape") else entry.dims
                _check_dims(name, entry.name, info.dims, list(dims), config.max_batch_size)
    missing = sorted(model_names - required)
    left_out = [entry.name for entry in config.input if entry.name in missing]
    if left_out:
        # Triton's count lets this through (an overridable initializer listed as a
        # required input makes up the count), and onnxruntime then fails every request
        # that leaves the optional input out.
        raise ValueError(
            f"unable to load model '{name}', optional input(s) {left_out} are required "
            "by the model: only an overridable initializer may be optional"
        )
    if missing:
        # Equal counts, yet a fed name (a sequence control, a state) is not a model input.
        raise ValueError(f"the model's input(s) {missing} are missing from the config")


def _check_dims(
    model: str, tensor: str, shape: tuple[int, ...], dims: list[int], max_batch_size: int
) -> None:
    full = [-1, *dims] if max_batch_size > 0 else dims
    skip = 1 if max_batch_size > 0 else 0  # the batch dim
    fits = len(shape) == len(full) and all(
        m == -1 or c == -1 or m == c for c, m in zip(full[skip:], shape[skip:], strict=True)
    )
    if fits:
        return
    if max_batch_size > 0:
        specified = (
            f"{len(full)} dimensions (an initial batch dimension because max_batch_size > 0 "
            f"followed by the explicit tensor shape, making complete shape {_shape(full)})"
        )
    else:
        specified = f"{len(full)} dimensions (shape {_shape(full)})"
    raise ValueError(
        f"model '{model}', tensor '{tensor}': the model expects {len(shape)} dimensions "
        f"(shape {_shape(shape)}) but the model configuration specifies {specified}"
    )


def _shape(dims: Iterable[int]) -> str:
    """Triton's ShapeToString: [-1,16]."""
    return "[" + ",".join(str(d) for d in dims) + "]"
