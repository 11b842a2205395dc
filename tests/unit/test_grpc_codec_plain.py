"""The gRPC codec's plain paths against its general ones.

The codec builds the usual request and response directly and sends anything else through
its general code. Each case here sits on one side of one of the plain path's decisions;
whichever side, the codec must give what the general code alone gives: an equal request
or response, or the same error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.server.errors import ServerError
from ge_serve.server.grpc import codec
from ge_serve.server.inference.types import (
    MAX_DIMS,
    DataType,
    InferResponse,
    SharedMemoryRef,
    Tensor,
)

I32 = np.arange(6, dtype=np.int32).tobytes()


def request(
    inputs: list[tuple[str, str, list[int], bytes]], outputs: tuple[str, ...] = ("y",)
) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", model_version="2", id="7")
    for name, datatype, shape, data in inputs:
        message.inputs.add(name=name, datatype=datatype, shape=shape)
        message.raw_input_contents.append(data)
    for name in outputs:
        message.outputs.add(name=name)
    return message


def plain(**changes: Any) -> pb.ModelInferRequest:
    return request([("a", "INT32", [2, 3], I32), ("b", "FP32", [6], I32)], **changes)


def with_(
    message: pb.ModelInferRequest, *changes: Callable[[pb.ModelInferRequest], object]
) -> pb.ModelInferRequest:
    for change in changes:
        change(message)
    return message


CASES: dict[str, pb.ModelInferRequest] = {
    "plain": plain(),
    "no outputs": plain(outputs=()),
    "scalar": request([("a", "INT32", [], I32[:4])]),
    "every fixed-size type": request(
        [(t.value, t.value, [2], bytes(2 * t.itemsize)) for t in DataType if t.itemsize]
    ),
    "bytes input": request([("a", "BYTES", [1], b"\x01\x00\x00\x00z")]),
    "empty tensor": request([("a", "INT32", [0, 3], b"")]),
    "zero hiding a huge dimension": request([("a", "INT8", [0, 2**61], b"")]),
    "two negative dimensions": request([("a", "INT32", [-2, -3], I32)]),
    "one negative dimension": request([("a", "INT32", [-6], I32)]),
    "too many dimensions": request([("a", "INT8", [1] * (MAX_DIMS + 1), b"\x01")]),
    "byte size mismatch": request([("a", "INT32", [2, 3], I32[:-4])]),
    "unknown datatype": request([("a", "INT33", [6], I32)]),
    "duplicate input": request([("a", "INT32", [6], I32), ("a", "INT32", [6], I32)]),
    "unnamed input": request([("", "INT32", [6], I32)]),
    "duplicate output": plain(outputs=("y", "y")),
    "unnamed output": plain(outputs=("y", "")),
    "more raw buffers than inputs": with_(plain(), lambda m: m.raw_input_contents.append(I32)),
    "fewer raw buffers than inputs": with_(plain(), lambda m: m.raw_input_contents.pop()),
    "typed contents beside raw": with_(
        plain(), lambda m: m.inputs[0].contents.int_contents.extend(range(6))
    ),
    "parameter without a value": with_(plain(), lambda m: m.parameters["k"]),
    "priority": with_(plain(), lambda m: setattr(m.parameters["priority"], "uint64_param", 3)),
    # What tritonclient and perf_analyzer send on every call.
    "empty final response asked": with_(
        plain(),
        lambda m: setattr(m.parameters[codec.ENABLE_EMPTY_FINAL_RESPONSE], "bool_param", True),
    ),
    "empty final response declined": with_(
        plain(),
        lambda m: setattr(m.parameters[codec.ENABLE_EMPTY_FINAL_RESPONSE], "bool_param", False),
    ),
    "empty final response not a boolean": with_(
        plain(),
        lambda m: setattr(m.parameters[codec.ENABLE_EMPTY_FINAL_RESPONSE], "int64_param", 1),
    ),
    "empty final response without a value": with_(
        plain(), lambda m: m.parameters[codec.ENABLE_EMPTY_FINAL_RESPONSE]
    ),
    "empty final response beside another parameter": with_(
        plain(),
        lambda m: setattr(m.parameters[codec.ENABLE_EMPTY_FINAL_RESPONSE], "bool_param", True),
        lambda m: setattr(m.parameters["priority"], "uint64_param", 3),
    ),
    "input parameter": with_(
        plain(), lambda m: setattr(m.inputs[1].parameters["k"], "string_param", "v")
    ),
    "output parameter": with_(
        plain(), lambda m: setattr(m.outputs[0].parameters["classification"], "int64_param", 2)
    ),
}


def outcome(message: pb.ModelInferRequest) -> Any:
    """What decoding gives, in a form that compares arrays by type, shape, bytes and
    writability."""
    try:
        decoded = codec.decode_infer_request(message)
    except ServerError as error:
        return ("error", error.code, error.message)
    request = decoded.request
    inputs = [
        (t.name, t.datatype, t.shape, t.parameters, t.shm, t.data.dtype, t.data.shape,
         t.data.tolist(), t.data.flags.writeable)
        for t in request.inputs
    ]  # fmt: skip
    return (request.model_name, request.model_version, request.id, request.parameters,
            request.priority, request.timeout_us, request.wire, inputs, request.outputs,
            decoded.enable_empty_final_response)  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_request_decodes_as_the_general_path_decodes_it(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = CASES[case]
    got = outcome(message)
    monkeypatch.setattr(codec, "_decode_plain", lambda _: None)
    assert got == outcome(message)


@pytest.mark.parametrize("asked", [False, True])
def test_the_usual_request_takes_the_plain_path_and_views_the_message(asked: bool) -> None:
    message = plain()
    if asked:
        message.parameters[codec.ENABLE_EMPTY_FINAL_RESPONSE].bool_param = True
    decoded = codec._decode_plain(message)
    assert decoded is not None
    assert decoded.enable_empty_final_response is asked
    request = decoded.request
    for tensor, buf in zip(request.inputs, message.raw_input_contents, strict=True):
        assert not tensor.data.flags.writeable
        assert tensor.data.tobytes() == buf


def response(*outputs: Tensor, **parameters: Any) -> InferResponse:
    return InferResponse("m", "2", "7", list(outputs), dict(parameters))


GRID = np.arange(6, dtype=np.int32).reshape(2, 3)
RESPONSES: dict[str, InferResponse] = {
    "plain": response(
        Tensor("y", DataType.INT32, (2, 3), GRID),
        Tensor("z", DataType.FP32, (6,), np.ones(6, np.float32)),
    ),
    "no outputs": response(),
    "every fixed-size type": response(
        *(Tensor(t.value, t, (2,), np.ones(2, t.numpy)) for t in DataType if t.itemsize)
    ),
    "column-major data": response(Tensor("y", DataType.INT32, (3, 2), GRID.T)),
    "data of another type": response(Tensor("y", DataType.INT32, (2, 3), GRID.astype(np.int64))),
    "bytes output": response(Tensor("y", DataType.BYTES, (1,), np.array([b"ab"], object))),
    "output parameter": response(Tensor("y", DataType.INT32, (2, 3), GRID, {"k": 1})),
    "response parameter": response(Tensor("y", DataType.INT32, (2, 3), GRID), k="v"),
    "shared-memory output": response(
        Tensor("y", DataType.INT32, (2, 3), GRID, shm=SharedMemoryRef("r", 24))
    ),
    "shape that does not hold the data": response(Tensor("y", DataType.INT32, (2, 2), GRID)),
}


def encoded(response: InferResponse) -> Any:
    try:
        return codec.encode_infer_response(response).SerializeToString()
    except ServerError as error:
        return ("error", error.code, error.message)


@pytest.mark.parametrize("case", list(RESPONSES))
def test_response_encodes_as_the_general_path_encodes_it(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = encoded(RESPONSES[case])
    monkeypatch.setattr(codec, "_encode_plain", lambda _: None)
    assert got == encoded(RESPONSES[case])
