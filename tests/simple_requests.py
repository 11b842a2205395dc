"""Valid requests to examples/models/simple, built raw for each protocol, and the checks of
their answers: the bad-input tests send one after each bad request."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import numpy as np
import pytest

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc

A = list(range(16))
B = [3] * 16
Tensors = pb.ModelInferRequest.InferInputTensor
# Fragment of the message for a shape no tensor can hold (Triton's wording).
OVERFLOW = "causes total element count to exceed maximum size of"


def json_input(name: str, shape: list[int], data: Any = None, **params: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "shape": shape, "datatype": "INT32"}
    if data is not None:
        spec["data"] = data
    if params:
        spec["parameters"] = params
    return spec


def valid_body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [json_input("INPUT0", [1, 16], A), json_input("INPUT1", [1, 16], B)]
    }
    body.update(changes)
    return body


def assert_http_serves(http: httpx.Client) -> None:
    response = http.post("/v2/models/simple/infer", json=valid_body())
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs["OUTPUT0"] == [a + b for a, b in zip(A, B, strict=True)]
    assert outputs["OUTPUT1"] == [a - b for a, b in zip(A, B, strict=True)]


def valid_message(request_id: str = "") -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name="simple",
        id=request_id,
        inputs=[
            Tensors(name=name, datatype="INT32", shape=[1, 16]) for name in ("INPUT0", "INPUT1")
        ],
        raw_input_contents=[
            np.array(A, dtype=np.int32).tobytes(),
            np.array(B, dtype=np.int32).tobytes(),
        ],
    )


def assert_sum(response: pb.ModelInferResponse) -> None:
    names = [o.name for o in response.outputs]
    total = np.frombuffer(response.raw_output_contents[names.index("OUTPUT0")], dtype=np.int32)
    np.testing.assert_array_equal(total, np.array(A) + np.array(B))


def assert_grpc_serves(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    assert_sum(stub.ModelInfer(valid_message()))


def expect_http(response: httpx.Response, status: int, *fragments: str) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert isinstance(message, str)
    for fragment in fragments:
        assert fragment in message, message
    return message


def expect_grpc(call: Any, request: Any, code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call(request)
    error: Any = caught.value
    assert error.code() == code, error.details()
    details = str(error.details())
    for fragment in fragments:
        assert fragment in details, details
    return details
