"""The generate extension's JSON, mapped as Triton's HTTP front end maps it.

A generate request is one flat JSON object. Each top-level key that names an input of the
model becomes that input tensor; every other key becomes a request parameter. The key
`parameters` holds a nested object whose keys are mapped the same way (so a model input
may also be given there). `id` is the request id, and, like every key that is not an
input, also a parameter. Keys are mapped in the order they appear, so the first bad one
is the one reported; a key given twice for an input is refused.

An input's value is a scalar or a one-dimensional array; its datatype is the model's, and
its shape is deduced from the model's (metadata) shape: walking from the innermost
dimension, each fixed dimension takes its share of the element count, then the innermost
variable dimension (-1, the batch dimension included) takes what is left and any other
variable dimension is 1. A value that cannot be shaped so is refused.

A response is one flat JSON object too: `id` (when the request had one), `model_name`,
`model_version`, each response parameter, and each output by its name, keys in sorted
order. An output of one element is a scalar, any other a flat array; BYTES elements are
strings. The first of two keys with the same name wins, in that order.

Triton's own messages are kept where clients match on them (TritonJson's "attempt to
access JSON non-string as string" and the like). Where Triton reports a client's mistake
as an internal error (a value whose nesting does not fit its count), this is INVALID_ARG:
the client's request, not the server, is wrong. Integers out of their datatype's range are
refused here, where Triton truncates them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ..errors import ErrorCode, ServerError, invalid_arg
from ..inference.error_texts import MAX_JSON_DEPTH
from ..inference.reports import TensorMetadata
from ..inference.types import DataType, InferRequest, InferResponse, ParamValue, Tensor
from ..inference.wire import RAW_ONLY, bytes_elements, object_array
from . import codec
from .json_tensors import flatten_nested, float_array, literal_json

NESTED_PARAMETERS: Final = "parameters"
SSE_CONTENT_TYPE: Final = "text/event-stream; charset=utf-8"
EXACTLY_ONE: Final = (
    "generate expects model to produce exactly 1 response, use generate stream for model "
    "that generates various number of responses"
)

_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1
# Each BYTES element also carries its 4-byte length, as Triton counts the input size.
_BYTES_LENGTH_PREFIX: Final = 4
# The datatypes whose JSON may hold NaN and the infinities.
_FLOATS: Final = frozenset({DataType.FP32, DataType.FP64})

_NOT_STRING: Final = "attempt to access JSON non-string as string"
_NOT_BOOL: Final = "attempt to access JSON non-boolean as boolean"
_NOT_SIGNED: Final = "attempt to access JSON non-signed-integer as signed-integer"
_NOT_UNSIGNED: Final = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_NUMBER: Final = "attempt to access JSON non-number as double"
_NOT_OBJECT: Final = "attempt to access JSON non-object as object"


class _Object:
    """A JSON object as its (key, value) pairs in order, duplicates kept."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, Any]] | None = None) -> None:
        self.pairs = pairs or []


# --- requests -------------------------------------------------------------------------------


def parse_body(body: bytes) -> _Object:
    """The request's top-level object; an empty body is an empty object, as in Triton."""
    if not body.strip():
        return _Object()
    try:
        # NaN, Infinity and -Infinity are numbers, as in Triton's TritonJson.
        doc = json.loads(body, object_pairs_hook=_Object)
    except (ValueError, RecursionError) as exc:
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(doc, _Object):
        raise invalid_arg(f"the generate request JSON must be an object: {_NOT_OBJECT}")
    return doc


def decode_generate_request(
    model_name: str,
    model_version: str,
    body: bytes,
    inputs: Sequence[TensorMetadata],
    max_input_size: int,
) -> InferRequest:
    """A generate request body as the core's request for the model whose inputs (as its
    metadata gives them) are `inputs`. Errors are INVALID_ARG."""
    doc = parse_body(body)
    request = InferRequest(model_name=model_name, model_version=model_version)
    for key, value in doc.pairs:
        if key == "id":
            if not isinstance(value, str):
                raise invalid_arg(f"Unable to parse 'id': {_NOT_STRING}")
            request.id = value
    mapper = _Mapper(request, {spec.name: spec for spec in inputs}, max_input_size)
    for key, value in doc.pairs:
        if key == NESTED_PARAMETERS:
            mapper.nested(key, value)
        else:
            mapper.exact(key, value)
    return request


