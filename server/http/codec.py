"""The HTTP wire codec: KServe v2 JSON plus Triton's binary tensor data extension.

Pure functions between request/response bodies and the central types; no I/O. Binary input
tensors are zero-copy, read-only `np.frombuffer` views into the request body, so they live
as long as the body does.

Binary data is little-endian; like numpy's native dtypes on every host we run on (x86-64 and
aarch64), so fixed-size tensors travel as their raw memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from ..control.sharedmemory import (
    IN_SHARED_MEMORY,
    SHARED_MEMORY_REGION,
    lift_output_ref,
    parse_ref,
)
from ..errors import ErrorCode, ServerError, invalid_arg
from ..inference import error_texts
from ..inference.error_texts import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from ..inference.error_texts import InputRef
from ..inference.types import (
    DataType,
    InferRequest,
    InferResponse,
    Parameters,
    RequestedOutput,
    Tensor,
    check_shape,
    lift_request_parameters,
    requested_output,
)
from ..inference.wire import RAW_ONLY, bytes_elements, object_array, raw_to_array, tensor_to_raw

INFERENCE_HEADER_CONTENT_LENGTH: Final = "Inference-Header-Content-Length"
BINARY_DATA_SIZE: Final = "binary_data_size"
BINARY_DATA: Final = "binary_data"
BINARY_DATA_OUTPUT: Final = "binary_data_output"
# Marks the placeholder input of a raw-binary request; see decode_infer_request.
RAW_BINARY: Final = "raw_binary"

_PARAM_TYPES: Final = (bool, int, float, str)
_INTEGER_TYPES: Final = frozenset(
    {
        DataType.UINT8,
        DataType.UINT16,
        DataType.UINT32,
        DataType.UINT64,
        DataType.INT8,
        DataType.INT16,
        DataType.INT32,
        DataType.INT64,
    }
)
_FP32_MAX: Final = float(np.finfo(np.float32).max)
# Each integer datatype's (min, max), looked up once rather than by np.iinfo per input.
_INTEGER_RANGE: Final = {t: (np.iinfo(t.numpy).min, np.iinfo(t.numpy).max) for t in _INTEGER_TYPES}


# --- JSON helpers ---------------------------------------------------------------------------


def encode_json(obj: Any) -> bytes:
    """Serialize `obj` with orjson; numpy arrays and scalars are accepted."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def decode_json_object(body: bytes | memoryview, what: str) -> dict[str, Any]:
    """Parse a JSON object; malformed JSON or a non-object is INVALID_ARG.

    `what` names the document in messages: "failed to parse the <what> JSON buffer: ...".
    """
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise invalid_arg(f"failed to parse the {what} JSON buffer: {e}") from None
    if not isinstance(obj, dict):
        raise invalid_arg(f"the {what} JSON must be an object, not {_json_kind(obj)}")
    return obj


def parse_header_length(value: str | None) -> int | None:
    """Parse the `Inference-Header-Content-Length` header value (None when absent)."""
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise invalid_arg(
            f"invalid {INFERENCE_HEADER_CONTENT_LENGTH} header value '{value}'"
        ) from None


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# --- requests -------------------------------------------------------------------------------


def decode_infer_request(
    model_name: str, model_version: str, body: bytes, header_length: int | None
) -> InferRequest:
    """Build an InferRequest from an HTTP infer body.

    `header_length` is the `Inference-Header-Content-Length` value, None when the header is
    absent (then the whole body is JSON). Otherwise the first `header_length` bytes are the
    JSON header and the rest is binary tensor data in input order, each input with a
    `binary_data_size` parameter taking that many bytes.

    Raw-binary request (`header_length == 0`): the whole body is the bare tensor of a
    single-input model. The codec cannot know that input, so it returns a request with one
    placeholder input: name "", datatype UINT8, shape `(len(body),)`, data a uint8 view of
    the body, and parameters `{"raw_binary": True}`. The core resolves it against the model
    config: it renames it to the model's single input and reinterprets the bytes as that
    input's datatype, with batch 1.

    An input with `shared_memory_region` parameters has no data here: its tensor carries
    the reference (`Tensor.shm`) and the core maps it.

    Errors are ServerError INVALID_ARG.
    """
    if header_length == 0:
        return _raw_binary_request(model_name, model_version, body)
    view = memoryview(body)
    if header_length is None:
        header, binary = view, view[len(view) :]
    else:
        if header_length < 0 or header_length > len(body):
            raise invalid_arg(
                f"invalid {INFERENCE_HEADER_CONTENT_LENGTH} {header_length}: the request body "
                f"has {len(body)} bytes"
            )
        header, binary = view[:header_length], view[header_length:]
    doc = decode_json_object(header, "request")

    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise invalid_arg(f"the request 'id' must be a string, not {_json_kind(request_id)}")
    request = InferRequest(
        model_name=model_name,
        model_version=model_version,
        id=request_id,
        inputs=_decode_inputs(doc, binary, header_length is not None, model_name, request_id),
        outputs=_decode_outputs(doc.get("outputs"), request_id),
        parameters=_parameters(doc.get("parameters"), "the request"),
    )
    if BINARY_DATA_OUTPUT in request.parameters:
        request.wire[BINARY_DATA_OUTPUT] = request.parameters.pop(BINARY_DATA_OUTPUT)
    lift_request_parameters(request)
    return request


