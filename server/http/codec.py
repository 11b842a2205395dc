"""The HTTP wire codec: KServe v2 JSON plus Triton's binary tensor data extension.

Pure functions between request/response bodies and the central types; no I/O. Binary input
tensors are zero-copy, read-only `np.frombuffer` views into the request body, so they live
as long as the body does.

Binary data is little-endian; like numpy's native dtypes on every host we run on (x86-64 and
aarch64), so fixed-size tensors travel as their raw memory. JSON `data` becomes an array in
json_tensors.py.

The infer path runs this on every request, so the usual request takes the short way where
one exists: a shape of positive dimensions is checked in one pass, parameters are looked
at only when there are some, and a message is worded only for an error; whatever is
unusual goes the general way, so every error and its precedence stay the same.
"""

from __future__ import annotations

import math
import re
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from ..control.sharedmemory import (
    IN_SHARED_MEMORY,
    SHARED_MEMORY_BYTE_SIZE,
    SHARED_MEMORY_OFFSET,
    SHARED_MEMORY_REGION,
    lift_output_ref,
    parse_ref,
)
from ..errors import ErrorCode, ServerError, invalid_arg
from ..inference import error_texts
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
    plain_count,
    requested_output,
)
from ..inference.wire import RAW_ONLY, bytes_elements, raw_output, raw_to_array
from .json_tensors import json_input, json_kind, literal_json, reread_nonfinite

INFERENCE_HEADER_CONTENT_LENGTH: Final = "Inference-Header-Content-Length"
BINARY_DATA_SIZE: Final = "binary_data_size"
BINARY_DATA: Final = "binary_data"
BINARY_DATA_OUTPUT: Final = "binary_data_output"
# Marks the placeholder input of a raw-binary request; see decode_infer_request.
RAW_BINARY: Final = "raw_binary"

_PARAM_TYPES: Final = (bool, int, float, str)
# The datatypes JSON may carry NaN and infinities in (FP16 and BF16 always go binary).
_FLOATS: Final = frozenset({DataType.FP32, DataType.FP64})
# The parameters that place a tensor in shared memory (parse_ref lifts them out).
_SHM_KEYS: Final = frozenset({SHARED_MEMORY_REGION, SHARED_MEMORY_OFFSET, SHARED_MEMORY_BYTE_SIZE})
# A tensor's parameters the server reads (each checked where it is read). Triton ignores
# any other, whatever its type; MLServer's clients send `"headers": null` on every input.
_TENSOR_KEYS: Final = frozenset({BINARY_DATA_SIZE, BINARY_DATA, "classification", *_SHM_KEYS})


# --- JSON helpers ---------------------------------------------------------------------------