class _Mapper:
    """Maps keys into one request: inputs by name, everything else to parameters."""

    def __init__(
        self, request: InferRequest, inputs: Mapping[str, TensorMetadata], max_input_size: int
    ) -> None:
        self.request = request
        self.inputs = inputs
        self.max_input_size = max_input_size
        self.consumed = 0

    def nested(self, key: str, value: Any) -> None:
        if key in self.inputs:
            raise invalid_arg(f"Keyword '{key}' for nested schema also given as input tensor name")
        if not isinstance(value, _Object):
            raise invalid_arg(f"Expected JSON object for keyword: '{key}': {_NOT_OBJECT}")
        try:
            for name, item in value.pairs:
                self.exact(name, item)
        except ServerError as exc:
            raise invalid_arg(f"Converting keyword: '{key}': {exc.message}") from None

    def exact(self, key: str, value: Any) -> None:
        spec = self.inputs.get(key)
        if spec is None:
            self.request.parameters[key] = _parameter(key, value)
            return
        if any(tensor.name == key for tensor in self.request.inputs):
            raise invalid_arg(f"input '{key}' already exists in request")
        self.request.inputs.append(self._tensor(spec, value))

    def _tensor(self, spec: TensorMetadata, value: Any) -> Tensor:
        name, datatype = spec.name, spec.datatype
        count = len(value) if isinstance(value, list) else 1
        flat = _flatten(value, name)
        if datatype is DataType.BYTES:
            if not all(isinstance(item, str) for item in flat):
                raise invalid_arg(f"Unable to parse JSON bytes array: {_NOT_STRING}")
            encoded = [item.encode("utf-8") for item in flat]
            size = sum(len(item) + _BYTES_LENGTH_PREFIX for item in encoded)
        else:
            encoded = []
            size = count * datatype.itemsize
        if self.consumed + size > self.max_input_size:
            raise invalid_arg(
                f"request size of {self.consumed} bytes with input '{name}' of size {size} "
                f"bytes exceeds the maximum allowed input size of {self.max_input_size}. Use "
                "--http-max-input-size to increase the limit."
            )
        self.consumed += size
        shape = deduce_shape(spec.shape, count, name)
        if len(flat) > count:
            raise invalid_arg(
                "Unable to parse 'data': Shape does not match true shape of 'data' field"
            )
        if len(flat) < count:
            raise invalid_arg("Failed to parse 'data' field: shape does not match true shape")
        if datatype is DataType.BYTES:
            data = object_array(encoded)
        else:
            data = _to_numpy(name, datatype, flat)
        return Tensor(name, datatype, shape, data.reshape(shape))


def deduce_shape(dims: Sequence[int], count: int, name: str) -> tuple[int, ...]:
    """The shape of `count` elements for an input of (metadata) shape `dims`: fixed
    dimensions take their share from the innermost out, then the innermost variable one
    takes the rest and any other variable one is 1."""
    shape = list(dims)
    left = count
    for dim in reversed(shape):
        if dim == -1:
            continue
        if dim == 0:
            if left:
                raise _unshapeable(name)
            continue
        if left % dim:
            raise _unshapeable(name)
        left //= dim
    for index in range(len(shape) - 1, -1, -1):
        if shape[index] == -1:
            shape[index] = left
            left = 1
    if left != 1 and not (left == 0 and 0 in shape):
        raise _unshapeable(name)
    return tuple(shape)


def _unshapeable(name: str) -> ServerError:
    return invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")