def _raw_binary_request(model_name: str, model_version: str, body: bytes) -> InferRequest:
    data = np.frombuffer(body, dtype=np.uint8)
    placeholder = Tensor(
        name="",
        datatype=DataType.UINT8,
        shape=(len(body),),
        data=data,
        parameters={RAW_BINARY: True},
    )
    # Triton answers a raw-binary request with binary outputs.
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=[placeholder],
        wire={BINARY_DATA_OUTPUT: True},
    )


def _parameters(raw: Any, where: str) -> Parameters:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise invalid_arg(f"'parameters' of {where} must be a JSON object, not {_json_kind(raw)}")
    for key, value in raw.items():
        if not isinstance(value, _PARAM_TYPES):
            raise invalid_arg(
                f"parameter '{key}' of {where} must be a boolean, number or string, not "
                f"{_json_kind(value)}"
            )
    # orjson built a fresh dict of exactly these value types.
    return raw


def _decode_inputs(
    doc: dict[str, Any], binary: memoryview, has_binary: bool, model_name: str, request_id: str
) -> list[Tensor]:
    specs = doc.get("inputs")
    if specs is None:
        raise invalid_arg("the request JSON has no 'inputs'")
    if not isinstance(specs, list):
        raise invalid_arg(f"'inputs' must be an array, not {_json_kind(specs)}")
    tensors: list[Tensor] = []
    names: set[str] = set()
    offset = 0
    for index, spec in enumerate(specs):
        place = _Place(binary, offset, has_binary, model_name, request_id)
        tensor, offset = _decode_input(index, spec, place)
        if tensor.name in names:
            raise error_texts.duplicate_input(request_id, tensor.name)
        names.add(tensor.name)
        tensors.append(tensor)
    if offset != len(binary):
        raise error_texts.additional_input_data(model_name)
    return tensors


class _Place:
    """Where an input's data is: the binary part of the body, from `offset`."""

    __slots__ = ("binary", "has_binary", "model", "offset", "request_id")

    def __init__(
        self, binary: memoryview, offset: int, has_binary: bool, model: str, request_id: str
    ) -> None:
        self.binary = binary
        self.offset = offset
        self.has_binary = has_binary
        self.model = model
        self.request_id = request_id


def _decode_input(index: int, spec: Any, place: _Place) -> tuple[Tensor, int]:
    if not isinstance(spec, dict):
        raise invalid_arg(f"input {index} must be a JSON object, not {_json_kind(spec)}")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_arg(f"input {index} has no 'name'")
    datatype_name = spec.get("datatype")
    if not isinstance(datatype_name, str):
        raise invalid_arg(f"input '{name}' has no 'datatype'")
    datatype = DataType.parse(datatype_name)
    shape = _shape(spec.get("shape"), name, datatype.itemsize)
    params = _parameters(spec.get("parameters"), f"input '{name}'")
    shm = parse_ref(params, name)
    size = params.pop(BINARY_DATA_SIZE, None)
    has_data = "data" in spec
    offset = place.offset

    if shm is not None:
        if has_data or size is not None:
            given = [("'data'", has_data), ("'binary_data_size'", size is not None)]
            raise invalid_arg(
                "Input must set only one of the following fields: 'data', 'binary_data_size' "
                "in 'parameters', 'shared_memory_region' in 'parameters'. But set "
                + " ".join(field for field, present in given if present)
                + f" '{SHARED_MEMORY_REGION}' (input '{name}')"
            )
        data = IN_SHARED_MEMORY
    elif size is not None:
        if has_data:
            raise invalid_arg(f"input '{name}' has both 'data' and a 'binary_data_size' parameter")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise invalid_arg(
                f"'binary_data_size' of input '{name}' must be a non-negative integer"
            )
        ref = InputRef(name, place.model, place.request_id)
        data = _binary_input(ref, datatype, shape, place, size)
        offset += size
    elif has_data:
        data = _json_input(
            InputRef(name, place.model, place.request_id), datatype, shape, spec["data"]
        )
    else:
        raise invalid_arg(f"input '{name}' has neither 'data' nor a 'binary_data_size' parameter")
    tensor = Tensor(name=name, datatype=datatype, shape=shape, data=data, parameters=params)
    tensor.shm = shm
    return tensor, offset


