"""Property tests: whatever a client sends, the wire codecs answer with a request or a
ServerError, never another exception (which a front end would turn into a 500).

In process, no server: random bytes, random JSON and near-valid documents go into the HTTP
JSON and binary codec, the control-plane body models, compression, the gRPC codec and the
shared-memory parameters and regions. The hypothesis profile (conftest.py) bounds the run.
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.server.control.logsettings import LogControl
from ge_serve.server.control.sharedmemory import SharedMemoryManager, lift_output_ref, parse_ref
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.grpc import codec as grpc_codec
from ge_serve.server.http import codec as http_codec
from ge_serve.server.http.bodies import (
    RepositoryIndexRequest,
    RepositoryLoadRequest,
    RepositoryUnloadRequest,
    SystemSharedMemoryRegisterRequest,
    decode_body,
)
from ge_serve.server.http.compression import choose_encoding, decode_content, encode_content
from ge_serve.server.inference.error_texts import InputRef
from ge_serve.server.inference.types import DataType, InferRequest, RequestedOutput, check_shape
from ge_serve.server.inference.wire import deserialize_bytes_tensor, raw_to_array

T = TypeVar("T")


def outcome(call: Callable[[], T]) -> T | ServerError:
    """The call's result, or the ServerError it raised; any other exception fails the test."""
    try:
        return call()
    except ServerError as exc:
        assert exc.message, "a ServerError must say what is wrong"
        return exc


# --- strategies -------------------------------------------------------------------------------

DATATYPES = [d.value for d in DataType]
# JSON scalars as orjson writes and reads them: 64-bit integers, finite doubles.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
# Shapes a tensor can have, and ones that overflow any element count (with a zero
# dimension the count is still 0, which the codecs must not take for "small").
dims = st.lists(st.integers(0, 6), max_size=4)
huge_dims = st.lists(
    st.sampled_from([0, 1, 2**31, 2**32, 2**62, 2**63 - 1]) | st.integers(-3, 4096), max_size=4
)
shapes = dims | huge_dims | json_values
PARAMETER_KEYS = [
    "binary_data_size",
    "binary_data",
    "binary_data_output",
    "classification",
    "shared_memory_region",
    "shared_memory_offset",
    "shared_memory_byte_size",
    "priority",
    "timeout",
    "triton_enable_empty_final_response",
    "sequence_id",
]
parameters = st.dictionaries(
    st.sampled_from(PARAMETER_KEYS) | st.text(max_size=6), scalars | json_values, max_size=4
)


@st.composite
def json_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """An input spec that is often nearly right: its data often has the shape's count."""
    shape = draw(dims)
    datatype = draw(st.sampled_from(DATATYPES) | st.text(max_size=5))
    count = math.prod(shape)
    element = draw(
        st.sampled_from(
            [st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=4)]
        )
    )
    data = draw(
        st.lists(element, min_size=count, max_size=count)
        | st.lists(scalars, max_size=8)
        | st.lists(st.lists(element, max_size=3), max_size=3)
        | json_values
    )
    spec: dict[str, Any] = {
        "name": draw(st.sampled_from(["x", "y", ""]) | json_values),
        "shape": draw(st.just(shape) | shapes),
        "datatype": datatype,
    }
    if draw(st.booleans()):
        spec["data"] = data
    if draw(st.booleans()):
        spec["parameters"] = draw(parameters)
    return spec


@st.composite
def infer_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {"inputs": draw(st.lists(json_inputs(), max_size=3) | json_values)}
    if draw(st.booleans()):
        doc["id"] = draw(st.text(max_size=8) | json_values)
    if draw(st.booleans()):
        names = st.sampled_from(["x", "y", ""]) | json_values
        output = st.fixed_dictionaries({"name": names}, optional={"parameters": parameters})
        doc["outputs"] = draw(st.lists(output | json_values, max_size=3) | json_values)
    if draw(st.booleans()):
        doc["parameters"] = draw(parameters | json_values)
    return doc


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)


# --- HTTP: JSON and the binary tensor data extension ---------------------------------------------


