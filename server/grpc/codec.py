"""The gRPC wire codec: ModelInferRequest / ModelInferResponse to and from the core's types.

Pure functions; no I/O. Tensors in `raw_input_contents` become zero-copy, read-only
`np.frombuffer` views into the message's bytes. Typed `contents` are accepted for every
datatype that has a contents field (FP16 and BF16 travel only as raw bytes). Responses
always use `raw_output_contents`, which is what tritonclient reads.

The usual request (raw fixed-size inputs, no parameters) and the usual response each have
a plain path that builds them with as few protobuf reads and writes as it can, since each
costs a wrapper object; anything else goes to the general code from the start, so every
error keeps its text and its order. tests/unit/test_grpc_codec_plain.py holds the two to
the same results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ge_serve.protos import grpc_service_pb2 as pb

from ..control.sharedmemory import (
    IN_SHARED_MEMORY,
    SHARED_MEMORY_REGION,
    lift_output_ref,
    parse_ref,
)
from ..errors import ErrorCode, ServerError, invalid_arg
from ..inference import error_texts
from ..inference.error_texts import InputRef
from ..inference.types import (
    MAX_DIMS,
    DataType,
    InferRequest,
    InferResponse,
    Parameters,
    ParamValue,
    RequestedOutput,
    Tensor,
    check_shape,
    lift_request_parameters,
    requested_output,
)
from ..inference.wire import RAW_ONLY, object_array, raw_to_array, tensor_to_raw

# Stream-only request parameter (tritonclient's `enable_empty_final_response=True`).
ENABLE_EMPTY_FINAL_RESPONSE: Final = "triton_enable_empty_final_response"
# Response parameter on every streamed response: true on the last one for its request.
FINAL_RESPONSE: Final = "triton_final_response"

_INT64_MAX: Final = 2**63 - 1
_UINT64_RANGE: Final = 2**64

_SEQUENCE_ID: Final = "sequence_id"
# The request parameters Triton's gRPC front end reads itself, and the InferParameter
# fields it takes each from. A negative int64 is refused but as the sequence ID: Triton
# refuses a negative priority, and casts a negative timeout to a uint64 whose deadline
# overflows, so ge-serve refuses that too, in the priority's words.
_TRITON_PARAMETER_FIELDS: Final = {
    _SEQUENCE_ID: ("int64_param", "string_param"),
    "sequence_start": ("bool_param",),
    "sequence_end": ("bool_param",),
    "priority": ("int64_param", "uint64_param"),
    "timeout": ("int64_param",),
}

# The typed-contents field each datatype travels in.
_CONTENTS_FIELD: Final = {
    DataType.BOOL: "bool_contents",
    DataType.UINT8: "uint_contents",
    DataType.UINT16: "uint_contents",
    DataType.UINT32: "uint_contents",
    DataType.UINT64: "uint64_contents",
    DataType.INT8: "int_contents",
    DataType.INT16: "int_contents",
    DataType.INT32: "int_contents",
    DataType.INT64: "int64_contents",
    DataType.FP32: "fp32_contents",
    DataType.FP64: "fp64_contents",
    DataType.BYTES: "bytes_contents",
}
# The numpy type of each contents field, before narrowing to the tensor's datatype.
_FIELD_DTYPE: Final = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
}
_NARROWED: Final = frozenset({DataType.UINT8, DataType.UINT16, DataType.INT8, DataType.INT16})
# Each fixed-size datatype's member, numpy type and byte size, by wire name, and its wire
# name and numpy type, by member: the plain paths' one lookup per tensor.
_FIXED_SIZE: Final[dict[str, tuple[DataType, np.dtype[Any], int]]] = {
    datatype.value: (datatype, datatype.numpy, datatype.itemsize)
    for datatype in DataType
    if datatype is not DataType.BYTES
}
_RAW_ENCODED: Final[dict[DataType, tuple[str, np.dtype[Any]]]] = {
    member: (name, dtype) for name, (member, dtype, _) in _FIXED_SIZE.items()
}


@dataclass(slots=True)
class DecodedRequest:
    """A core request plus what only the gRPC front end acts on."""

    request: InferRequest
    # The client asked for an empty response carrying `triton_final_response: true` when a
    # decoupled model finishes a request without a final response of its own.
    enable_empty_final_response: bool = False


# --- parameters -----------------------------------------------------------------------------


def parameter_value(param: pb.InferParameter, key: str, where: str) -> ParamValue:
    choice = param.WhichOneof("parameter_choice")
    if choice is None:
        raise invalid_arg(f"parameter '{key}' of {where} has no value")
    value: ParamValue = getattr(param, choice)
    return value


def decode_parameters(params: Any, where: str) -> Parameters:
    """A `map<string, InferParameter>` as plain Python values."""
    if not params:  # the usual case; iterating even an empty protobuf map costs
        return {}
    return {key: parameter_value(param, key, where) for key, param in params.items()}


def _request_parameters(params: Any) -> Parameters:
    """The request's parameters, those Triton's gRPC front end reads itself taken only
    from the fields it allows, with its messages (infer_handler.cc,
    SetInferenceRequestMetadata)."""
    values: Parameters = {}
    for key, param in params.items():
        allowed = _TRITON_PARAMETER_FIELDS.get(key)
        if allowed is None:
            values[key] = parameter_value(param, key, "the request")
            continue
        choice = param.WhichOneof("parameter_choice")
        if choice not in allowed:
            raise invalid_arg(
                f"invalid value type for '{key}' parameter, expected {' or '.join(allowed)}."
            )
        if choice == "int64_param" and param.int64_param < 0:
            if key != _SEQUENCE_ID:
                raise invalid_arg(f"invalid value for '{key}', expected value >= 0.")
            # Triton casts the int64 to the uint64 ID: the only way a client sends one of
            # 2**63 or more (tritonclient sends every ID as an int64_param).
            values[key] = param.int64_param + _UINT64_RANGE
        else:
            values[key] = getattr(param, choice)
    return values


def encode_parameters(values: Parameters, target: Any) -> None:
    """Fill a `map<string, InferParameter>` from plain Python values."""
    for key, value in values.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            if value > _INT64_MAX:
                param.uint64_param = value
            else:
                param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)


# --- requests -------------------------------------------------------------------------------


def decode_infer_request(message: pb.ModelInferRequest) -> DecodedRequest:
    """Build a core InferRequest from a ModelInferRequest.

    Inputs come from shared memory (`shared_memory_region` parameters; the core maps them),
    or the others either all from `raw_input_contents` (one buffer per input not in shared
    memory, in input order, as Triton counts them) or each from its typed `contents`;
    mixing the two is an error. Errors are ServerError INVALID_ARG.
    """
    plain = _decode_plain(message)
    if plain is not None:
        return plain
    model = message.model_name
    parameters = _request_parameters(message.parameters)
    empty_final = parameters.pop(ENABLE_EMPTY_FINAL_RESPONSE, False)
    if not isinstance(empty_final, bool):
        raise invalid_arg(f"parameter '{ENABLE_EMPTY_FINAL_RESPONSE}' must be a boolean")
    request = InferRequest(
        model_name=model,
        model_version=message.model_version,
        id=message.id,
        inputs=_decode_inputs(message),
        outputs=_decode_outputs(message),
        parameters=parameters,
    )
    lift_request_parameters(request)
    return DecodedRequest(request, empty_final)


def _decode_plain(message: pb.ModelInferRequest) -> DecodedRequest | None:
    """The usual request built directly, or None for anything else.

    Usual: no parameters anywhere but a boolean `triton_enable_empty_final_response`, which
    tritonclient and perf_analyzer send on every call, and every input a uniquely named,
    non-empty, fixed-size tensor in `raw_input_contents` whose byte count matches its shape.
    Such a request passes every check of the general path and decodes there to the same
    result, so this path raises nothing: what it refuses goes to the general path from the
    start, which raises each error in its order. Each protobuf read builds a wrapper
    object, so this reads each field once.
    """
    empty_final = False
    parameters = message.parameters
    if parameters:
        if len(parameters) != 1 or ENABLE_EMPTY_FINAL_RESPONSE not in parameters:
            return None
        value = parameters[ENABLE_EMPTY_FINAL_RESPONSE]
        if value.WhichOneof("parameter_choice") != "bool_param":
            return None
        empty_final = value.bool_param
    specs = message.inputs
    raw = message.raw_input_contents
    count = len(specs)
    if len(raw) != count:
        return None
    inputs: list[Tensor] = []
    names: set[str] = set()
    for index in range(count):
        spec = specs[index]
        fixed = _FIXED_SIZE.get(spec.datatype)
        if fixed is None or spec.parameters or spec.HasField("contents"):
            return None
        datatype, dtype, itemsize = fixed
        dims = spec.shape[:]
        buf = raw[index]
        size = len(buf)
        # Non-zero dimensions whose product is a real buffer's element count are far
        # inside every bound check_shape holds; a zero could hide absurd others.
        if not size or len(dims) > MAX_DIMS or math.prod(dims) * itemsize != size:
            return None
        try:
            # A read-only view of the bytes, as np.frombuffer gives, in one call.
            data: npt.NDArray[Any] = np.ndarray(dims, dtype, buf)
        except ValueError:  # negative dimensions, which an even count of hides from prod
            return None
        name = spec.name
        names.add(name)
        inputs.append(Tensor(name, datatype, data.shape, data, {}, None))
    if len(names) != count or "" in names:  # a duplicate or a missing name
        return None
    wanted = message.outputs
    count = len(wanted)
    outputs: list[RequestedOutput] = []
    names = set()
    for index in range(count):
        output = wanted[index]
        if output.parameters:
            return None
        name = output.name
        names.add(name)
        outputs.append(RequestedOutput(name, 0, {}, None))
    if len(names) != count or "" in names:
        return None
    request = InferRequest(
        message.model_name, message.model_version, message.id, inputs, outputs, {}
    )
    return DecodedRequest(request, empty_final)


def _decode_inputs(message: pb.ModelInferRequest) -> list[Tensor]:
    model = message.model_name
    raw = message.raw_input_contents
    specs = message.inputs
    # Parameters are rare on inputs: a request without any skips looking at each one's.
    any_params = any(spec.parameters for spec in specs)
    in_shm = sum(SHARED_MEMORY_REGION in spec.parameters for spec in specs) if any_params else 0
    if raw and len(raw) > len(specs) - in_shm:
        raise error_texts.additional_input_data(model)
    tensors: list[Tensor] = []
    names: set[str] = set()
    raw_index = 0
    for index, spec in enumerate(specs):
        name = spec.name
        if not name:
            raise invalid_arg(f"input {index} of model '{model}' has no name")
        if name in names:
            raise error_texts.duplicate_input(message.id, name)
        names.add(name)
        datatype = DataType.parse(spec.datatype)
        shape = tuple(spec.shape)
        if shape and min(shape) < 0:
            raise invalid_arg(f"'shape' of input '{name}' must hold non-negative integers")
        itemsize = datatype.itemsize
        count = check_shape(shape, name, itemsize)
        params: Parameters = {}
        shm = None
        if any_params and spec.parameters:
            params = decode_parameters(spec.parameters, f"input '{name}'")
            shm = parse_ref(params, name)
        has_contents = spec.HasField("contents")
        if shm is not None:
            if has_contents:
                raise error_texts.contents_with_shm(name, model)
            data = IN_SHARED_MEMORY
        elif has_contents and raw:
            raise error_texts.contents_with_raw(name, model)
        elif raw_index < len(raw):
            buf = raw[raw_index]
            raw_index += 1
            if itemsize and len(buf) == count * itemsize:
                # The common case, as raw_to_array does it, without its checks' objects.
                data = np.frombuffer(buf, dtype=datatype.numpy).reshape(shape)
            else:  # BYTES, or a size raw_to_array refuses in Triton's words
                data = raw_to_array(datatype, shape, buf, InputRef(name, model, message.id))
        elif has_contents:
            ref = InputRef(name, model, message.id)
            data = _typed_contents(ref, datatype, shape, spec.contents)
        elif math.prod(shape) == 0:
            data = np.empty(shape, dtype=datatype.numpy)
        else:
            raise error_texts.no_input_data(name, model)
        tensors.append(Tensor(name, datatype, shape, data, params, shm))
    return tensors


def _typed_contents(
    ref: InputRef, datatype: DataType, shape: tuple[int, ...], contents: pb.InferTensorContents
) -> npt.NDArray[Any]:
    name = ref.name
    if datatype in RAW_ONLY:
        raise invalid_arg(
            f"input '{name}': {datatype.value} data can only be sent in raw_input_contents, "
            f"not in typed contents"
        )
    field = _CONTENTS_FIELD[datatype]
    for other, _ in contents.ListFields():
        if other.name != field:
            raise invalid_arg(
                f"input '{name}': {datatype.value} data must be in contents.{field}, "
                f"not contents.{other.name}"
            )
    values = getattr(contents, field)
    count = math.prod(shape)
    if len(values) != count:
        if datatype is DataType.BYTES:
            if len(values) > count:
                raise error_texts.too_many_strings(ref, count + 1, count)
            raise error_texts.too_few_strings(ref, count, len(values))
        itemsize = datatype.itemsize
        raise error_texts.input_byte_size(ref, count * itemsize, len(values) * itemsize)
    if datatype is DataType.BYTES:
        return object_array(list(values)).reshape(shape)
    wide = np.fromiter(values, dtype=_FIELD_DTYPE[field], count=count)
    if datatype in _NARROWED and count:
        info = np.iinfo(datatype.numpy)
        low, high = int(wide.min()), int(wide.max())
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise invalid_arg(f"input '{name}': value {bad} is out of range for {datatype.value}")
    return wide.astype(datatype.numpy, copy=False).reshape(shape)


def _decode_outputs(message: pb.ModelInferRequest) -> list[RequestedOutput]:
    outputs: list[RequestedOutput] = []
    names: set[str] = set()
    for index, spec in enumerate(message.outputs):
        name = spec.name
        if not name:
            raise invalid_arg(f"requested output {index} has no name")
        if name in names:
            raise error_texts.duplicate_output(message.id, name)
        names.add(name)
        if not spec.parameters:  # nothing to lift
            outputs.append(RequestedOutput(name))
            continue
        params = decode_parameters(spec.parameters, f"output '{name}'")
        output = requested_output(name, params)
        lift_output_ref(output)
        outputs.append(output)
    return outputs


# --- responses ------------------------------------------------------------------------------


def encode_infer_response(response: InferResponse) -> pb.ModelInferResponse:
    """A ModelInferResponse with every output's data in `raw_output_contents`.

    An output the core wrote to shared memory keeps its place with an empty entry, as
    Triton sends it, so tritonclient's index into `raw_output_contents` stays right.
    """
    plain = _encode_plain(response)
    if plain is not None:
        return plain
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    if response.parameters:
        encode_parameters(response.parameters, message.parameters)
    outputs = message.outputs
    raw = message.raw_output_contents
    for tensor in response.outputs:
        if tensor.data.size != math.prod(tensor.shape):
            raise ServerError(
                ErrorCode.INTERNAL,
                f"output '{tensor.name}' has {tensor.data.size} elements, but its shape "
                f"{list(tensor.shape)} needs {math.prod(tensor.shape)}",
            )
        entry = outputs.add(name=tensor.name, datatype=tensor.datatype.value, shape=tensor.shape)
        if tensor.shm is not None:
            raw.append(b"")
            continue
        if tensor.parameters:
            encode_parameters(tensor.parameters, entry.parameters)
        raw.append(bytes(tensor_to_raw(tensor)))
    return message


def _encode_plain(response: InferResponse) -> pb.ModelInferResponse | None:
    """The usual response built in one constructor call, or None for anything else.

    Usual: no parameters, and every output a fixed-size tensor on the wire whose array has
    the datatype's own numpy type and as many elements as its shape. Anything else goes to
    the general path from the start, which raises the error or converts the data. Filling
    the message from plain lists costs far less than adding to its fields one by one.
    """
    if response.parameters:
        return None
    outputs: list[dict[str, Any]] = []
    raw: list[bytes] = []
    for tensor in response.outputs:
        wire = _RAW_ENCODED.get(tensor.datatype)
        data = tensor.data
        shape = tensor.shape
        if (
            wire is None
            or data.dtype is not wire[1]
            or tensor.shm is not None
            or tensor.parameters
            or data.size != math.prod(shape)
        ):
            return None
        outputs.append({"name": tensor.name, "datatype": wire[0], "shape": shape})
        raw.append(data.tobytes())  # row-major, as tensor_to_raw's contiguous copy
    return pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id,
        outputs=outputs,
        raw_output_contents=raw,
    )


def stream_response(
    response: pb.ModelInferResponse, final: bool | None
) -> pb.ModelStreamInferResponse:
    """Wrap a response for ModelStreamInfer; `final` sets `triton_final_response` (None: no)."""
    if final is not None:
        response.parameters[FINAL_RESPONSE].bool_param = final
    return pb.ModelStreamInferResponse(infer_response=response)


def empty_final_response(message: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
    """The empty response that only says "this request is done"."""
    response = pb.ModelInferResponse(
        model_name=message.model_name, model_version=message.model_version, id=message.id
    )
    return stream_response(response, final=True)


def stream_error_response(
    response: InferResponse, error: ServerError
) -> pb.ModelStreamInferResponse:
    """A decoupled model's error response: Triton names the request's model and id, and
    says whether it was the request's last."""
    infer_response = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    infer_response.parameters[FINAL_RESPONSE].bool_param = response.final
    return pb.ModelStreamInferResponse(error_message=error.message, infer_response=infer_response)


def stream_error(message: pb.ModelInferRequest, error: ServerError) -> pb.ModelStreamInferResponse:
    """An in-stream error: `error_message`, with the request's id so the client can match it."""
    return pb.ModelStreamInferResponse(
        error_message=error.message, infer_response=pb.ModelInferResponse(id=message.id)
    )
