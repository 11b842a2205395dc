"""The least a Python KServe-v2 server on ge-serve's stack can do for `simple`: the ceiling
the `ceiling` suite holds ge-serve against.

One process, one uvloop event loop, as ge-serve: uvicorn (httptools) with a raw ASGI
application, and a grpc.aio server that takes ModelInfer calls as ge-serve does
(server/grpc/call_intake.py). Each request is parsed, its two INT32 [1,16] inputs
are added and subtracted with numpy, and the answer is encoded, as the protocol requires
(JSON, binary tensor extension, protobuf). Nothing else: no validation, no scheduler, no
statistics, no errors worth the name. It answers the metadata and config calls that
perf_analyzer makes first, and counts the inferences it answered (GET
/v2/models/simple/stats, in Triton's shape, for the `cpu-per-request` suite). Not a
server to use: a measuring stick.

    python -m bench.lib.bare HTTP_PORT GRPC_PORT
"""

from __future__ import annotations

import sys
from typing import Any

import grpc
import numpy as np
import orjson
import uvicorn
import uvloop

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc
from ge_serve.server.grpc.call_intake import CallIntake
from ge_serve.server.grpc.servicer import INFERENCE_SERVICE

MODEL = "simple"
_NAMES = ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
_TENSORS = [{"name": name, "datatype": "INT32", "shape": [-1, 16]} for name in _NAMES]
_META = orjson.dumps({
    "name": MODEL, "versions": ["1"], "platform": "onnxruntime_onnx",
    "inputs": _TENSORS[:2], "outputs": _TENSORS[2:],
})  # fmt: skip
_CONFIG = orjson.dumps({
    "name": MODEL, "platform": "onnxruntime_onnx", "max_batch_size": 8,
    "input": [{"name": t["name"], "data_type": "TYPE_INT32", "dims": [16]} for t in _TENSORS[:2]],
    "output": [{"name": t["name"], "data_type": "TYPE_INT32", "dims": [16]} for t in _TENSORS[2:]],
})  # fmt: skip
_SERVER = orjson.dumps({"name": "bare", "version": "0", "extensions": []})
_JSON = (b"content-type", b"application/json")
HEADER_LENGTH = b"inference-header-content-length"
# Inferences answered, on every protocol (the loop is single-threaded).
_answered = [0]


def _stats() -> bytes:
    success = {"count": _answered[0], "ns": 0}
    model = {"name": MODEL, "version": "1", "inference_stats": {"success": success}}
    return orjson.dumps({"model_stats": [model]})


def _compute(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> tuple[Any, Any]:
    _answered[0] += 1
    return a + b, a - b


def _http_infer(body: bytes, header_length: int | None) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    if header_length is None:  # plain JSON
        doc = orjson.loads(body)
        a, b = (np.asarray(t["data"], dtype=np.int32) for t in doc["inputs"])
        out0, out1 = _compute(a, b)
        answer = {"model_name": MODEL, "model_version": "1", "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16], "data": out0.tolist()},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [1, 16], "data": out1.tolist()},
        ]}  # fmt: skip
        return orjson.dumps(answer), [_JSON]
    orjson.loads(body[:header_length])
    a = np.frombuffer(body, dtype=np.int32, count=16, offset=header_length)
    b = np.frombuffer(body, dtype=np.int32, count=16, offset=header_length + 64)
    out0, out1 = _compute(a, b)
    header = orjson.dumps({"model_name": MODEL, "model_version": "1", "outputs": [
        {"name": name, "datatype": "INT32", "shape": [1, 16],
         "parameters": {"binary_data_size": 64}} for name in ("OUTPUT0", "OUTPUT1")
    ]})  # fmt: skip
    headers = [(b"content-type", b"application/octet-stream"),
               (HEADER_LENGTH, str(len(header)).encode())]  # fmt: skip
    return header + out0.tobytes() + out1.tobytes(), headers


async def http_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    path: str = scope["path"]
    headers: list[tuple[bytes, bytes]] = [_JSON]
    if scope["method"] == "POST":
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        length = next((int(v) for k, v in scope["headers"] if k == HEADER_LENGTH), None)
        payload, headers = _http_infer(b"".join(chunks), length)
    elif path == "/v2":
        payload = _SERVER
    elif path.endswith("/stats"):
        payload = _stats()
    elif path.endswith("/config"):
        payload = _CONFIG
    elif path.startswith("/v2/models/") and not path.endswith("/ready"):
        payload = _META
    else:
        payload, headers = b"", []
    headers.append((b"content-length", str(len(payload)).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _output(name: str) -> pb.ModelInferResponse.InferOutputTensor:
    return pb.ModelInferResponse.InferOutputTensor(name=name, datatype="INT32", shape=[1, 16])


class BareServicer(pb_grpc.GRPCInferenceServiceServicer):
    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="bare", version="0")

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=True)

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        tensors = [
            pb.ModelMetadataResponse.TensorMetadata(name=name, datatype="INT32", shape=[-1, 16])
            for name in _NAMES
        ]
        return pb.ModelMetadataResponse(
            name=MODEL, versions=["1"], platform="onnxruntime_onnx",
            inputs=tensors[:2], outputs=tensors[2:],
        )  # fmt: skip

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        response = pb.ModelConfigResponse()
        config = response.config
        config.name, config.platform, config.max_batch_size = MODEL, "onnxruntime_onnx", 8
        for name in _NAMES[:2]:
            config.input.add(name=name, data_type=8, dims=[16])  # TYPE_INT32
        for name in _NAMES[2:]:
            config.output.add(name=name, data_type=8, dims=[16])
        return response

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        raw = request.raw_input_contents
        out0, out1 = _compute(np.frombuffer(raw[0], np.int32), np.frombuffer(raw[1], np.int32))
        return pb.ModelInferResponse(
            model_name=MODEL, model_version="1", id=request.id,
            outputs=[_output("OUTPUT0"), _output("OUTPUT1")],
            raw_output_contents=[out0.tobytes(), out1.tobytes()],
        )  # fmt: skip


async def serve(http_port: int, grpc_port: int) -> None:
    server = grpc.aio.server()
    servicer = BareServicer()
    # The generated code registers every method; the intake only takes ModelInfer's calls.
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    infer = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer,
        request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelInferResponse.SerializeToString,
    )
    intake = CallIntake(server, INFERENCE_SERVICE, "ModelInfer", infer)
    intake.registered_elsewhere()
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await server.start()
    intake.attach()
    config = uvicorn.Config(
        http_app, host="127.0.0.1", port=http_port, loop="none", http="httptools",
        lifespan="off", access_log=False, log_level="warning",
    )  # fmt: skip
    await uvicorn.Server(config).serve()
    await server.stop(0)
    await intake.close()


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2])))