def decode_http(body: bytes, header_length: int | None) -> InferRequest | ServerError:
    result = outcome(lambda: http_codec.decode_infer_request("m", "1", body, header_length))
    if isinstance(result, ServerError):
        assert result.code is ErrorCode.INVALID_ARG
    else:
        for tensor in result.inputs:
            assert tensor.data.size in (0, math.prod(tensor.shape))
    return result


DEEP_DATA = (
    b'{"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": '
    + b"[" * 1000
    + b"1"
    + b"]" * 1000
    + b"}]}"
)


@given(body=st.binary(max_size=256), header_length=st.none() | st.integers(-4, 300))
@example(body=DEEP_DATA, header_length=None)  # deeper than Python's recursion limit
def test_http_infer_random_bytes(body: bytes, header_length: int | None) -> None:
    decode_http(body, header_length)


@given(doc=json_values)
def test_http_infer_any_json(doc: Any) -> None:
    decode_http(dumps(doc), None)


@given(doc=infer_documents(), tail=st.binary(max_size=64), binary=st.booleans())
@example(
    doc={
        "inputs": [
            {"name": "x", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": 6}}
        ]
    },
    tail=b"\x01\0\0\0a\x00",
    binary=True,
)
def test_http_infer_near_valid(doc: dict[str, Any], tail: bytes, binary: bool) -> None:
    header = dumps(doc)
    if binary:
        decode_http(header + tail, len(header))
    else:
        decode_http(header, None)


@given(doc=infer_documents(), cut=st.integers(0, 400))
def test_http_infer_cut_header(doc: dict[str, Any], cut: int) -> None:
    """A header length that does not end where the JSON does."""
    body = dumps(doc) + b"\0" * 8
    decode_http(body, min(cut, len(body)))


@given(value=st.none() | st.text(max_size=24))
def test_http_header_length(value: str | None) -> None:
    result = outcome(lambda: http_codec.parse_header_length(value))
    assert result is None or isinstance(result, int | ServerError)


# --- HTTP: control-plane bodies ---------------------------------------------------------------

BODY_MODELS = [
    (RepositoryIndexRequest, "repository index request"),
    (RepositoryLoadRequest, "load request"),
    (RepositoryUnloadRequest, "unload request"),
    (SystemSharedMemoryRegisterRequest, "shared memory register request"),
]
control_documents = st.fixed_dictionaries(
    {},
    optional={
        "ready": scalars,
        "key": scalars,
        "offset": scalars,
        "byte_size": scalars,
        "parameters": st.dictionaries(
            st.sampled_from(["config", "unload_dependents", "file:1/model.onnx", "file:", "x"]),
            scalars | st.text(alphabet="QUJDRA=%", max_size=8),
            max_size=3,
        )
        | json_values,
    },
)


@pytest.mark.parametrize(("model", "what"), BODY_MODELS, ids=lambda v: getattr(v, "__name__", v))
@given(body=st.binary(max_size=64) | control_documents.map(dumps) | json_values.map(dumps))
def test_control_plane_bodies(model: Any, what: str, body: bytes) -> None:
    result = outcome(lambda: decode_body(model, body, what, optional=True))
    assert isinstance(result, model | ServerError)
    if isinstance(result, ServerError):
        assert result.code is ErrorCode.INVALID_ARG


@given(
    changes=st.dictionaries(
        st.sampled_from(["log_info", "log_verbose_level", "log_format", "log_file", "log_colour"]),
        scalars,
        max_size=3,
    )
)
def test_log_settings_updates(changes: dict[str, Any]) -> None:
    control = LogControl()
    before = control.settings()
    result = outcome(lambda: control.update(changes))
    if isinstance(result, ServerError):
        assert control.settings() == before, "a refused update changes nothing"
    else:
        assert result == {**before, **changes}


# --- compression ----------------------------------------------------------------------------

ENCODINGS = ["gzip", "x-gzip", "deflate", "identity", "", " GZip ", "br", "gzip, deflate"]


def compressed(data: bytes, kind: int) -> bytes:
    if kind == 0:
        return encode_content(data, "gzip")
    if kind == 1:
        return encode_content(data, "deflate")
    raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return raw.compress(data) + raw.flush()


@given(
    data=st.binary(max_size=512),
    kind=st.integers(0, 2),
    damage=st.none() | st.tuples(st.integers(0, 600), st.integers(0, 255)),
    cut=st.none() | st.integers(0, 600),
    encoding=st.none() | st.sampled_from(ENCODINGS) | st.text(max_size=8),
    max_size=st.integers(0, 1024),
)
def test_decompression(
    data: bytes,
    kind: int,
    damage: tuple[int, int] | None,
    cut: int | None,
    encoding: str | None,
    max_size: int,
) -> None:
    body = bytearray(compressed(data, kind))
    if damage is not None and body:
        body[damage[0] % len(body)] ^= damage[1] or 1
    if cut is not None:
        del body[cut:]
    result = outcome(lambda: decode_content(bytes(body), encoding, max_size))
    if isinstance(result, bytes):
        assert len(result) <= max_size


@given(data=st.binary(max_size=512), kind=st.integers(0, 2), spare=st.integers(0, 64))
def test_decompression_round_trip(data: bytes, kind: int, spare: int) -> None:
    encoding = ["gzip", "deflate", "deflate"][kind]
    assert decode_content(compressed(data, kind), encoding, len(data) + spare) == data


@given(data=st.binary(min_size=1, max_size=512), kind=st.integers(0, 2))
def test_decompression_over_the_cap(data: bytes, kind: int) -> None:
    encoding = ["gzip", "deflate", "deflate"][kind]
    result = outcome(lambda: decode_content(compressed(data, kind), encoding, len(data) - 1))
    assert isinstance(result, ServerError) and "exceeds the maximum" in result.message


@given(
    value=st.text(max_size=40)
    | st.sampled_from(["gzip;q=0.5, deflate;q=0.7", "*;q=0", "identity;q=1, gzip;q=0.9"])
)
def test_accept_encoding(value: str) -> None:
    assert choose_encoding(value) in (None, "gzip", "deflate")


# --- gRPC -----------------------------------------------------------------------------------

parameter_values = st.one_of(
    st.builds(lambda v: pb.InferParameter(bool_param=v), st.booleans()),
    st.builds(lambda v: pb.InferParameter(int64_param=v), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: pb.InferParameter(uint64_param=v), st.integers(0, 2**64 - 1)),
    st.builds(lambda v: pb.InferParameter(double_param=v), st.floats()),
    st.builds(lambda v: pb.InferParameter(string_param=v), st.text(max_size=8)),
    st.just(pb.InferParameter()),
)
grpc_parameters = st.dictionaries(
    st.sampled_from(PARAMETER_KEYS) | st.text(max_size=6), parameter_values, max_size=4
)
CONTENT_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "bool_contents": st.booleans(),
    "int_contents": st.integers(-(2**31), 2**31 - 1),
    "int64_contents": st.integers(-(2**63), 2**63 - 1),
    "uint_contents": st.integers(0, 2**32 - 1),
    "uint64_contents": st.integers(0, 2**64 - 1),
    "fp32_contents": st.floats(width=32),
    "fp64_contents": st.floats(),
    "bytes_contents": st.binary(max_size=6),
}
contents = st.dictionaries(
    st.sampled_from(sorted(CONTENT_FIELDS)), st.just(None), max_size=2
).flatmap(
    lambda chosen: st.fixed_dictionaries(
        {name: st.lists(CONTENT_FIELDS[name], max_size=8) for name in chosen}
    )
)