def encode_json(obj: Any) -> bytes:
    """Serialize `obj` with orjson; numpy arrays and scalars are accepted."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def decode_json_object(
    body: bytes | memoryview, what: str, nonfinite: bool = False
) -> dict[str, Any]:
    """Parse a JSON object; malformed JSON or a non-object is INVALID_ARG.

    `what` names the document in messages: "failed to parse the <what> JSON buffer: ...".
    With `nonfinite`, NaN, Infinity and -Infinity are numbers, as in Triton's infer JSON.
    """
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        obj = reread_nonfinite(e) if nonfinite else None
        if obj is None:
            raise invalid_arg(f"failed to parse the {what} JSON buffer: {e}") from None
    if not isinstance(obj, dict):
        raise invalid_arg(f"the {what} JSON must be an object, not {json_kind(obj)}")
    return obj


# A header length as written: ASCII digits (a sign only to reach the range check). int()
# alone also reads `2_1_0`, `+21`, ` 21` and other scripts' digits (`٢١`), none of which
# Triton's std::stoi reads as that number.
_HEADER_LENGTH = re.compile(r"-?[0-9]+")


def parse_header_length(value: str | None) -> int | None:
    """Parse the `Inference-Header-Content-Length` header value (None when absent)."""
    if value is None:
        return None
    if value.isascii() and value.isdigit() and len(value) < 19:  # every client's: no regex
        return int(value)
    if _HEADER_LENGTH.fullmatch(value) is not None:
        try:
            return int(value)
        except ValueError:  # past int()'s digit limit: no length a body can have
            pass
    raise invalid_arg(f"invalid {INFERENCE_HEADER_CONTENT_LENGTH} header value '{value}'")


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
    doc = decode_json_object(header, "request", nonfinite=True)

    # A null id is no id: MLServer's and KServe's clients send it so (Triton refuses it).
    request_id = doc.get("id")
    if request_id is None:
        request_id = ""
    elif not isinstance(request_id, str):
        raise invalid_arg(f"the request 'id' must be a string, not {json_kind(request_id)}")
    request = InferRequest(
        model_name,
        model_version,
        request_id,
        _decode_inputs(doc, binary, header_length is not None, model_name, request_id),
        _decode_outputs(doc.get("outputs"), request_id),
        _parameters(doc.get("parameters"), "the request"),
    )
    if request.parameters:
        if BINARY_DATA_OUTPUT in request.parameters:
            binary_output = request.parameters.pop(BINARY_DATA_OUTPUT)
            if not isinstance(binary_output, bool):
                # Triton refuses it too ("Unable to parse 'binary_data_output'"); taken
                # as false, a client's "yes" would quietly get JSON it did not ask for.
                raise invalid_arg(f"parameter '{BINARY_DATA_OUTPUT}' must be a boolean")
            request.wire[BINARY_DATA_OUTPUT] = binary_output
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


def _parameters(raw: Any, whose: str, name: str = "") -> Parameters:
    """The parameters of `whose` ("the request"), or of its tensor `name` ("input")."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        where = f"{whose} '{name}'" if name else whose
        raise invalid_arg(f"'parameters' of {where} must be a JSON object, not {json_kind(raw)}")
    # orjson built a fresh dict: of these value types, it is the parameters as they are.
    kept: dict[str, Any] = raw
    for key, value in raw.items():
        if isinstance(value, _PARAM_TYPES):
            continue
        if not name:
            # Triton's words (http_server.cc), null and arrays included.
            raise invalid_arg(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or "
                "'string'."
            )
        if key in _TENSOR_KEYS:
            raise invalid_arg(
                f"parameter '{key}' of {whose} '{name}' must be a boolean, number or string, "
                f"not {json_kind(value)}"
            )
        # A tensor's parameter nothing reads: left out, as Triton ignores it.
        if kept is raw:
            kept = dict(raw)
        del kept[key]
    return kept


def _decode_inputs(
    doc: dict[str, Any], binary: memoryview, has_binary: bool, model_name: str, request_id: str
) -> list[Tensor]:
    specs = doc.get("inputs")
    if specs is None:
        raise invalid_arg("the request JSON has no 'inputs'")
    if not isinstance(specs, list):
        raise invalid_arg(f"'inputs' must be an array, not {json_kind(specs)}")
    tensors: list[Tensor] = []
    names: set[str] = set()
    # One for the request: each input moves its offset past the bytes it takes.
    place = _Place(binary, has_binary, model_name, request_id)
    for index, spec in enumerate(specs):
        tensor = _decode_input(index, spec, place)
        if tensor.name in names:
            raise error_texts.duplicate_input(request_id, tensor.name)
        names.add(tensor.name)
        tensors.append(tensor)
    if place.offset != len(binary):
        raise error_texts.additional_input_data(model_name)
    return tensors


class _Place:
    """Where the next input's data is: the binary part of the body, from `offset`."""

    __slots__ = ("binary", "has_binary", "model", "offset", "request_id")

    def __init__(self, binary: memoryview, has_binary: bool, model: str, request_id: str) -> None:
        self.binary = binary
        self.offset = 0
        self.has_binary = has_binary
        self.model = model
        self.request_id = request_id


def _decode_input(index: int, spec: Any, place: _Place) -> Tensor:
    if not isinstance(spec, dict):
        raise invalid_arg(f"input {index} must be a JSON object, not {json_kind(spec)}")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_arg(f"input {index} has no 'name'")
    datatype_name = spec.get("datatype")
    if not isinstance(datatype_name, str):
        raise invalid_arg(f"input '{name}' has no 'datatype'")
    datatype = DataType.parse(datatype_name)
    shape, count = _shape(spec.get("shape"), name, datatype)
    raw_params = spec.get("parameters")
    if raw_params is None:
        # The common JSON input: nothing to lift out of its parameters.
        params: Parameters = {}
        shm = size = None
    else:
        params = _parameters(raw_params, "input", name)
        shm = None if params.keys().isdisjoint(_SHM_KEYS) else parse_ref(params, name)
        size = params.pop(BINARY_DATA_SIZE, None)
    has_data = "data" in spec

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
        data = _binary_input(name, datatype, shape, count, place, size)
        place.offset += size
    elif has_data:
        data = json_input(name, datatype, shape, count, spec["data"], place.model, place.request_id)
    else:
        raise invalid_arg(f"input '{name}' has neither 'data' nor a 'binary_data_size' parameter")
    return Tensor(name, datatype, shape, data, params, shm)


