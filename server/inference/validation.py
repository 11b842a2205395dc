"""Checking a request against its model's config, and shaping the response.

Messages follow Triton's wording where clients are known to match on them.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np

from ge_serve.scheduler.correlation import sequence_flags
from ge_serve.scheduler.work import Array, WorkItem

from ..errors import ErrorCode, ServerError, invalid_arg
from . import error_texts
from .error_texts import InputRef, request_tag
from .model import ModelVersion, TensorSpec
from .types import DataType, InferRequest, InferResponse, RequestedOutput, Tensor


def _dims_str(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def prepare(request: InferRequest, model: ModelVersion) -> WorkItem:
    """Validate a request and turn it into the scheduler's work item."""
    inputs = request.inputs
    tag = request_tag(request.id)
    if len(inputs) == 1 and inputs[0].parameters.get("raw_binary"):
        inputs = [_resolve_raw_binary(inputs[0], model, request.id)]
    names = [tensor.name for tensor in inputs]
    required = sum(not spec.optional for spec in model.inputs.values())
    if len(set(names)) == len(names) < required:
        # Triton counts the inputs before it looks at any one (ValidateRequestInputs): too
        # few is said first, even of a request whose inputs are also wrong otherwise.
        _check_missing(request.id, model, names)
    mbs = model.max_batch_size
    arrays: dict[str, Array] = {}
    batch_size = 0
    for tensor in inputs:
        spec = model.inputs.get(tensor.name)
        if spec is None:
            raise invalid_arg(
                f"{tag}unexpected inference input '{tensor.name}' for model '{model.name}'"
            )
        if tensor.name in arrays:
            raise error_texts.duplicate_input(request.id, tensor.name)
        if tensor.datatype is not spec.datatype:
            raise invalid_arg(
                f"{tag}inference input '{tensor.name}' data-type is '{tensor.datatype.value}', "
                f"but model '{model.name}' expects '{spec.datatype.value}'"
            )
        shape = tuple(tensor.shape)
        if shape and min(shape) < 0:
            raise invalid_arg(f"input '{tensor.name}' has a negative dimension in its shape")
        if mbs > 0:
            if not shape:
                raise invalid_arg(
                    f"{tag}input '{tensor.name}' has no shape but model requires batch "
                    f"dimension for '{model.name}'"
                )
            this_batch = shape[0]
            if this_batch < 1 or this_batch > mbs:
                raise invalid_arg(
                    f"{tag}inference request batch-size must be <= {mbs} for '{model.name}'"
                    if this_batch > mbs
                    else f"{tag}inference request batch-size must be >= 1 for '{model.name}'"
                )
            if batch_size and this_batch != batch_size:
                raise invalid_arg(
                    f"{tag}input '{tensor.name}' batch size does not match other inputs for "
                    f"'{model.name}'"
                )
            batch_size = this_batch
            item_dims = shape[1:]
        else:
            item_dims = shape
        if item_dims != spec.dims and not _dims_match(item_dims, spec.dims):
            ref = InputRef(tensor.name, model.name, request.id)
            raise error_texts.unexpected_shape(ref, spec.dims, shape, mbs > 0)
        array = _as_array(tensor, spec, shape, model.name, request.id)
        if spec.model_dims is not None:
            lead = (shape[0],) if mbs > 0 else ()
            try:
                array = array.reshape(lead + spec.model_dims)
            except ValueError:
                raise invalid_arg(
                    f"input '{tensor.name}' cannot be reshaped to {_dims_str(spec.model_dims)}"
                ) from None
        arrays[tensor.name] = array
    # Every input given is one of the model's, once: when there are as many, none is missing.
    _check_missing(request.id, model, list(arrays))
    for requested in request.outputs:
        _check_output(requested, model)
    # A model without sequence_batching serves a request that names a sequence and leaves
    # the ID and flags alone, as Triton does (InferenceRequest::ValidateCorrelationId runs
    # for sequence models only): an ensemble passes them on to its steps, and clients send
    # them to plain models (Triton's qa sends sequence flags through ensembles of them).
    sequence = sequence_flags(request.parameters) if request.parameters else None
    return WorkItem(
        inputs=arrays,
        batch_size=batch_size if mbs > 0 else 1,
        priority=request.priority,
        timeout_us=request.timeout_us,
        sequence=sequence,
    )