@st.composite
def grpc_inputs(draw: st.DrawFn) -> pb.ModelInferRequest.InferInputTensor:
    tensor = pb.ModelInferRequest.InferInputTensor(
        name=draw(st.sampled_from(["x", "y", ""])),
        datatype=draw(st.sampled_from(DATATYPES) | st.text(max_size=4)),
        shape=draw(dims | huge_dims),
    )
    for key, value in draw(grpc_parameters).items():
        tensor.parameters[key].CopyFrom(value)
    if draw(st.booleans()):
        tensor.contents.SetInParent()
        for name, values in draw(contents).items():
            getattr(tensor.contents, name).extend(values)
    return tensor


@st.composite
def grpc_requests(draw: st.DrawFn) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(
        model_name=draw(st.text(max_size=6)),
        model_version=draw(st.text(max_size=3)),
        id=draw(st.text(max_size=6)),
        inputs=draw(st.lists(grpc_inputs(), max_size=3)),
        raw_input_contents=draw(st.lists(st.binary(max_size=48), max_size=3)),
    )
    for key, value in draw(grpc_parameters).items():
        message.parameters[key].CopyFrom(value)
    for _ in range(draw(st.integers(0, 2))):
        output = message.outputs.add(name=draw(st.sampled_from(["x", "y", ""])))
        for key, value in draw(grpc_parameters).items():
            output.parameters[key].CopyFrom(value)
    return message