def _parameter(key: str, value: Any) -> ParamValue:
    if isinstance(value, str | bool):
        return value
    if isinstance(value, int):
        return value if _INT64_MIN <= value <= _INT64_MAX else float(value)
    if isinstance(value, float):
        return value
    raise invalid_arg(
        f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
    )


def _flatten(value: Any, name: str) -> list[Any]:
    """The leaves of a value, row-major; a scalar is one leaf. Nesting is refused past
    the depth infer's JSON `data` allows."""
    if not isinstance(value, list):
        return [value]
    return flatten_nested(
        value,
        lambda: invalid_arg(
            f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH}) in input '{name}'"
        ),
    )


def _to_numpy(name: str, datatype: DataType, flat: list[Any]) -> npt.NDArray[Any]:
    if datatype in RAW_ONLY:
        raise invalid_arg(
            f"receiving {datatype.value} data via JSON is not supported. Please use the "
            f"binary data format for input {name}"
        )
    if datatype is DataType.BOOL:
        if not all(isinstance(item, bool) for item in flat):
            raise _unparsable(_NOT_BOOL)
        return np.array(flat, dtype=np.bool_)
    if datatype.numpy.kind in "iu":
        unsigned = datatype.numpy.kind == "u"
        for item in flat:
            if isinstance(item, bool) or not isinstance(item, int) or (unsigned and item < 0):
                raise _unparsable(_NOT_UNSIGNED if unsigned else _NOT_SIGNED)
        if flat:
            info = np.iinfo(datatype.numpy)
            low, high = min(flat), max(flat)
            if low < info.min or high > info.max:
                bad = low if low < info.min else high
                raise invalid_arg(
                    f"input '{name}': value {bad} is out of range for {datatype.value}"
                )
        return np.array(flat, dtype=datatype.numpy)
    for item in flat:
        if isinstance(item, bool) or not isinstance(item, int | float):
            raise _unparsable(_NOT_NUMBER)
    return float_array(flat, datatype, name)


def _unparsable(message: str) -> ServerError:
    return invalid_arg(f"Unable to parse 'data': {message}")


# --- responses ------------------------------------------------------------------------------


def encode_generate_response(response: InferResponse) -> bytes:
    """One response as the generate extension's JSON object."""
    entries: dict[str, Any] = {}
    if response.id:
        entries["id"] = response.id
    entries["model_name"] = response.model_name
    entries["model_version"] = response.model_version
    for key, value in response.parameters.items():
        entries.setdefault(key, value)
    for tensor in response.outputs:
        if tensor.name not in entries:
            entries[tensor.name] = _output_value(tensor)
    return codec.encode_json(dict(sorted(entries.items())))


def _output_value(tensor: Tensor) -> Any:
    if tensor.datatype in RAW_ONLY:
        raise invalid_arg(
            f"sending {tensor.datatype.value} data via JSON is not supported. Please use the "
            "binary data format for output"
        )
    count = math.prod(tensor.shape)
    if tensor.data.size != count:
        raise ServerError(
            ErrorCode.INTERNAL,
            f"output '{tensor.name}' has {tensor.data.size} elements, but its shape "
            f"{list(tensor.shape)} needs {count}",
        )
    values: Any
    if tensor.datatype is DataType.BYTES:
        try:
            values = [item.decode("utf-8") for item in bytes_elements(tensor.data)]
        except UnicodeDecodeError:
            raise invalid_arg(
                f"output '{tensor.name}' holds BYTES that are not UTF-8 text, which the "
                "generate extension's JSON cannot carry; use the infer endpoint"
            ) from None
    else:
        values = np.ascontiguousarray(tensor.data, dtype=tensor.datatype.numpy).reshape(-1)
        if tensor.datatype in _FLOATS and not np.isfinite(values).all():
            return literal_json(values, scalar=count == 1)
    return values[0] if count == 1 else values


def error_json(message: str) -> bytes:
    return codec.encode_json({"error": message})


def sse_event(data: bytes) -> bytes:
    """One Server-Sent Event carrying a JSON document."""
    return b"data: " + data + b"\n\n"
