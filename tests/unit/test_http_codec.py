"""The HTTP wire codec: KServe v2 JSON and Triton's binary tensor data extension."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import orjson
import pytest
import tritonclient.http as triton_http
from samples import SAMPLES

from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.http.codec import (
    decode_infer_request,
    decode_json_object,
    encode_infer_response,
    encode_json,
    parse_header_length,
)
from ge_serve.server.inference.types import (
    DataType,
    InferRequest,
    InferResponse,
    RequestedOutput,
    SharedMemoryRef,
    Tensor,
)
from ge_serve.server.inference.wire import deserialize_bytes_tensor, serialize_bytes_tensor

# --- helpers --------------------------------------------------------------------------------

JSON_TYPES = [dt for dt in DataType if dt not in (DataType.FP16, DataType.BF16)]
# A BYTES sample that is valid UTF-8, for JSON.
JSON_BYTES = np.array([[b"", b"hello", "héllo ✓".encode()], [b"a", b"", b"z" * 30]], dtype=object)


def sample(datatype: DataType, *, for_json: bool = False) -> npt.NDArray[Any]:
    if for_json and datatype is DataType.BYTES:
        return JSON_BYTES
    return SAMPLES[datatype]


def to_json_data(arr: npt.NDArray[Any]) -> list[Any]:
    if arr.dtype == np.object_:
        return [[item.decode() for item in row] for row in arr.tolist()]
    data: list[Any] = arr.tolist()
    return data


def raw_bytes(datatype: DataType, arr: npt.NDArray[Any]) -> bytes:
    if datatype is DataType.BYTES:
        return b"".join(struct.pack("<I", len(x)) + x for x in arr.reshape(-1))
    return arr.tobytes()


def binary_request(header: dict[str, Any], *chunks: bytes) -> tuple[bytes, int]:
    head = orjson.dumps(header)
    return head + b"".join(chunks), len(head)


def assert_equal(actual: npt.NDArray[Any], expected: npt.NDArray[Any]) -> None:
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    if expected.dtype == np.object_:
        assert actual.tolist() == expected.tolist()
    else:
        assert actual.tobytes() == expected.tobytes()


def error_of(call: Callable[[], object]) -> ServerError:
    with pytest.raises(ServerError) as info:
        call()
    return info.value


def split_response(body: bytes, header_length: int | None) -> tuple[dict[str, Any], bytes]:
    if header_length is None:
        return orjson.loads(body), b""
    return orjson.loads(body[:header_length]), body[header_length:]


def response_of(*tensors: Tensor, **fields: Any) -> InferResponse:
    return InferResponse(model_name="m", model_version="1", outputs=list(tensors), **fields)


def tensor_of(name: str, datatype: DataType, arr: npt.NDArray[Any]) -> Tensor:
    return Tensor(name=name, datatype=datatype, shape=tuple(arr.shape), data=arr)


# --- request decoding: round trips ----------------------------------------------------------


@pytest.mark.parametrize("datatype", JSON_TYPES, ids=lambda d: d.value)
def test_json_input_round_trip(datatype: DataType) -> None:
    arr = sample(datatype, for_json=True)
    header = {
        "inputs": [
            {
                "name": "x",
                "shape": list(arr.shape),
                "datatype": datatype.value,
                "data": to_json_data(arr),
            }
        ]
    }
    request = decode_infer_request("m", "1", orjson.dumps(header), None)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, arr.shape)
    assert_equal(tensor.data, arr.astype(datatype.numpy) if datatype is not DataType.BYTES else arr)


@pytest.mark.parametrize("datatype", list(DataType), ids=lambda d: d.value)
def test_binary_input_round_trip(datatype: DataType) -> None:
    arr = sample(datatype)
    data = raw_bytes(datatype, arr)
    body, length = binary_request(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(arr.shape),
                    "datatype": datatype.value,
                    "parameters": {"binary_data_size": len(data)},
                }
            ]
        },
        data,
    )
    request = decode_infer_request("m", "1", body, length)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, arr.shape)
    assert tensor.parameters == {}
    assert_equal(tensor.data, arr)


def test_binary_inputs_are_zero_copy_views_of_the_body() -> None:
    a = np.arange(6, dtype=np.float32)
    b = np.arange(3, dtype=np.int64)
    body, length = binary_request(
        {
            "inputs": [
                {
                    "name": "a",
                    "shape": [2, 3],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 24},
                },
                {
                    "name": "b",
                    "shape": [3],
                    "datatype": "INT64",
                    "parameters": {"binary_data_size": 24},
                },
            ]
        },
        a.tobytes(),
        b.tobytes(),
    )
    request = decode_infer_request("m", "", body, length)
    for tensor in request.inputs:
        base: Any = tensor.data
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview) and base.obj is body
        assert not tensor.data.flags.writeable
    assert_equal(request.inputs[0].data, a.reshape(2, 3))
    assert_equal(request.inputs[1].data, b)


def test_mixed_json_and_binary_inputs_keep_order() -> None:
    body, length = binary_request(
        {
            "inputs": [
                {
                    "name": "a",
                    "shape": [2],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 8},
                },
                {"name": "b", "shape": [1], "datatype": "FP64", "data": [2.5]},
                {
                    "name": "c",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": 6},
                },
            ]
        },
        np.array([1, 2], dtype=np.int32).tobytes(),
        b"\x02\x00\x00\x00hi",
    )
    request = decode_infer_request("m", "", body, length)
    assert [t.name for t in request.inputs] == ["a", "b", "c"]
    assert request.inputs[0].data.tolist() == [1, 2]
    assert request.inputs[1].data.tolist() == [2.5]
    assert request.inputs[2].data.tolist() == [b"hi"]


def test_nested_and_flat_json_data_decode_the_same() -> None:
    def decode(data: list[Any]) -> npt.NDArray[Any]:
        header = {"inputs": [{"name": "x", "shape": [2, 2, 2], "datatype": "INT32", "data": data}]}
        return decode_infer_request("m", "", orjson.dumps(header), None).inputs[0].data

    flat = decode([1, 2, 3, 4, 5, 6, 7, 8])
    nested = decode([[[1, 2], [3, 4]], [[5, 6], [7, 8]]])
    partly = decode([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert_equal(flat, np.arange(1, 9, dtype=np.int32).reshape(2, 2, 2))
    assert_equal(nested, flat)
    assert_equal(partly, flat)


def test_json_scalar_and_empty_shapes() -> None:
    header = {
        "inputs": [
            {"name": "s", "shape": [], "datatype": "FP32", "data": [1.5]},
            {"name": "e", "shape": [0, 3], "datatype": "INT8", "data": []},
            {"name": "i", "shape": [2], "datatype": "FP32", "data": [1, 2]},
        ]
    }
    s, e, i = decode_infer_request("m", "", orjson.dumps(header), None).inputs
    assert s.data.shape == () and s.data.dtype == np.float32 and float(s.data) == 1.5
    assert e.data.shape == (0, 3) and e.data.dtype == np.int8
    assert i.data.dtype == np.float32 and i.data.tolist() == [1.0, 2.0]


def test_raw_binary_request() -> None:
    body = np.arange(4, dtype=np.float32).tobytes()
    request = decode_infer_request("m", "2", body, 0)
    assert (request.model_name, request.model_version) == ("m", "2")
    (tensor,) = request.inputs
    assert tensor.name == ""
    assert tensor.datatype is DataType.UINT8
    assert tensor.shape == (16,)
    assert tensor.parameters == {"raw_binary": True}
    assert tensor.data.dtype == np.uint8 and tensor.data.tobytes() == body
    # Triton answers a raw-binary request with binary outputs.
    assert request.outputs == [] and request.parameters == {}
    assert request.wire == {"binary_data_output": True}


def test_request_fields() -> None:
    header = {
        "id": "req-7",
        "parameters": {"priority": 2, "timeout": 5000, "flag": True, "ratio": 0.5, "s": "x"},
        "inputs": [
            {"name": "x", "shape": [1], "datatype": "INT32", "data": [1], "parameters": {"k": "v"}}
        ],
        "outputs": [
            {"name": "a", "parameters": {"classification": 3, "binary_data": True}},
            {"name": "b"},
            {"name": "c", "parameters": {"binary_data": False, "custom": 1}},
        ],
    }
    request = decode_infer_request("m", "1", orjson.dumps(header), None)
    assert request.id == "req-7"
    assert (request.priority, request.timeout_us) == (2, 5000)
    assert request.parameters == {"flag": True, "ratio": 0.5, "s": "x"}
    assert request.inputs[0].parameters == {"k": "v"}
    assert request.outputs == [
        RequestedOutput("a", 3, {"binary_data": True}),
        RequestedOutput("b", 0, {}),
        RequestedOutput("c", 0, {"binary_data": False, "custom": 1}),
    ]


# --- request decoding: errors ---------------------------------------------------------------


def _one(spec: dict[str, Any], **request: Any) -> bytes:
    return orjson.dumps({"inputs": [spec], **request})


def _fp32(**extra: Any) -> dict[str, Any]:
    return {"name": "x", "shape": [2], "datatype": "FP32", **extra}


def _bin(size: int) -> dict[str, Any]:
    return {"binary_data_size": size}


_HEAD = orjson.dumps({"inputs": [_fp32(parameters=_bin(8))]})

ERROR_CASES: list[tuple[str, bytes, int | None, str]] = [
    ("header longer than body", _HEAD + b"\0" * 8, len(_HEAD) + 9, "the request body has"),
    ("negative header", _HEAD, -1, "invalid Inference-Header-Content-Length -1"),
    (
        "bytes left over",
        _HEAD + b"\0" * 9,
        len(_HEAD),
        "unexpected additional input data for model 'm'",
    ),
    (
        "bytes missing",
        _HEAD + b"\0" * 7,
        len(_HEAD),
        "unexpected size for input 'x', expecting 1 additional bytes for model 'm'",
    ),
    (
        "binary without header length",
        _HEAD,
        None,
        "must specify valid 'Infer-Header-Content-Length' in request header and "
        "'binary_data_size' when passing inputs in binary data format",
    ),
    (
        "binary size vs shape",
        orjson.dumps({"inputs": [_fp32(parameters=_bin(4))]}) + b"\0" * 4,
        len(orjson.dumps({"inputs": [_fp32(parameters=_bin(4))]})),
        "input byte size mismatch for input 'x' for model 'm'. Expected 8, got 4",
    ),
    ("malformed JSON", b'{"inputs": [', None, "failed to parse the request JSON buffer: "),
    ("empty body", b"", None, "failed to parse the request JSON buffer: "),
    ("not an object", b"[1, 2]", None, "the request JSON must be an object"),
    ("missing inputs", b"{}", None, "the request JSON has no 'inputs'"),
    ("inputs not a list", b'{"inputs": {}}', None, "'inputs' must be an array"),
    ("input not an object", b'{"inputs": [3]}', None, "input 0 must be a JSON object"),
    (
        "missing name",
        _one({"shape": [1], "datatype": "FP32", "data": [1]}),
        None,
        "input 0 has no 'name'",
    ),
    (
        "missing shape",
        _one({"name": "x", "datatype": "FP32", "data": [1]}),
        None,
        "input 'x' has no 'shape'",
    ),
    ("bad shape", _one(_fp32(shape=[-1], data=[1])), None, "'shape' of input 'x' must be an array"),
    (
        "bool in shape",
        _one(_fp32(shape=[True], data=[1])),
        None,
        "'shape' of input 'x' must be an array",
    ),
    (
        "missing datatype",
        _one({"name": "x", "shape": [1], "data": [1]}),
        None,
        "input 'x' has no 'datatype'",
    ),
    ("unknown datatype", _one(_fp32(datatype="FP8", data=[1, 2])), None, "invalid datatype 'FP8'"),
    (
        "both data and binary",
        _one(_fp32(data=[1, 2], parameters=_bin(8))) + b"\0" * 8,
        len(_one(_fp32(data=[1, 2], parameters=_bin(8)))),
        "input 'x' has both 'data' and a 'binary_data_size'",
    ),
    (
        "neither data nor binary",
        _one(_fp32()),
        None,
        "input 'x' has neither 'data' nor a 'binary_data_size'",
    ),
    (
        "bad binary size",
        _one(_fp32(parameters=_bin(-8))),
        None,
        "'binary_data_size' of input 'x' must be",
    ),
    (
        "element count",
        _one(_fp32(data=[1, 2, 3])),
        None,
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    (
        "nested count",
        _one(_fp32(data=[[1], [2, 3]])),
        None,
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    ("data not a list", _one(_fp32(data=1.0)), None, "'data' of input 'x' must be an array"),
    (
        "FP16 as JSON",
        _one(_fp32(datatype="FP16", data=[1, 2])),
        None,
        "receiving FP16 data via JSON is not supported",
    ),
    (
        "BF16 as JSON",
        _one(_fp32(datatype="BF16", data=[1, 2])),
        None,
        "receiving BF16 data via JSON is not supported",
    ),
    ("string in FP32", _one(_fp32(data=[1, "2"])), None, "FP32 'data' elements must be numbers"),
    ("bool in FP32", _one(_fp32(data=[1, True])), None, "FP32 'data' elements must be numbers"),
    ("FP32 overflow", _one(_fp32(data=[1, 1e39])), None, "out of range for FP32"),
    (
        "float in INT32",
        _one(_fp32(datatype="INT32", data=[1, 1.5])),
        None,
        "INT32 'data' elements must be integers",
    ),
    (
        "INT8 overflow",
        _one(_fp32(datatype="INT8", data=[1, 128])),
        None,
        "value 128 is out of range for INT8",
    ),
    (
        "UINT8 negative",
        _one(_fp32(datatype="UINT8", data=[-1, 1])),
        None,
        "value -1 is out of range for UINT8",
    ),
    (
        "INT64 overflow",
        _one(_fp32(datatype="INT64", data=[1, 2**63])),
        None,
        "out of range for INT64",
    ),
    (
        "int in BOOL",
        _one(_fp32(datatype="BOOL", data=[True, 1])),
        None,
        "BOOL 'data' elements must be booleans",
    ),
    (
        "number in BYTES",
        _one(_fp32(datatype="BYTES", data=["a", 1])),
        None,
        "BYTES 'data' elements must be strings",
    ),
    ("null in data", _one(_fp32(data=[1, None])), None, "FP32 'data' elements must be numbers"),
    (
        "BYTES prefix overrun",
        _one(_fp32(datatype="BYTES", parameters=_bin(6))) + b"\x09\0\0\0ab",
        len(_one(_fp32(datatype="BYTES", parameters=_bin(6)))),
        "input 'x': BYTES element 0 has length 9, which overruns the buffer",
    ),
    (
        "BYTES truncated prefix",
        _one(_fp32(datatype="BYTES", parameters=_bin(7))) + b"\x01\0\0\0a\0\0",
        len(_one(_fp32(datatype="BYTES", parameters=_bin(7)))),
        "incomplete string length indicator for inference input 'x' for model 'm', expecting 4 "
        "bytes but only 2 bytes available",
    ),
    (
        "BYTES too few elements",
        _one(_fp32(datatype="BYTES", parameters=_bin(5))) + b"\x01\0\0\0a",
        len(_one(_fp32(datatype="BYTES", parameters=_bin(5)))),
        "expected 2 string elements for inference input 'x' for model 'm', got 1",
    ),
    (
        "BYTES too many elements",
        _one(_fp32(datatype="BYTES", parameters=_bin(12))) + b"\0\0\0\0" * 3,
        len(_one(_fp32(datatype="BYTES", parameters=_bin(12)))),
        "unexpected number of string elements 3 for inference input 'x' for model 'm', expecting 2",
    ),
    (
        "duplicate input",
        orjson.dumps({"inputs": [_fp32(data=[1, 2])] * 2}),
        None,
        "[request id: <id_unknown>] input 'x' already exists in request",
    ),
    ("id not a string", _one(_fp32(data=[1, 2]), id=5), None, "the request 'id' must be a string"),
    ("id zero", _one(_fp32(data=[1, 2]), id=0), None, "the request 'id' must be a string"),
    (
        "parameters not an object",
        _one(_fp32(data=[1, 2]), parameters=[1]),
        None,
        "'parameters' of the request must be a JSON object",
    ),
    (
        "nested parameter",
        _one(_fp32(data=[1, 2]), parameters={"p": {"a": 1}}),
        None,
        "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'.",
    ),
    (
        "null parameter",
        _one(_fp32(data=[1, 2]), parameters={"p": None}),
        None,
        "parameter 'p' has invalid type. It should be either 'int', 'bool', or 'string'.",
    ),
    (
        "a read input parameter of another type",
        _one(_fp32(data=[1, 2], parameters={"headers": None, "binary_data_size": None})),
        None,
        "parameter 'binary_data_size' of input 'x' must be a boolean, number or string, not null",
    ),
    (
        "a read output parameter of another type",
        _one(_fp32(data=[1, 2]), outputs=[{"name": "y", "parameters": {"classification": [2]}}]),
        None,
        "parameter 'classification' of output 'y' must be a boolean, number or string",
    ),
    ("reserved parameter", _one(_fp32(data=[1, 2]), parameters={"triton_x": 1}), None, "reserved"),
    (
        "bad priority",
        _one(_fp32(data=[1, 2]), parameters={"priority": -1}),
        None,
        "Unable to parse 'priority': attempt to access JSON non-unsigned-integer as "
        "unsigned-integer",
    ),
    (
        "outputs not a list",
        _one(_fp32(data=[1, 2]), outputs={}),
        None,
        "'outputs' must be an array",
    ),
    (
        "output without name",
        _one(_fp32(data=[1, 2]), outputs=[{}]),
        None,
        "requested output 0 has no 'name'",
    ),
    (
        "duplicate output",
        _one(_fp32(data=[1, 2]), outputs=[{"name": "y"}] * 2),
        None,
        "[request id: <id_unknown>] output 'y' already exists in request",
    ),
    (
        "negative classification",
        _one(_fp32(data=[1, 2]), outputs=[{"name": "y", "parameters": {"classification": -1}}]),
        None,
        "'classification' of output 'y' must be a non-negative integer",
    ),
    (
        "float classification",
        _one(_fp32(data=[1, 2]), outputs=[{"name": "y", "parameters": {"classification": 1.5}}]),
        None,
        "'classification' of output 'y' must be a non-negative integer",
    ),
    (
        "binary_data not a bool",
        _one(_fp32(data=[1, 2]), outputs=[{"name": "y", "parameters": {"binary_data": 1}}]),
        None,
        "'binary_data' of output 'y' must be a boolean",
    ),
    (
        "binary_data_output a string",
        _one(_fp32(data=[1, 2]), parameters={"binary_data_output": "yes"}),
        None,
        "parameter 'binary_data_output' must be a boolean",
    ),
    (
        "binary_data_output a number",
        _one(_fp32(data=[1, 2]), parameters={"binary_data_output": 1}),
        None,
        "parameter 'binary_data_output' must be a boolean",
    ),
]


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [case[1:] for case in ERROR_CASES],
    ids=[case[0] for case in ERROR_CASES],
)
def test_request_errors(body: bytes, header_length: int | None, message: str) -> None:
    error = error_of(lambda: decode_infer_request("m", "", body, header_length))
    assert error.code is ErrorCode.INVALID_ARG
    assert message in error.message


def test_tensor_parameters_nothing_reads_are_ignored_whatever_their_type() -> None:
    """Triton reads only its own keys of a tensor's parameters; MLServer's clients send
    `"headers": null` and objects on every input and output."""
    extra = {"content_type": "np", "headers": None, "tags": {"a": 1}, "list": [1]}
    spec = _fp32(data=[1, 2], parameters=extra)
    output = {"name": "y", "parameters": {"headers": None, "binary_data": True}}
    request = decode_infer_request("m", "", _one(spec, outputs=[output]), None)
    (decoded,) = request.inputs
    assert decoded.parameters == {"content_type": "np"}
    assert decoded.data.tolist() == [1.0, 2.0]
    (wanted,) = request.outputs
    assert wanted.parameters == {"binary_data": True}
    # And their null id is no id, as they mean it.
    assert decode_infer_request("m", "", _one(spec, id=None), None).id == ""


def test_shared_memory_tensors_decode_to_references() -> None:
    """tritonclient's set_shared_memory() on an input and an output: no data in the body,
    the reference on the tensor, and nothing of it left in the parameters."""
    tensor = triton_http.InferInput("x", [2], "FP32")
    tensor.set_shared_memory("in", 8, offset=16)
    wanted = triton_http.InferRequestedOutput("y")
    wanted.set_shared_memory("out", 32)
    body = orjson.dumps({"inputs": [tensor._get_tensor()], "outputs": [wanted._get_tensor()]})
    request = decode_infer_request("m", "", body, None)
    (decoded,) = request.inputs
    assert decoded.shm == SharedMemoryRef("in", 8, 16)
    assert decoded.data.size == 0 and decoded.parameters == {}
    (output,) = request.outputs
    assert output.shm == SharedMemoryRef("out", 32, 0)
    assert "shared_memory_region" not in output.parameters


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"data": [1.0, 2.0]}, "But set 'data' 'shared_memory_region'"),
        ({"parameters": {"binary_data_size": 8}}, "But set 'binary_data_size' 'shared_memory"),
        ({"parameters": {}}, "'shared_memory_byte_size' must be specified along with"),
        ({"parameters": {"shared_memory_byte_size": -1}}, "non-negative integer"),
        ({"parameters": {"shared_memory_byte_size": 8, "shared_memory_offset": "0"}}, "offset"),
    ],
)
def test_shared_memory_input_errors(extra: dict[str, Any], message: str) -> None:
    spec = _fp32(**extra)
    params = spec.setdefault("parameters", {})
    params.setdefault("shared_memory_region", "r")
    if "shared_memory_byte_size" not in params and "binary_data_size" in params:
        params["shared_memory_byte_size"] = 8
    if "data" in spec:
        params["shared_memory_byte_size"] = 8
    error = error_of(lambda: decode_infer_request("m", "", _one(spec), None))
    assert error.code is ErrorCode.INVALID_ARG
    assert message in error.message, error.message


def test_shared_memory_parameters_need_a_region() -> None:
    spec = _fp32(data=[1.0, 2.0], parameters={"shared_memory_byte_size": 8})
    error = error_of(lambda: decode_infer_request("m", "", _one(spec), None))
    assert "'shared_memory_byte_size' can not be specified without" in error.message


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"binary_data": True}, "Output can't set both 'shared_memory_region' and 'binary_data'"),
        ({"classification": 2}, "Output can't set both 'shared_memory_region' and 'class"),
    ],
)
def test_shared_memory_output_conflicts(params: dict[str, Any], message: str) -> None:
    output = {
        "name": "y",
        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8, **params},
    }
    body = _one(_fp32(data=[1.0, 2.0]), outputs=[output])
    error = error_of(lambda: decode_infer_request("m", "", body, None))
    assert error.code is ErrorCode.INVALID_ARG
    assert message in error.message


def test_shared_memory_output_is_described_without_data() -> None:
    data = np.arange(4, dtype=np.float32)
    shm_tensor = tensor_of("y", DataType.FP32, data)
    shm_tensor.shm = SharedMemoryRef("out", 16)
    body, length = encode_infer_response(
        response_of(shm_tensor, tensor_of("z", DataType.FP32, data)),
        InferRequest("m", wire={"binary_data_output": True}),
    )
    header, binary = split_response(body, length)
    assert header["outputs"][0] == {"name": "y", "datatype": "FP32", "shape": [4]}
    assert header["outputs"][1]["parameters"] == {"binary_data_size": 16}
    assert binary == data.tobytes()


# --- response encoding ----------------------------------------------------------------------


@pytest.mark.parametrize("datatype", JSON_TYPES, ids=lambda d: d.value)
def test_json_output_round_trip(datatype: DataType) -> None:
    arr = sample(datatype, for_json=True)
    body, length = encode_infer_response(
        response_of(tensor_of("y", datatype, arr)), InferRequest("m")
    )
    assert length is None
    doc = orjson.loads(body)
    (output,) = doc["outputs"]
    assert output == {
        "name": "y",
        "datatype": datatype.value,
        "shape": list(arr.shape),
        "data": output["data"],
    }
    # JSON data is flat and row-major.
    if datatype is DataType.BYTES:
        assert output["data"] == [item.decode() for item in arr.reshape(-1)]
    else:
        decoded = np.array(output["data"], dtype=datatype.numpy).reshape(arr.shape)
        assert_equal(decoded, arr)


@pytest.mark.parametrize("datatype", list(DataType), ids=lambda d: d.value)
def test_binary_output_round_trip(datatype: DataType) -> None:
    arr = sample(datatype)
    request = InferRequest("m", wire={"binary_data_output": True})
    body, length = encode_infer_response(response_of(tensor_of("y", datatype, arr)), request)
    assert length is not None
    doc, rest = split_response(body, length)
    (output,) = doc["outputs"]
    expected = raw_bytes(datatype, arr)
    assert output == {
        "name": "y",
        "datatype": datatype.value,
        "shape": list(arr.shape),
        "parameters": {"binary_data_size": len(expected)},
    }
    assert rest == expected


def test_response_layout_byte_for_byte() -> None:
    a = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    b = np.array([True, False, True])
    c = np.array([b"ab", b""], dtype=object)
    d = np.array([5, 6], dtype=np.int64)
    response = InferResponse(
        model_name="m",
        model_version="3",
        id="r1",
        parameters={"p": 1},
        outputs=[
            tensor_of("a", DataType.FP32, a),
            tensor_of("b", DataType.BOOL, b),
            tensor_of("c", DataType.BYTES, c),
            Tensor("d", DataType.INT64, (2,), d, parameters={"q": "x"}),
        ],
    )
    request = InferRequest(
        "m",
        outputs=[
            RequestedOutput("a", parameters={"binary_data": True}),
            RequestedOutput("b", parameters={"binary_data": False}),
            RequestedOutput("c", parameters={"binary_data": True}),
            RequestedOutput("d"),
        ],
    )
    body, length = encode_infer_response(response, request)
    expected_header = {
        "id": "r1",
        "model_name": "m",
        "model_version": "3",
        "parameters": {"p": 1},
        "outputs": [
            {
                "name": "a",
                "datatype": "FP32",
                "shape": [2, 2],
                "parameters": {"binary_data_size": 16},
            },
            {"name": "b", "datatype": "BOOL", "shape": [3], "data": [True, False, True]},
            {
                "name": "c",
                "datatype": "BYTES",
                "shape": [2],
                "parameters": {"binary_data_size": 10},
            },
            {
                "name": "d",
                "datatype": "INT64",
                "shape": [2],
                "parameters": {"q": "x"},
                "data": [5, 6],
            },
        ],
    }
    assert length is not None
    assert body[:length] == orjson.dumps(expected_header)
    assert body[length:] == a.tobytes() + b"\x02\0\0\0ab" + b"\0\0\0\0"


def test_response_omits_empty_id_and_parameters() -> None:
    body, length = encode_infer_response(
        response_of(tensor_of("y", DataType.INT32, np.array([1], dtype=np.int32))),
        InferRequest("m"),
    )
    assert length is None
    assert orjson.loads(body) == {
        "model_name": "m",
        "model_version": "1",
        "outputs": [{"name": "y", "datatype": "INT32", "shape": [1], "data": [1]}],
    }


def _binary_names(request: InferRequest, names: tuple[str, ...] = ("a", "b")) -> list[str]:
    outputs = [tensor_of(n, DataType.INT32, np.array([1], dtype=np.int32)) for n in names]
    body, length = encode_infer_response(response_of(*outputs), request)
    doc, _ = split_response(body, length)
    return [o["name"] for o in doc["outputs"] if "binary_data_size" in o.get("parameters", {})]


@pytest.mark.parametrize(
    ("outputs", "parameters", "binary"),
    [
        ([], {}, []),
        ([], {"binary_data_output": True}, ["a", "b"]),
        ([], {"binary_data_output": False}, []),
        ([RequestedOutput("a", parameters={"binary_data": True})], {}, ["a"]),
        (
            [RequestedOutput("a", parameters={"binary_data": False})],
            {"binary_data_output": True},
            ["b"],
        ),
        # Triton: a named output is JSON unless it says binary_data: true.
        ([RequestedOutput("a")], {"binary_data_output": True}, ["b"]),
        (
            [RequestedOutput("a", parameters={"binary_data": True}), RequestedOutput("b")],
            {},
            ["a"],
        ),
    ],
    ids=[
        "default json",
        "binary_data_output",
        "binary_data_output false",
        "per-output binary",
        "per-output json overrides",
        "named without binary_data is json",
        "only the flagged one",
    ],
)
def test_binary_output_selection(
    outputs: list[RequestedOutput], parameters: dict[str, Any], binary: list[str]
) -> None:
    assert _binary_names(InferRequest("m", outputs=outputs, wire=parameters)) == binary


@pytest.mark.parametrize("datatype", [DataType.FP16, DataType.BF16], ids=lambda d: d.value)
def test_half_precision_outputs_are_always_binary(datatype: DataType) -> None:
    arr = sample(datatype)
    request = InferRequest("m", outputs=[RequestedOutput("y", parameters={"binary_data": False})])
    body, length = encode_infer_response(response_of(tensor_of("y", datatype, arr)), request)
    doc, rest = split_response(body, length)
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": arr.nbytes}
    assert rest == arr.tobytes()


def test_non_utf8_bytes_output_asked_as_json_is_refused_with_its_name() -> None:
    arr = np.array([b"\xff\xfe", b"ok"], dtype=object)
    with pytest.raises(ServerError) as caught:
        encode_infer_response(response_of(tensor_of("y", DataType.BYTES, arr)), InferRequest("m"))
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == (
        "output 'y' holds BYTES that are not valid UTF-8, which a JSON response cannot carry; "
        'request it as binary data ("binary_data": true on the output, or '
        '"binary_data_output": true on the request)'
    )


@pytest.mark.parametrize(
    "request_",
    [
        InferRequest("m", wire={"binary_data_output": True}),
        InferRequest("m", outputs=[RequestedOutput("y", parameters={"binary_data": True})]),
    ],
    ids=["binary_data_output", "binary_data"],
)
def test_non_utf8_bytes_output_asked_as_binary_goes_unchanged(request_: InferRequest) -> None:
    arr = np.array([b"\xff\xfe", b"ok"], dtype=object)
    body, length = encode_infer_response(response_of(tensor_of("y", DataType.BYTES, arr)), request_)
    doc, rest = split_response(body, length)
    assert doc["outputs"][0]["parameters"] == {"binary_data_size": 12}
    assert rest == b"\x02\0\0\0\xff\xfe\x02\0\0\0ok"


def test_output_data_is_converted_to_its_datatype_and_row_major() -> None:
    # Fortran-ordered float64 data labelled FP32: sent as C-order float32.
    arr = np.asfortranarray(np.arange(6, dtype=np.float64).reshape(2, 3))
    request = InferRequest("m", wire={"binary_data_output": True})
    body, length = encode_infer_response(response_of(tensor_of("y", DataType.FP32, arr)), request)
    _, rest = split_response(body, length)
    assert rest == np.arange(6, dtype=np.float32).tobytes()
    body, _ = encode_infer_response(
        response_of(tensor_of("y", DataType.FP32, arr)), InferRequest("m")
    )
    assert orjson.loads(body)["outputs"][0]["data"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_output_shape_mismatch_is_internal() -> None:
    tensor = Tensor("y", DataType.INT32, (3,), np.array([1], dtype=np.int32))
    error = error_of(lambda: encode_infer_response(response_of(tensor), InferRequest("m")))
    assert error.code is ErrorCode.INTERNAL
    assert "output 'y' has 1 elements" in error.message


# --- BYTES and JSON helpers -----------------------------------------------------------------


def test_bytes_tensor_helpers() -> None:
    arr = np.array([["", "ü"], [b"\x00", 7]], dtype=object)
    data = serialize_bytes_tensor(arr)
    assert data == b"\0\0\0\0" + b"\x02\0\0\0\xc3\xbc" + b"\x01\0\0\0\x00" + b"\x01\0\0\0" + b"7"
    back = deserialize_bytes_tensor(data, 4)
    assert back.dtype == np.object_ and back.shape == (4,)
    assert back.tolist() == [b"", "ü".encode(), b"\x00", b"7"]
    assert deserialize_bytes_tensor(data, None).tolist() == back.tolist()
    assert serialize_bytes_tensor(np.array([], dtype=object)) == b""
    assert deserialize_bytes_tensor(b"", 0).shape == (0,)
    assert serialize_bytes_tensor(np.array([b"ab", b"c"])) == b"\x02\0\0\0ab\x01\0\0\0c"
    error = error_of(lambda: deserialize_bytes_tensor(b"\x05\0\0\0abc", None))
    assert error.code is ErrorCode.INVALID_ARG and "overruns the buffer" in error.message


def test_json_helpers() -> None:
    assert encode_json({"a": np.int64(3), "b": np.array([1.5])}) == b'{"a":3,"b":[1.5]}'
    assert decode_json_object(b'{"ready": true}', "index request") == {"ready": True}
    error = error_of(lambda: decode_json_object(b"{", "index request"))
    assert error.code is ErrorCode.INVALID_ARG
    assert error.message.startswith("failed to parse the index request JSON buffer: ")
    error = error_of(lambda: decode_json_object(b"[]", "index request"))
    assert "the index request JSON must be an object, not an array" in error.message
    assert parse_header_length(None) is None
    assert parse_header_length("12") == 12 and parse_header_length("-1") == -1
    # Only ASCII digits: int() reads all but the last as 12; the last is past its limit.
    for value in (" 12 ", "1_2", "+12", "١٢", "12\xa0", "1" * 5000):
        with pytest.raises(ServerError) as info:
            parse_header_length(value)
        assert (
            info.value.message == f"invalid Inference-Header-Content-Length header value '{value}'"
        )
    assert (
        "invalid Inference-Header-Content-Length"
        in error_of(lambda: parse_header_length("x")).message
    )


# --- interoperability with the real tritonclient --------------------------------------------


def _client_inputs(
    binary: bool,
) -> tuple[list[triton_http.InferInput], dict[str, npt.NDArray[Any]]]:
    arrays: dict[str, tuple[str, npt.NDArray[Any]]] = {
        "f32": ("FP32", np.arange(6, dtype=np.float32).reshape(2, 3) / 7),
        "i64": ("INT64", np.array([[-(2**63), 2**63 - 1]], dtype=np.int64)),
        "u8": ("UINT8", np.array([0, 255], dtype=np.uint8)),
        "b": ("BOOL", np.array([True, False])),
        "s": ("BYTES", np.array([["", "héllo"], ["✓", "x"]], dtype=object)),
    }
    if binary:
        arrays["f16"] = ("FP16", np.array([0.5, -2], dtype=np.float16))
        arrays["bf16"] = ("BF16", np.array([[1.5, -3.0]], dtype=ml_dtypes.bfloat16))
    inputs = []
    for name, (datatype, arr) in arrays.items():
        infer_input = triton_http.InferInput(name, list(arr.shape), datatype)
        infer_input.set_data_from_numpy(arr, binary_data=binary)
        inputs.append(infer_input)
    return inputs, {name: arr for name, (_, arr) in arrays.items()}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_decodes_tritonclient_requests(binary: bool) -> None:
    inputs, arrays = _client_inputs(binary)
    outputs = [
        triton_http.InferRequestedOutput("out0", binary_data=True, class_count=2),
        triton_http.InferRequestedOutput("out1", binary_data=False),
    ]
    body, length = triton_http.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id="rid", priority=3, timeout=100, parameters={"k": "v"}
    )
    assert (length is None) is not binary
    request = decode_infer_request("m", "", body, length)
    assert request.id == "rid"
    assert (request.priority, request.timeout_us) == (3, 100)
    assert request.parameters == {"k": "v"}
    assert request.outputs == [
        RequestedOutput("out0", 2, {"binary_data": True}),
        RequestedOutput("out1", 0, {"binary_data": False}),
    ]
    decoded = {t.name: t for t in request.inputs}
    assert list(decoded) == list(arrays)
    for name, arr in arrays.items():
        tensor = decoded[name]
        assert tensor.shape == arr.shape
        if name == "s":
            assert tensor.data.tolist() == [[x.encode() for x in row] for row in arr.tolist()]
        elif name == "bf16":
            assert tensor.data.dtype == ml_dtypes.bfloat16
            assert tensor.data.astype(np.float32).tolist() == arr.tolist()
        else:
            assert_equal(tensor.data, arr)


def test_tritonclient_default_outputs_ask_for_binary() -> None:
    inputs, _ = _client_inputs(binary=True)
    body, length = triton_http.InferenceServerClient.generate_request_body(inputs)
    request = decode_infer_request("m", "", body, length)
    assert _binary_names(request) == ["a", "b"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_parses_responses(binary: bool) -> None:
    # Even the JSON case has FP16 and BF16, which go binary regardless.
    arrays = {dt: sample(dt, for_json=not binary) for dt in DataType}
    response = InferResponse(
        model_name="m",
        model_version="1",
        id="rid",
        outputs=[tensor_of(dt.value.lower(), dt, arr) for dt, arr in arrays.items()],
    )
    request = InferRequest("m", wire={"binary_data_output": binary})
    body, length = encode_infer_response(response, request)
    result = triton_http.InferResult.from_response_body(
        body, verbose=False, header_length=length, content_encoding=None
    )
    assert result.get_response()["id"] == "rid"
    for dt, arr in arrays.items():
        got = result.as_numpy(dt.value.lower())
        assert got is not None and got.shape == arr.shape, dt
        if dt is DataType.BF16:
            # tritonclient widens bfloat16 to float32.
            assert got.tolist() == arr.astype(np.float32).tolist()
        elif dt is DataType.BYTES:
            if binary:
                assert got.tolist() == arr.tolist()
            else:
                assert got.tolist() == [[x.decode() for x in row] for row in arr.tolist()]
        else:
            assert_equal(got, arr)


# --- NaN and the infinities ----------------------------------------------------------------

NONFINITE = [np.nan, np.inf, -np.inf, 0.1, -2.0]


@pytest.mark.parametrize("datatype", [DataType.FP32, DataType.FP64], ids=lambda d: d.value)
def test_json_output_writes_nan_and_the_infinities_as_tritons_literals(datatype: DataType) -> None:
    arr = np.array([NONFINITE, NONFINITE[::-1]], dtype=datatype.numpy)
    body, _ = encode_infer_response(response_of(tensor_of("y", datatype, arr)), InferRequest("m"))
    assert b'"data":[NaN,Infinity,-Infinity,0.1,-2.0,-2.0,0.1,-Infinity,Infinity,NaN]' in body
    result = triton_http.InferResult.from_response_body(body, verbose=False, header_length=None)
    assert_equal(result.as_numpy("y"), arr)


def literal_request(datatype: str, data: str, extra: str = "") -> InferRequest:
    body = f'{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":[3],"data":{data}}}]{extra}}}'
    return decode_infer_request("m", "", body.encode(), None)


@pytest.mark.parametrize("datatype", [DataType.FP32, DataType.FP64], ids=lambda d: d.value)
def test_json_input_reads_tritons_literals_and_nothing_else_orjson_refuses(
    datatype: DataType,
) -> None:
    (tensor,) = literal_request(datatype.value, "[NaN,Infinity,-Infinity]").inputs
    assert_equal(tensor.data, np.array([np.nan, np.inf, -np.inf], dtype=datatype.numpy))
    # Where the body is refused for something besides a literal, orjson's message stands.
    for data, extra in [
        ("[NaN,1e400,1]", ""),
        ('[NaN,1,"\\ud800"]', ""),
        ("[NaN,1,1]", ', "id": "\\ud800"'),
        ("[NaN,1,1]", "x"),
        ("[-NaN,1,1]", ""),
    ]:
        with pytest.raises(ServerError) as info:
            literal_request(datatype.value, data, extra)
        message = info.value.message
        assert message.startswith("failed to parse the request JSON buffer: "), (data, extra)
    # An infinity is taken as given; a finite value past FP32 is still refused beside it.
    message = error_of(lambda: literal_request("FP32", "[NaN,1e39,Infinity]")).message
    assert message == "input 'x': a value is out of range for FP32"
    # Integers past 64 bits are floats, as orjson reads them.
    big = error_of(lambda: literal_request("INT64", f"[{2**64},NaN,1]")).message
    assert big == "input 'x': INT64 'data' elements must be integers"
