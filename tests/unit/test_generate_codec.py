"""The generate extension's JSON mapping, as pure functions: keys to inputs and
parameters, shapes deduced from the model's dims, datatypes from the model's, and
responses to flat JSON objects."""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.http.generate_codec import (
    decode_generate_request,
    deduce_shape,
    encode_generate_response,
)
from ge_serve.server.inference.reports import TensorMetadata
from ge_serve.server.inference.types import DataType, InferRequest, InferResponse, Tensor
from ge_serve.server.inference.wire import object_array


def decode(body: Any, *inputs: tuple[str, DataType, tuple[int, ...]]) -> InferRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    specs = [TensorMetadata(name, datatype, shape) for name, datatype, shape in inputs]
    return decode_generate_request("m", "", raw, specs, 1 << 20)


def refused(body: Any, *inputs: tuple[str, DataType, tuple[int, ...]]) -> str:
    with pytest.raises(ServerError) as raised:
        decode(body, *inputs)
    assert raised.value.code is ErrorCode.INVALID_ARG
    return raised.value.message


@pytest.mark.parametrize(
    ("dims", "count", "shape"),
    [
        ((-1, 1), 1, (1, 1)),  # a scalar under a batch dimension
        ((1, 1), 1, (1, 1)),
        ((-1, 3), 6, (2, 3)),
        ((-1,), 5, (5,)),
        ((1, -1), 4, (1, 4)),
        ((-1, -1), 4, (1, 4)),  # the innermost variable dimension takes the rest
        ((2, -1, 2), 8, (2, 2, 2)),
        ((-1,), 0, (0,)),
        ((4,), 4, (4,)),
        ((), 1, ()),
    ],
)
def test_shapes_are_deduced_from_the_dims(
    dims: tuple[int, ...], count: int, shape: tuple[int, ...]
) -> None:
    assert deduce_shape(dims, count, "x") == shape


@pytest.mark.parametrize(("dims", "count"), [((-1, 3), 5), ((4,), 3), ((4,), 0), ((2, 2), 8)])
def test_a_count_the_dims_cannot_hold_is_refused(dims: tuple[int, ...], count: int) -> None:
    with pytest.raises(ServerError, match="can not convert input 'x' to tensor"):
        deduce_shape(dims, count, "x")


def test_keys_that_are_not_inputs_are_parameters_and_id_is_both() -> None:
    request = decode(
        {"id": "r1", "x": [1, 2], "temperature": 0.5, "n": 3, "stream": True, "s": "v"},
        ("x", DataType.INT64, (-1,)),
    )
    assert request.id == "r1"
    assert request.parameters == {"id": "r1", "temperature": 0.5, "n": 3, "stream": True, "s": "v"}
    # priority and timeout stay parameters, as in Triton's generate.
    assert decode({"priority": 1}).parameters == {"priority": 1}
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", DataType.INT64, (2,))
    assert tensor.data.tolist() == [1, 2]
    assert tensor.data.dtype == np.int64


def test_nested_parameters_may_hold_inputs() -> None:
    request = decode({"parameters": {"x": 7, "k": "v"}}, ("x", DataType.UINT8, (1,)))
    assert request.parameters == {"k": "v"}
    assert request.inputs[0].data.tolist() == [7]
    message = refused({"parameters": {}}, ("parameters", DataType.BOOL, (1,)))
    assert message == "Keyword 'parameters' for nested schema also given as input tensor name"
    message = refused({"x": 1, "parameters": {"x": 2}}, ("x", DataType.INT32, (1,)))
    assert message == "Converting keyword: 'parameters': input 'x' already exists in request"


@pytest.mark.parametrize(
    ("datatype", "value", "message"),
    [
        (DataType.BOOL, 1, "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
        (DataType.INT32, 1.5, "attempt to access JSON non-signed-integer as signed-integer"),
        (DataType.INT32, True, "attempt to access JSON non-signed-integer as signed-integer"),
        (DataType.UINT16, -1, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
        (DataType.FP32, "1", "attempt to access JSON non-number as double"),
        (DataType.BYTES, 1, "Unable to parse JSON bytes array: attempt to access JSON non-string"),
        (DataType.INT8, 200, "input 'x': value 200 is out of range for INT8"),
        (DataType.FP32, 1e39, "input 'x': a value is out of range for FP32"),
        (DataType.FP16, 1.0, "receiving FP16 data via JSON is not supported"),
        (DataType.INT32, [[1, 2]], "Unable to parse 'data': Shape does not match true shape"),
        (DataType.INT32, [[]], "Failed to parse 'data' field: shape does not match true shape"),
        (DataType.INT32, {"a": 1}, "attempt to access JSON non-signed-integer"),
        (DataType.INT32, {}, "attempt to access JSON non-signed-integer"),
        (DataType.BYTES, {}, "attempt to access JSON non-string as string"),
        (DataType.FP64, [1, None], "attempt to access JSON non-number as double"),
    ],
)
def test_values_must_fit_the_datatype(datatype: DataType, value: Any, message: str) -> None:
    assert message in refused({"x": value}, ("x", datatype, (-1,)))


def test_values_become_arrays_of_the_datatype() -> None:
    request = decode(
        {"b": [True, False], "f": [1, 2.5], "d": 0.25, "s": ["a", "é"], "u": [0, 65535]},
        ("b", DataType.BOOL, (-1,)),
        ("f", DataType.FP32, (-1,)),
        ("d", DataType.FP64, (1,)),
        ("s", DataType.BYTES, (-1, -1)),
        ("u", DataType.UINT16, (2,)),
    )
    found = {t.name: t for t in request.inputs}
    assert found["b"].data.tolist() == [True, False]
    assert found["f"].data.dtype == np.float32 and found["f"].data.tolist() == [1.0, 2.5]
    assert found["d"].data.tolist() == [0.25]
    assert found["s"].shape == (1, 2)
    assert found["s"].data.tolist() == [[b"a", "é".encode()]]
    assert found["u"].data.dtype == np.uint16


def test_a_nested_array_with_one_leaf_per_element_is_accepted_as_triton_does() -> None:
    (tensor,) = decode({"x": [[1], [2]]}, ("x", DataType.INT32, (-1,))).inputs
    assert (tensor.shape, tensor.data.tolist()) == ((2,), [1, 2])


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[]", "the generate request JSON must be an object"),
        (b'{"x": -NaN}', "failed to parse the request JSON buffer"),
        (b"{,}", "failed to parse the request JSON buffer"),
        (b'{"id": null}', "Unable to parse 'id': attempt to access JSON non-string as string"),
        (b'{"p": null}', "parameter 'p' has invalid type"),
        (b'{"p": [1]}', "parameter 'p' has invalid type"),
        (b'{"parameters": []}', "Expected JSON object for keyword: 'parameters'"),
    ],
)
def test_malformed_requests_are_refused(body: bytes, message: str) -> None:
    assert message in refused(body)