def _check_missing(request_id: str, model: ModelVersion, given: list[str]) -> None:
    """Triton's message for a request without every required input."""
    missing = len(given) < len(model.inputs) and [
        name for name, spec in model.inputs.items() if name not in given and not spec.optional
    ]
    if not missing:
        return
    required = sum(not s.optional for s in model.inputs.values())
    count = (
        f"expected {required} inputs"
        if required == len(model.inputs)
        else f"expected number of inputs between {required} and {len(model.inputs)}"
    )
    raise invalid_arg(
        f"{request_tag(request_id)}{count} but got {len(given)} inputs for model "
        f"'{model.name}'. Got input(s) {_names(sorted(given))}, but missing required "
        f"input(s) {_names(missing)}. Please provide all required input(s)."
    )


def _names(names: list[str]) -> str:
    """Triton's list of names: ['a','b']."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def _dims_match(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
    if len(got) != len(want):
        return False
    return all(w == -1 or g == w for g, w in zip(got, want, strict=True))


def _as_array(
    tensor: Tensor, spec: TensorSpec, shape: tuple[int, ...], model: str, request_id: str
) -> Array:
    array = tensor.data
    expected = spec.datatype.numpy
    if array.dtype != expected:
        if spec.datatype is DataType.BYTES and array.dtype.kind in ("S", "U"):
            array = array.astype(object)
        else:
            raise invalid_arg(
                f"input '{tensor.name}' holds {array.dtype} data, not {spec.datatype.value}"
            )
    if array.shape != shape:
        if array.size != math.prod(shape):
            ref = InputRef(tensor.name, model, request_id)  # only for the error
            if spec.datatype is DataType.BYTES:
                raise error_texts.too_few_strings(ref, math.prod(shape), array.size)
            itemsize = spec.datatype.itemsize
            raise error_texts.input_byte_size(ref, math.prod(shape) * itemsize, array.nbytes)
        array = array.reshape(shape)
    return array


def _resolve_raw_binary(tensor: Tensor, model: ModelVersion, request_id: str) -> Tensor:
    """A raw-binary body is the single input of a single-input model, as batch 1; its
    shape is deduced from the config's dims as Triton's core does."""
    if len(model.inputs) != 1:
        raise error_texts.raw_input_count(request_id, 1, len(model.inputs), model.name)
    spec = next(iter(model.inputs.values()))
    raw: bytes = tensor.data.tobytes()
    lead: tuple[int, ...] = (1,) if model.max_batch_size > 0 else ()
    unknown = [i for i, d in enumerate(spec.dims) if d == -1]
    if len(unknown) > 1:
        raise error_texts.raw_shape_not_deducible(request_id, spec.name)
    if spec.datatype is DataType.BYTES:
        if unknown or math.prod(spec.dims) != 1:
            raise error_texts.raw_bytes_shape(request_id, spec.name)
        data = np.empty(1, dtype=object)
        data[0] = raw
        return Tensor(spec.name, spec.datatype, lead + spec.dims, data.reshape(lead + spec.dims))
    known = math.prod(d for d in spec.dims if d != -1)
    dims = spec.dims
    if unknown:
        # Triton divides down; a remainder is then the byte-size mismatch below.
        dims = tuple(len(raw) // known // spec.datatype.itemsize if d == -1 else d for d in dims)
    ref = InputRef(spec.name, model.name, request_id)
    expected = math.prod(lead + dims) * spec.datatype.itemsize
    if expected != len(raw):
        raise error_texts.input_byte_size(ref, expected, len(raw))
    array = np.frombuffer(tensor.data, dtype=spec.datatype.numpy).reshape(lead + dims)
    return Tensor(spec.name, spec.datatype, lead + dims, array)


def _check_output(requested: RequestedOutput, model: ModelVersion) -> None:
    spec = model.outputs.get(requested.name)
    if spec is None:
        # No request id: Triton's core says it from Model::GetOutput, without LogRequest().
        raise invalid_arg(
            f"unexpected inference output '{requested.name}' for model '{model.name}'"
        )
    if requested.classification < 0:
        raise invalid_arg("classification count must be non-negative")
    if requested.classification and spec.datatype in _UNCLASSIFIED:
        # Triton's words (server src/classification.cc), which name no output. Triton says
        # them once the model has run, building the response; the client sees the same.
        raise invalid_arg(
            f"class result not available for output due to unsupported type '{spec.datatype.value}'"
        )


# The datatypes Triton's TopkClassifications has no case for: it ranks only integers,
# FP32 and FP64.
_UNCLASSIFIED: Final = frozenset({DataType.BOOL, DataType.FP16, DataType.BF16, DataType.BYTES})


def build_response(
    request: InferRequest, model: ModelVersion, outputs: dict[str, Array], batch_size: int
) -> InferResponse:
    """Select the requested outputs, restore their config shapes and apply classification.

    A requested output the model did not produce is left out of the response, as Triton
    leaves it out: a Python model's response carries only the tensors it made (the stub
    prunes the rest, infer_response.cc), and an ensemble answers without an output its
    steps did not write. Only those two can leave one out; the other backends run every
    output of the config."""
    wanted = request.outputs or model.all_outputs
    result: list[Tensor] = []
    for requested in wanted:
        spec = model.outputs[requested.name]
        array = outputs.get(requested.name)
        if array is None:
            continue
        if spec.model_dims is not None:
            lead = (batch_size,) if model.max_batch_size > 0 else ()
            array = array.reshape(lead + spec.dims)
        if requested.classification:
            array = classify(array, requested.classification, model.labels.get(spec.name), model)
            datatype = DataType.BYTES
        else:
            datatype = spec.datatype
            if array.dtype != datatype.numpy and datatype is not DataType.BYTES:
                array = _as_config_type(array, datatype, spec.name, model.name)
        # The request's output parameters are not echoed: Triton's response outputs carry
        # only `binary_data_size` (http_server.cc), and clients that compare the JSON
        # (SageMaker's among them) see exactly that.
        result.append(Tensor(requested.name, datatype, tuple(array.shape), array))
    return InferResponse(
        model_name=model.name, model_version=model.version_str, id=request.id, outputs=result
    )


def _as_config_type(array: Array, datatype: DataType, output: str, model: str) -> Array:
    """An output in its config's datatype. Converted as before (INT64 for INT32, FP64 for
    FP32, UINT8 for BOOL), unless an integer or boolean datatype cannot hold the values:
    FP64 1.5 for INT32 would answer 1, 300 for UINT8 44. That is the model's error, named,
    not a changed answer."""
    target = datatype.numpy
    try:
        converted = array.astype(target)
    except (TypeError, ValueError) as exc:
        raise ServerError(
            ErrorCode.INTERNAL,
            f"model '{model}' produced output '{output}' as numpy {array.dtype}, which is "
            f"not {datatype.value}: {exc}",
        ) from None
    if target.kind in "iub" and not np.array_equal(converted, array):
        raise ServerError(
            ErrorCode.INTERNAL,
            f"model '{model}' produced output '{output}' as numpy {array.dtype}, with values "
            f"its config's {datatype.value} cannot hold",
        )
    return converted


# Elements of one batch item's output that classification sorts at most (Triton's
# kMaxClassificationElements, server src/classification.cc).
MAX_CLASSIFICATION_ELEMENTS: Final = 1_000_000


def classify(array: Array, k: int, labels: list[str] | None, model: ModelVersion) -> Array:
    """Top-k as BYTES "value:index[:label]", per batch item when the model batches."""
    batched = model.max_batch_size > 0
    rows = array.reshape(array.shape[0], -1) if batched else array.reshape(1, -1)
    if rows.shape[1] > MAX_CLASSIFICATION_ELEMENTS:
        raise invalid_arg("classification output tensor too large")
    k = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=object)
    for r, row in enumerate(rows):
        order = _descending(row)[:k]
        for j, index in enumerate(order):
            text = f"{_format_value(row[index])}:{int(index)}"
            # An empty label line adds nothing, as in Triton (it has no label for the class).
            if labels is not None and index < len(labels) and labels[index]:
                text += f":{labels[index]}"
            # surrogateescape: a labels file's bytes that are not UTF-8 go out as they were.
            out[r, j] = text.encode("utf-8", "surrogateescape")
    return out if batched else out.reshape(k)


def _descending(row: Array) -> Array:
    """Indices by value, highest first, ties in index order, compared in the output's own
    type as Triton compares: through float64, INT64 and UINT64 values past 2**53 would tie
    or swap, and negating an integer row would wrap its extremes."""
    if row.dtype.kind == "f":
        return np.argsort(-row, kind="stable")
    # Stable ascending over the reversed row, read backwards: ties come out lowest index first.
    return len(row) - 1 - np.argsort(row[::-1], kind="stable")[::-1]


def _format_value(value: Any) -> str:
    if isinstance(value, np.integer | int):
        return str(int(value))
    return f"{float(value):f}"