def _shape(raw: Any, name: str, datatype: DataType) -> tuple[tuple[int, ...], int]:
    """The shape and its element count."""
    if raw is None:
        raise invalid_arg(f"input '{name}' has no 'shape'")
    # The common shape in one pass, without the element checks below.
    count = plain_count(raw) if type(raw) is list else None
    if count is not None:
        return tuple(raw), count
    if not isinstance(raw, list) or not all(type(d) is int and d >= 0 for d in raw):
        raise invalid_arg(f"'shape' of input '{name}' must be an array of non-negative integers")
    shape = tuple(raw)
    return shape, check_shape(shape, name, datatype.itemsize)


def _binary_input(
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    count: int,
    place: _Place,
    size: int,
) -> npt.NDArray[Any]:
    if datatype is not DataType.BYTES and size != count * datatype.itemsize:
        raise error_texts.input_byte_size(_ref(name, place), count * datatype.itemsize, size)
    binary, offset = place.binary, place.offset
    end = offset + size
    if end > len(binary):
        if not place.has_binary and size:
            raise error_texts.binary_without_header()
        raise error_texts.binary_input_short(name, end - len(binary), place.model)
    if datatype is DataType.BYTES:
        return raw_to_array(datatype, shape, binary[offset:end], _ref(name, place))
    # The size matches the shape (checked above): a zero-copy view, as raw_to_array makes.
    return np.frombuffer(binary[offset:end], dtype=datatype.numpy).reshape(shape)


def _ref(name: str, place: _Place) -> InputRef:
    return InputRef(name, place.model, place.request_id)


def _decode_outputs(specs: Any, request_id: str) -> list[RequestedOutput]:
    if specs is None:
        return []
    if not isinstance(specs, list):
        raise invalid_arg(f"'outputs' must be an array, not {json_kind(specs)}")
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
        params = _parameters(spec.get("parameters"), "output", name)
        output = requested_output(name, params)
        if not isinstance(params.get(BINARY_DATA, False), bool):
            raise invalid_arg(f"'binary_data' of output '{name}' must be a boolean")
        if not params.keys().isdisjoint(_SHM_KEYS):
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
    requested = {output.name: output for output in request.outputs} if request.outputs else {}
    default_binary = request.wire.get(BINARY_DATA_OUTPUT) is True
    entries: list[dict[str, Any]] = []
    chunks: list[Any] = []
    floats: list[dict[str, Any]] = []  # the JSON entries whose data may hold NaN or inf
    for tensor in response.outputs:
        count = math.prod(tensor.shape)
        if tensor.data.size != count:
            raise ServerError(
                ErrorCode.INTERNAL,
                f"output '{tensor.name}' has {tensor.data.size} elements, but its shape "
                f"{list(tensor.shape)} needs {count}",
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
            if tensor.datatype in _FLOATS:
                floats.append(entry)
        else:
            chunk, size = raw_output(tensor)
            entry["parameters"] = {**tensor.parameters, BINARY_DATA_SIZE: size}
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
    if floats and b"null" in head:
        # orjson writes NaN and the infinities as null, where Triton writes its literals.
        # Looked for only here, so finite data costs one search of the header (a name or
        # a text may hold "null" too: then nothing is rewritten).
        rewritten = False
        for entry in floats:
            flat = entry["data"]
            if not np.isfinite(flat).all():
                entry["data"] = literal_json(flat)
                rewritten = True
        if rewritten:
            head = encode_json(header)
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


def _json_output_data(tensor: Tensor) -> Any:
    """The flat, row-major JSON data of an output, or None when it must go binary."""
    datatype = tensor.datatype
    if datatype in RAW_ONLY:
        return None
    if datatype is DataType.BYTES:
        try:
            return [item.decode("utf-8") for item in bytes_elements(tensor.data)]
        except UnicodeDecodeError:
            raise error_texts.bytes_not_utf8(tensor.name) from None
    # A 1-D C-contiguous native array, which orjson serializes directly (ravel copies
    # only what is not C-contiguous already).
    data = tensor.data
    if data.dtype != datatype.numpy:
        data = data.astype(datatype.numpy)
    return data.ravel()