def test_the_expanded_size_is_capped() -> None:
    specs = [TensorMetadata("a", DataType.INT64, (-1,)), TensorMetadata("b", DataType.BYTES, (-1,))]
    body = json.dumps({"a": [1] * 8, "b": ["xyz"]}).encode()
    assert len(decode_generate_request("m", "", body, specs, 71).inputs) == 2
    with pytest.raises(ServerError) as raised:
        decode_generate_request("m", "", body, specs, 70)
    assert raised.value.message == (
        "request size of 64 bytes with input 'b' of size 7 bytes exceeds the maximum allowed "
        "input size of 70. Use --http-max-input-size to increase the limit."
    )


def response(*outputs: Tensor, **fields: Any) -> InferResponse:
    return InferResponse("m", "3", outputs=list(outputs), **fields)


def tensor(name: str, datatype: DataType, data: Any) -> Tensor:
    array = data if isinstance(data, np.ndarray) else np.array(data, dtype=datatype.numpy)
    return Tensor(name, datatype, tuple(array.shape), array)


def test_responses_are_flat_objects_with_sorted_keys() -> None:
    encoded = encode_generate_response(
        response(
            tensor("text", DataType.BYTES, object_array([b"hi"]).reshape(1, 1)),
            tensor("ids", DataType.INT32, [[1, 2, 3]]),
            tensor("ok", DataType.BOOL, [True]),
            tensor("p", DataType.FP32, [0.5]),
            tensor("none", DataType.INT32, np.zeros((1, 0), np.int32)),
            id="r",
            parameters={"tokens": 3},
        )
    )
    assert json.loads(encoded) == {
        "ids": [1, 2, 3],
        "id": "r",
        "model_name": "m",
        "model_version": "3",
        "none": [],
        "ok": True,
        "p": 0.5,
        "text": "hi",
        "tokens": 3,
    }
    assert list(json.loads(encoded)) == sorted(json.loads(encoded))


def test_reserved_keys_win_over_parameters_and_outputs() -> None:
    encoded = encode_generate_response(
        response(tensor("model_name", DataType.INT32, [1]), parameters={"model_version": "x"})
    )
    assert json.loads(encoded) == {"model_name": "m", "model_version": "3"}
    assert "id" not in json.loads(encode_generate_response(response()))


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (
            tensor("h", DataType.FP16, [1.0, 2.0]),
            "sending FP16 data via JSON is not supported",
        ),
        (
            tensor("h", DataType.BF16, np.array([1.0], dtype=ml_dtypes.bfloat16)),
            "sending BF16 data via JSON is not supported",
        ),
        (
            tensor("t", DataType.BYTES, object_array([b"\xff"])),
            "output 't' holds BYTES that are not UTF-8 text",
        ),
    ],
)
def test_outputs_json_cannot_carry_are_refused(output: Tensor, message: str) -> None:
    with pytest.raises(ServerError, match=message):
        encode_generate_response(response(output))


def test_nan_and_the_infinities_are_read_and_written_as_triton_does() -> None:
    (tensor,) = decode(b'{"x": [NaN, Infinity, -Infinity]}', ("x", DataType.FP32, (-1,))).inputs
    assert np.array_equal(tensor.data, np.array([np.nan, np.inf, -np.inf]), equal_nan=True)
    outputs = [
        Tensor("y", DataType.FP64, (3,), np.array([np.nan, np.inf, -np.inf])),
        Tensor("z", DataType.FP32, (1,), np.array([-np.inf], dtype=np.float32)),
    ]
    body = encode_generate_response(InferResponse("m", "1", outputs=outputs))
    assert (
        body == b'{"model_name":"m","model_version":"1","y":[NaN,Infinity,-Infinity],"z":-Infinity}'
    )
