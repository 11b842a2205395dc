"""Each front end's encoding of the core's records, pinned to the exact bytes on the wire:
HTTP JSON key order and number types, and the protobuf each gRPC answer serializes to."""

from __future__ import annotations

from google.protobuf import json_format

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.server.grpc import encode as grpc_encode
from ge_serve.server.http import encode as http_encode
from ge_serve.server.http.codec import encode_json
from ge_serve.server.inference.reports import (
    BatchStatistics,
    InferStatistics,
    MemoryUsage,
    ModelMetadata,
    ModelState,
    ModelStatistics,
    RepositoryEntry,
    ServerMetadata,
    StatisticDuration,
    TensorMetadata,
)
from ge_serve.server.inference.types import DataType

SERVER = ServerMetadata("triton", "2.51.0", ("classification", "statistics"))

MODEL = ModelMetadata(
    name="simple_string",
    versions=(1, 3),
    platform="onnxruntime_onnx",
    inputs=(TensorMetadata("INPUT0", DataType.BYTES, (-1, 16)),),
    outputs=(TensorMetadata("OUTPUT0", DataType.FP32, (2, 9007199254740993)),),
)


def _took(count: int, ns: int) -> StatisticDuration:
    return StatisticDuration(count, ns)


BUSY = ModelStatistics(
    name="simple",
    version=1,
    last_inference=1700000000123,
    inference_count=17,
    execution_count=8,
    inference_stats=InferStatistics(
        success=_took(8, 9000),
        fail=_took(2, 50),
        queue=_took(8, 700),
        compute_input=_took(8, 100),
        compute_infer=_took(8, 6000),
        compute_output=_took(8, 200),
    ),
    batch_stats=(
        BatchStatistics(1, _took(5, 10), _took(5, 20), _took(5, 30)),
        BatchStatistics(4, _took(3, 40), _took(3, 50), _took(3, 60)),
    ),
)
IDLE = ModelStatistics(
    name="idle",
    version=2,
    last_inference=0,
    inference_count=0,
    execution_count=0,
    inference_stats=InferStatistics(*[StatisticDuration()] * 6),
    memory_usage=(MemoryUsage("CPU", 0, 4096),),
)

INDEX = [
    RepositoryEntry("a_model"),
    RepositoryEntry("broken", None, ModelState.UNAVAILABLE, "failed to parse ONNX file"),
    RepositoryEntry("simple", 1, ModelState.READY),
    RepositoryEntry("simple", 2, ModelState.UNLOADING, "unloaded"),
]


# --- HTTP -------------------------------------------------------------------------------


def test_http_server_metadata() -> None:
    assert encode_json(http_encode.server_metadata(SERVER)) == (
        b'{"name":"triton","version":"2.51.0","extensions":["classification","statistics"]}'
    )


def test_http_model_metadata() -> None:
    assert encode_json(http_encode.model_metadata(MODEL)) == (
        b'{"name":"simple_string","versions":["1","3"],"platform":"onnxruntime_onnx",'
        b'"inputs":[{"name":"INPUT0","datatype":"BYTES","shape":[-1,16]}],'
        b'"outputs":[{"name":"OUTPUT0","datatype":"FP32","shape":[2,9007199254740993]}]}'
    )


def _durations(*pairs: tuple[str, int, int]) -> bytes:
    return b",".join(b'"%s":{"count":%d,"ns":%d}' % (k.encode(), c, n) for k, c, n in pairs)