def _shape(raw: Any, name: str, itemsize: int) -> tuple[int, ...]:
    if raw is None:
        raise invalid_arg(f"input '{name}' has no 'shape'")
    if not isinstance(raw, list) or not all(type(d) is int and d >= 0 for d in raw):
        raise invalid_arg(f"'shape' of input '{name}' must be an array of non-negative integers")
    shape = tuple(raw)
    check_shape(shape, name, itemsize)
    return shape


def _binary_input(
    ref: InputRef, datatype: DataType, shape: tuple[int, ...], place: _Place, size: int
) -> npt.NDArray[Any]:
    count = math.prod(shape)
    if datatype is not DataType.BYTES and size != count * datatype.itemsize:
        raise error_texts.input_byte_size(ref, count * datatype.itemsize, size)
    binary, offset = place.binary, place.offset
    end = offset + size
    if end > len(binary):
        if not place.has_binary and size:
            raise error_texts.binary_without_header()
        raise error_texts.binary_input_short(ref.name, end - len(binary), ref.model)
    return raw_to_array(datatype, shape, binary[offset:end], ref)


def _json_input(
    ref: InputRef, datatype: DataType, shape: tuple[int, ...], data: Any
) -> npt.NDArray[Any]:
    name = ref.name
    if datatype in RAW_ONLY:
        raise invalid_arg(
            f"receiving {datatype.value} data via JSON is not supported. Please use the "
            f"binary data format for input {name}"
        )
    if not isinstance(data, list):
        raise invalid_arg(f"'data' of input '{name}' must be an array, not {_json_kind(data)}")
    flat = flatten_nested(data, error_texts.json_too_deep)
    count = math.prod(shape)
    if len(flat) != count:
        if datatype is DataType.BYTES:
            if len(flat) > count:
                raise error_texts.too_many_strings(ref, count + 1, count)
            raise error_texts.too_few_strings(ref, count, len(flat))
        if len(flat) > count:
            raise error_texts.json_data_too_long()
        raise error_texts.json_data_too_short()
    return _json_to_numpy(name, datatype, flat).reshape(shape)


def flatten_nested(data: list[Any], too_deep: Callable[[], ServerError]) -> list[Any]:
    """Row-major elements of nested `data` arrays, without recursion (the nesting is the
    client's to choose), raising `too_deep()` past MAX_JSON_DEPTH levels as Triton does."""
    for item in data:
        if type(item) is list:
            break
    else:
        return data
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                if len(stack) == MAX_JSON_DEPTH:
                    raise too_deep()
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _json_to_numpy(name: str, datatype: DataType, flat: list[Any]) -> npt.NDArray[Any]:
    kinds = set(map(type, flat))
    if datatype is DataType.BOOL:
        if not kinds <= {bool}:
            raise _wrong_elements(name, datatype, "booleans")
        return np.array(flat, dtype=np.bool_)
    if datatype is DataType.BYTES:
        if not kinds <= {str}:
            raise _wrong_elements(name, datatype, "strings")
        return object_array([s.encode("utf-8") for s in flat])
    if datatype in _INTEGER_TYPES:
        if not kinds <= {int}:
            raise _wrong_elements(name, datatype, "integers")
        if flat:
            lowest, highest = _INTEGER_RANGE[datatype]
            low, high = min(flat), max(flat)
            if low < lowest or high > highest:
                bad = low if low < lowest else high
                raise invalid_arg(
                    f"input '{name}': value {bad} is out of range for {datatype.value}"
                )
        return np.array(flat, dtype=datatype.numpy)
    # FP32 and FP64; JSON integers are fine as floats.
    if not kinds <= {int, float}:
        raise _wrong_elements(name, datatype, "numbers")
    arr = np.array(flat, dtype=np.float64)
    if datatype is DataType.FP32:
        if arr.size and float(np.abs(arr).max()) > _FP32_MAX:
            raise invalid_arg(f"input '{name}': a value is out of range for FP32")
        return arr.astype(np.float32)
    return arr