def decode_grpc(message: pb.ModelInferRequest) -> None:
    result = outcome(lambda: grpc_codec.decode_infer_request(message))
    if isinstance(result, ServerError):
        assert result.code is ErrorCode.INVALID_ARG
    else:
        for tensor in result.request.inputs:
            assert tensor.data.size in (0, math.prod(tensor.shape))


@given(message=grpc_requests())
def test_grpc_infer_requests(message: pb.ModelInferRequest) -> None:
    decode_grpc(message)


@given(data=st.binary(max_size=256))
def test_grpc_infer_random_bytes(data: bytes) -> None:
    """What grpc.aio hands the servicer, when the bytes happen to parse."""
    try:
        message = pb.ModelInferRequest.FromString(data)
    except Exception:  # protobuf's DecodeError: grpc answers it before our code runs
        return
    decode_grpc(message)


# --- tensor wire layout -------------------------------------------------------------------------


def holdable(shape: list[int]) -> bool:
    """What the codecs pass on: the wire layout and shared-memory helpers below are only
    given shapes that `check_shape` accepted."""
    return not isinstance(outcome(lambda: check_shape(shape, "x")), ServerError)


@given(
    datatype=st.sampled_from(list(DataType)),
    shape=dims | huge_dims,
    data=st.binary(max_size=96),
)
def test_raw_tensors(datatype: DataType, shape: list[int], data: bytes) -> None:
    assume(holdable(shape))
    result = outcome(lambda: raw_to_array(datatype, tuple(shape), data, InputRef("x", "m")))
    if not isinstance(result, ServerError):
        assert result.shape == tuple(shape)


@given(data=st.binary(max_size=96), count=st.none() | st.integers(0, 8))
def test_bytes_tensors(data: bytes, count: int | None) -> None:
    outcome(lambda: deserialize_bytes_tensor(data, count))


# --- shared memory --------------------------------------------------------------------------


@given(params=parameters)
def test_shared_memory_parameters(params: dict[str, Any]) -> None:
    outcome(lambda: parse_ref(dict(params), "x"))
    output = RequestedOutput("y", classification=1, parameters=dict(params))
    outcome(lambda: lift_output_ref(output))


@pytest.fixture(scope="module")
def shm_root() -> Iterator[Path]:
    """A stand-in for /dev/shm holding one 4 KiB object, "/obj", and a folder."""
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "obj").write_bytes(bytes(range(256)) * 16)
        (root / "dir").mkdir()
        yield root


keys = st.sampled_from(["/obj", "obj", "/dir", "/missing", "/", "", "/../obj", "/a/b"]) | st.text(
    max_size=6
)
counts = st.integers(-2, 5000) | st.sampled_from([2**31, 2**63 - 1])


@given(
    key=keys,
    offset=counts,
    byte_size=counts,
    ref_offset=counts,
    ref_size=counts,
    datatype=st.sampled_from(list(DataType)),
    shape=dims | huge_dims,
)
def test_shared_memory_regions(
    shm_root: Path,
    key: str,
    offset: int,
    byte_size: int,
    ref_offset: int,
    ref_size: int,
    datatype: DataType,
    shape: list[int],
) -> None:
    assume(holdable(shape))
    manager = SharedMemoryManager(root=shm_root)
    try:
        outcome(lambda: asyncio.run(manager.register("r", key, offset, byte_size)))
        params: dict[str, Any] = {
            "shared_memory_region": "r",
            "shared_memory_offset": ref_offset,
            "shared_memory_byte_size": ref_size,
        }
        ref = outcome(lambda: parse_ref(params, "x"))
        if ref is None or isinstance(ref, ServerError):
            return
        outcome(lambda: manager.input_array(ref, datatype, tuple(shape), "x", "m"))
    finally:
        manager.close()