def test_http_statistics() -> None:
    zero = [(key, 0, 0) for key in ("success", "fail", "queue")]
    zero += [(key, 0, 0) for key in ("compute_input", "compute_infer", "compute_output")]
    never = [("cache_hit", 0, 0), ("cache_miss", 0, 0)]
    busy = [("success", 8, 9000), ("fail", 2, 50), ("queue", 8, 700)]
    busy += [("compute_input", 8, 100), ("compute_infer", 8, 6000), ("compute_output", 8, 200)]
    assert encode_json(http_encode.statistics([BUSY, IDLE])) == (
        b'{"model_stats":['
        b'{"name":"simple","version":"1","last_inference":1700000000123,'
        b'"inference_count":17,"execution_count":8,'
        b'"inference_stats":{' + _durations(*busy, *never) + b"},"
        b'"response_stats":{},'
        b'"batch_stats":['
        b'{"batch_size":1,'
        + _durations(("compute_input", 5, 10), ("compute_infer", 5, 20), ("compute_output", 5, 30))
        + b'},{"batch_size":4,'
        + _durations(("compute_input", 3, 40), ("compute_infer", 3, 50), ("compute_output", 3, 60))
        + b"}],"
        b'"memory_usage":[]},'
        b'{"name":"idle","version":"2","last_inference":0,'
        b'"inference_count":0,"execution_count":0,'
        b'"inference_stats":{' + _durations(*zero, *never) + b"},"
        b'"response_stats":{},"batch_stats":[],'
        b'"memory_usage":[{"type":"CPU","id":0,"byte_size":4096}]}'
        b"]}"
    )
    assert encode_json(http_encode.statistics(())) == b'{"model_stats":[]}'


def test_http_repository_index_leaves_out_what_a_row_lacks() -> None:
    # As Triton's TRITONSERVER_ServerModelIndex: a never-loaded model is its name alone.
    assert encode_json(http_encode.repository_index(INDEX)) == (
        b'[{"name":"a_model"},'
        b'{"name":"broken","state":"UNAVAILABLE",'
        b'"reason":"failed to parse ONNX file"},'
        b'{"name":"simple","version":"1","state":"READY"},'
        b'{"name":"simple","version":"2","state":"UNLOADING","reason":"unloaded"}]'
    )


# --- gRPC -------------------------------------------------------------------------------


def test_grpc_server_metadata() -> None:
    assert grpc_encode.server_metadata(SERVER) == pb.ServerMetadataResponse(
        name="triton", version="2.51.0", extensions=["classification", "statistics"]
    )


def test_grpc_model_metadata() -> None:
    tensor = pb.ModelMetadataResponse.TensorMetadata
    assert grpc_encode.model_metadata(MODEL) == pb.ModelMetadataResponse(
        name="simple_string",
        versions=["1", "3"],
        platform="onnxruntime_onnx",
        inputs=[tensor(name="INPUT0", datatype="BYTES", shape=[-1, 16])],
        outputs=[tensor(name="OUTPUT0", datatype="FP32", shape=[2, 9007199254740993])],
    )


def test_grpc_statistics_are_the_http_document_as_protobuf() -> None:
    """The gRPC answer serializes to the same bytes as the HTTP document parsed into
    ModelStatisticsResponse; every sub-message is present, even with zero counts."""
    message = grpc_encode.statistics([BUSY, IDLE])
    parsed = json_format.ParseDict(
        http_encode.statistics([BUSY, IDLE]), pb.ModelStatisticsResponse()
    )
    assert message.SerializeToString(deterministic=True) == parsed.SerializeToString(
        deterministic=True
    )
    busy, idle = message.model_stats
    assert (busy.name, busy.version, busy.last_inference) == ("simple", "1", 1700000000123)
    assert (busy.inference_count, busy.execution_count) == (17, 8)
    assert busy.inference_stats.compute_infer == pb.StatisticDuration(count=8, ns=6000)
    assert [(b.batch_size, b.compute_output.ns) for b in busy.batch_stats] == [(1, 30), (4, 60)]
    assert idle.HasField("inference_stats")
    for field in ("success", "fail", "queue", "cache_hit", "cache_miss"):
        assert idle.inference_stats.HasField(field), field
    assert list(idle.memory_usage) == [pb.MemoryUsage(type="CPU", id=0, byte_size=4096)]
    assert not busy.response_stats


def test_grpc_repository_index() -> None:
    row = pb.RepositoryIndexResponse.ModelIndex
    assert grpc_encode.repository_index(INDEX) == pb.RepositoryIndexResponse(
        models=[
            row(name="a_model"),
            row(name="broken", state="UNAVAILABLE", reason="failed to parse ONNX file"),
            row(name="simple", version="1", state="READY"),
            row(name="simple", version="2", state="UNLOADING", reason="unloaded"),
        ]
    )
