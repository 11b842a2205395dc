"""The HTTP codec's one-pass checks refuse and accept exactly what the general ones do.

The codec reads a common shape in one pass and lets numpy find an integer out of range;
these pin the edges of those shortcuts: every shape check_shape refuses is refused in its
words, the largest shapes and values it allows are taken, and output arrays in any memory
order go out row-major.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest

from ge_serve.server.errors import ServerError
from ge_serve.server.http.codec import decode_infer_request, encode_infer_response
from ge_serve.server.inference.types import (
    MAX_DIMS,
    MAX_ELEMENTS,
    DataType,
    InferRequest,
    InferResponse,
    Tensor,
    check_shape,
)

INTEGER_TYPES = [d for d in DataType if d is not DataType.BYTES and d.numpy.kind in "iu"]


def _decode(spec: dict[str, object]) -> InferRequest:
    return decode_infer_request("m", "", orjson.dumps({"inputs": [{"name": "x", **spec}]}), None)


def _message(spec: dict[str, object]) -> str:
    with pytest.raises(ServerError) as info:
        _decode(spec)
    return info.value.message


@pytest.mark.parametrize(
    ("shape", "datatype"),
    [
        ([1] * (MAX_DIMS + 1), "INT8"),
        ([MAX_ELEMENTS + 1], "INT8"),
        ([2**62, 2], "INT64"),
        ([2**63], "INT8"),
        ([2**31, 2**31, 4], "BYTES"),
        ([0, 2**62], "FP32"),
        ([3, 0, 2**61], "INT8"),
    ],
    ids=["dims", "elements", "byte size", "int64", "element count", "zero", "zero mid"],
)
def test_shapes_check_shape_refuses_are_refused_in_its_words(
    shape: list[int], datatype: str
) -> None:
    with pytest.raises(ServerError) as expected:
        check_shape(tuple(shape), "x", DataType.parse(datatype).itemsize)
    message = _message({"shape": shape, "datatype": datatype, "data": []})
    assert message == expected.value.message


@pytest.mark.parametrize(
    "shape", [[-1, 2], [2, True], [2, 1.0], "2", [[2]], [2, -1] * 20], ids=repr
)
def test_malformed_shapes_are_refused_before_their_size(shape: object) -> None:
    message = _message({"shape": shape, "datatype": "INT8", "data": []})
    assert message == "'shape' of input 'x' must be an array of non-negative integers"


def test_the_largest_shapes_pass_to_the_data_check() -> None:
    # Allowed shapes: refused only because the data does not fill them.
    for shape in ([MAX_ELEMENTS], [1] * (MAX_DIMS - 1) + [3]):
        message = _message({"shape": shape, "datatype": "INT8", "data": [1, 2]})
        assert message == "Failed to parse 'data' field: shape does not match true shape"
    request = _decode({"shape": [1] * MAX_DIMS, "datatype": "INT8", "data": [7]})
    assert request.inputs[0].shape == (1,) * MAX_DIMS
    assert request.inputs[0].data.shape == (1,) * MAX_DIMS


@pytest.mark.parametrize("datatype", INTEGER_TYPES, ids=lambda d: d.value)
def test_integer_range_ends(datatype: DataType) -> None:
    info = np.iinfo(datatype.numpy)
    low, high = int(info.min), int(info.max)
    (tensor,) = _decode({"shape": [2], "datatype": datatype.value, "data": [low, high]}).inputs
    assert tensor.data.dtype == datatype.numpy
    assert tensor.data.tolist() == [low, high]
    # orjson reads integers up to 64 bits, so UINT64's excess and INT64's deficit are
    # the parser's to refuse.
    for bad in (low - 1, high + 1):
        if not -(2**63) <= bad < 2**64:
            continue
        message = _message({"shape": [3], "datatype": datatype.value, "data": [0, bad, 1]})
        assert message == f"input 'x': value {bad} is out of range for {datatype.value}"


def test_out_of_range_names_the_low_value_first() -> None:
    message = _message({"shape": [2], "datatype": "INT8", "data": [300, -300]})
    assert message == "input 'x': value -300 is out of range for INT8"


def test_one_dimensional_and_nested_json_data() -> None:
    (flat,) = _decode({"shape": [3], "datatype": "INT16", "data": [1, 2, 3]}).inputs
    assert flat.data.shape == (3,)
    assert flat.data.dtype == np.int16
    nested = _decode({"shape": [3], "datatype": "INT16", "data": [[1], [2, 3]]}).inputs[0]
    assert nested.data.tolist() == [1, 2, 3]
    message = _message({"shape": [3], "datatype": "INT16", "data": [[1], [2, 3.5]]})
    assert message == "input 'x': INT16 'data' elements must be integers"
    # The count is checked before the elements' types.
    message = _message({"shape": [2], "datatype": "INT16", "data": [[1], [2, 3.5]]})
    assert message == "Unable to parse 'data': Shape does not match true shape of 'data' field"


@pytest.mark.parametrize(
    "arr",
    [
        np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
        np.arange(12, dtype=np.int32).reshape(2, 6)[:, ::2],
        np.arange(6, dtype=np.dtype(">i4")).reshape(2, 3),
        np.array(5, dtype=np.int32).reshape(()),
    ],
    ids=["fortran", "strided", "big-endian", "scalar"],
)
def test_outputs_in_any_layout_go_row_major(arr: npt.NDArray[Any]) -> None:
    tensor = Tensor("y", DataType.INT32, tuple(arr.shape), arr)
    response = InferResponse("m", "1", outputs=[tensor])
    expected = np.ascontiguousarray(arr, dtype=np.int32).reshape(-1)
    body, length = encode_infer_response(response, InferRequest("m"))
    assert length is None
    assert orjson.loads(body)["outputs"][0]["data"] == expected.tolist()
    body, length = encode_infer_response(
        response, InferRequest("m", wire={"binary_data_output": True})
    )
    assert length is not None
    head = orjson.loads(body[:length])
    assert head["outputs"][0]["parameters"] == {"binary_data_size": expected.nbytes}
    assert body[length:] == expected.tobytes()