def _wrong_elements(name: str, datatype: DataType, expected: str) -> ServerError:
    return invalid_arg(f"input '{name}': {datatype.value} 'data' elements must be {expected}")


def _decode_outputs(specs: Any, request_id: str) -> list[RequestedOutput]:
    if specs is None:
        return []
    if not isinstance(specs, list):
        raise invalid_arg(f"'outputs' must be an array, not {_json_kind(specs)}")
    outputs: list[RequestedOutput] = []
    names: set[str] = set()
    for index, spec in enumerate(specs):
        if not isinstance(spec, dict):
            raise invalid_arg(f"requested output {index} must be a JSON object")
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_arg(f"requested output {index} has no 'name'")
        if name in names:
            raise error_texts.duplicate_output(request_id, name)
        names.add(name)
        params = _parameters(spec.get("parameters"), f"output '{name}'")
        output = requested_output(name, params)
        if not isinstance(params.get(BINARY_DATA, False), bool):
            raise invalid_arg(f"'binary_data' of output '{name}' must be a boolean")
        lift_output_ref(output)
        if output.shm is not None and params.get(BINARY_DATA) is True:
            raise invalid_arg("Output can't set both 'shared_memory_region' and 'binary_data'")
        outputs.append(output)
    return outputs


# --- responses ------------------------------------------------------------------------------


def encode_infer_response(
    response: InferResponse, request: InferRequest
) -> tuple[bytes, int | None]:
    """Encode a response as (body, JSON header length or None when the body is all JSON).

    A requested output goes binary when it says `binary_data: true`, whatever the request's
    `binary_data_output`; that parameter (default false) decides for the outputs of a
    request that names none, as in Triton. FP16 and BF16 outputs are always sent binary; a
    BYTES output that is not valid UTF-8 asked for as JSON is refused (JSON cannot carry
    it, and a client that asked for JSON cannot read a binary part).
    Binary outputs follow the JSON header in output order. An output the core wrote to
    shared memory is described (name, datatype, shape) with no data, as Triton does.
    """
    requested = {output.name: output for output in request.outputs}
    default_binary = request.wire.get(BINARY_DATA_OUTPUT) is True
    entries: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    for tensor in response.outputs:
        if tensor.data.size != math.prod(tensor.shape):
            raise ServerError(
                ErrorCode.INTERNAL,
                f"output '{tensor.name}' has {tensor.data.size} elements, but its shape "
                f"{list(tensor.shape)} needs {math.prod(tensor.shape)}",
            )
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype.value,
            "shape": tensor.shape,
        }
        if tensor.shm is not None:
            entries.append(entry)
            continue
        wanted = requested.get(tensor.name)
        binary = default_binary if wanted is None else wanted.parameters.get(BINARY_DATA) is True
        data = None if binary else _json_output_data(tensor)
        if data is not None:
            if tensor.parameters:
                entry["parameters"] = tensor.parameters
            entry["data"] = data
        else:
            chunk = tensor_to_raw(tensor)
            entry["parameters"] = {**tensor.parameters, BINARY_DATA_SIZE: len(chunk)}
            chunks.append(chunk)
        entries.append(entry)

    header: dict[str, Any] = {}
    if response.id:
        header["id"] = response.id
    header["model_name"] = response.model_name
    header["model_version"] = response.model_version
    if response.parameters:
        header["parameters"] = response.parameters
    header["outputs"] = entries
    head = encode_json(header)
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


def _json_output_data(tensor: Tensor) -> Any:
    """The flat, row-major JSON data of an output, or None when it must go binary."""
    if tensor.datatype in RAW_ONLY:
        return None
    if tensor.datatype is DataType.BYTES:
        try:
            return [item.decode("utf-8") for item in bytes_elements(tensor.data)]
        except UnicodeDecodeError:
            raise error_texts.bytes_not_utf8(tensor.name) from None
    # A 1-D C-contiguous native array, which orjson serializes directly.
    return np.ascontiguousarray(tensor.data, dtype=tensor.datatype.numpy).reshape(-1)
