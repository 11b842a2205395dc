"""The gRPC codec on its own: ModelInferRequest/Response to and from the core's types, with
requests built by tritonclient.grpc itself where it can build them."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as triton_grpc
from samples import SAMPLES
from tritonclient.grpc._infer_result import InferResult
from tritonclient.grpc._utils import _get_inference_request

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.grpc import codec
from ge_serve.server.inference.types import DataType, InferResponse, SharedMemoryRef, Tensor


def ours(message: Any) -> pb.ModelInferRequest:
    """tritonclient's message, re-read as our generated type (same wire format)."""
    return pb.ModelInferRequest.FromString(message.SerializeToString())


def tritonclient_request(
    arrays: dict[str, npt.NDArray[Any]], *, outputs: Any = None, **kwargs: Any
) -> pb.ModelInferRequest:
    inputs = []
    for name, array in arrays.items():
        datatype = DataType.from_numpy(array.dtype).value
        tensor = triton_grpc.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    options: dict[str, Any] = {
        "model_version": "",
        "request_id": "",
        "sequence_id": 0,
        "sequence_start": False,
        "sequence_end": False,
        "priority": 0,
        "timeout": None,
        "parameters": None,
    }
    options.update(kwargs)
    return ours(_get_inference_request("m", inputs, outputs=outputs, **options))


def expect_invalid(message: pb.ModelInferRequest, text: str) -> ServerError:
    with pytest.raises(ServerError) as info:
        codec.decode_infer_request(message)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert text in info.value.message, info.value.message
    return info.value


# --- requests -------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(SAMPLES), ids=lambda d: d.value)
def test_raw_contents_from_tritonclient(datatype: DataType) -> None:
    array = SAMPLES[datatype]
    decoded = codec.decode_infer_request(tritonclient_request({"x": array}))
    (tensor,) = decoded.request.inputs
    assert tensor.name == "x"
    assert tensor.datatype is datatype
    assert tensor.shape == (2, 3)
    assert tensor.data.shape == (2, 3)
    if datatype is DataType.BYTES:
        assert tensor.data.tolist() == array.tolist()
    else:
        assert tensor.data.dtype == datatype.numpy
        np.testing.assert_array_equal(tensor.data, array)
        # A view into the message's bytes: no copy, and read-only.
        assert not tensor.data.flags.writeable
        assert tensor.data.base is not None


def test_request_metadata_and_parameters() -> None:
    message = tritonclient_request(
        {"x": SAMPLES[DataType.INT32]},
        outputs=[triton_grpc.InferRequestedOutput("y", class_count=3)],
        model_version="2",
        request_id="abc",
        priority=3,
        timeout=1500,
        sequence_id=9,
        sequence_start=True,
        parameters={"s": "text", "b": True, "i": -4, "f": 0.25},
    )
    request = codec.decode_infer_request(message).request
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "abc")
    assert (request.priority, request.timeout_us) == (3, 1500)
    assert request.parameters == {
        "s": "text",
        "b": True,
        "i": -4,
        "f": 0.25,
        "sequence_id": 9,
        "sequence_start": True,
        "sequence_end": False,
    }
    assert [(o.name, o.classification) for o in request.outputs] == [("y", 3)]


def test_stream_flag_is_lifted_and_other_reserved_keys_refused() -> None:
    message = tritonclient_request({"x": SAMPLES[DataType.INT32]})
    message.parameters[codec.ENABLE_EMPTY_FINAL_RESPONSE].bool_param = True
    decoded = codec.decode_infer_request(message)
    assert decoded.enable_empty_final_response
    assert codec.ENABLE_EMPTY_FINAL_RESPONSE not in decoded.request.parameters
    message.parameters["triton_other"].bool_param = True
    expect_invalid(message, "reserved")


def test_a_negative_int64_sequence_id_is_the_uint64_triton_casts_it_to() -> None:
    # tritonclient sends every integer ID as an int64_param: an ID of 2**63 or more
    # travels as a negative one.
    for sent, read in ((-1, 2**64 - 1), (-(2**63), 2**63), (5, 5)):
        message = tritonclient_request({"x": SAMPLES[DataType.INT32]}, sequence_id=sent)
        assert codec.decode_infer_request(message).request.parameters["sequence_id"] == read
    message = tritonclient_request({"x": SAMPLES[DataType.INT32]}, sequence_id="s")
    assert codec.decode_infer_request(message).request.parameters["sequence_id"] == "s"


@pytest.mark.parametrize(
    ("key", "field", "value", "error"),
    [
        *(
            ("sequence_id", field, value, "invalid value type for 'sequence_id' parameter, "
             "expected int64_param or string_param.")
            for field, value in (("uint64_param", 5), ("bool_param", True), ("double_param", 3.0))
        ),
        ("sequence_start", "int64_param", 1,
         "invalid value type for 'sequence_start' parameter, expected bool_param."),
        ("sequence_end", "string_param", "true",
         "invalid value type for 'sequence_end' parameter, expected bool_param."),
        ("priority", "int64_param", -1, "invalid value for 'priority', expected value >= 0."),
        *(
            ("priority", field, value, "invalid value type for 'priority' parameter, "
             "expected int64_param or uint64_param.")
            for field, value in (("string_param", "high"), ("double_param", 1.5))
        ),
        ("timeout", "uint64_param", 5,
         "invalid value type for 'timeout' parameter, expected int64_param."),
        ("timeout", "string_param", "x",
         "invalid value type for 'timeout' parameter, expected int64_param."),
        ("timeout", "int64_param", -5, "invalid value for 'timeout', expected value >= 0."),
    ],
)  # fmt: skip
def test_parameters_triton_reads_itself_take_only_its_fields(
    key: str, field: str, value: Any, error: str
) -> None:
    message = tritonclient_request({"x": SAMPLES[DataType.INT32]})
    setattr(message.parameters[key], field, value)
    assert expect_invalid(message, error).message == error


def test_priority_and_timeout_from_their_fields() -> None:
    message = tritonclient_request({"x": SAMPLES[DataType.INT32]})
    message.parameters["priority"].uint64_param = 2**64 - 1
    message.parameters["timeout"].int64_param = 2**63 - 1
    request = codec.decode_infer_request(message).request
    assert (request.priority, request.timeout_us) == (2**64 - 1, 2**63 - 1)
    message.parameters["priority"].int64_param = 7
    assert codec.decode_infer_request(message).request.priority == 7


TYPED: dict[DataType, tuple[str, list[Any]]] = {
    DataType.BOOL: ("bool_contents", [True, False, True, False, False, True]),
    DataType.UINT8: ("uint_contents", [0, 1, 255, 7, 8, 9]),
    DataType.UINT16: ("uint_contents", [0, 1, 65535, 7, 8, 9]),
    DataType.UINT32: ("uint_contents", [0, 1, 2**32 - 1, 7, 8, 9]),
    DataType.UINT64: ("uint64_contents", [0, 1, 2**64 - 1, 7, 8, 9]),
    DataType.INT8: ("int_contents", [-128, 0, 127, 7, 8, 9]),
    DataType.INT16: ("int_contents", [-32768, 0, 32767, 7, 8, 9]),
    DataType.INT32: ("int_contents", [-(2**31), 0, 2**31 - 1, 7, 8, 9]),
    DataType.INT64: ("int64_contents", [-(2**63), 0, 2**63 - 1, 7, 8, 9]),
    DataType.FP32: ("fp32_contents", [0.5, -1.25, 3.0, 7, 8, 9]),
    DataType.FP64: ("fp64_contents", [0.5, -1.25, 1e300, 7, 8, 9]),
    DataType.BYTES: ("bytes_contents", [b"a", b"", b"\x00\xff", b"xyz", b"7", b"q" * 300]),
}


def typed_request(datatype: str, shape: list[int], field: str, values: list[Any]) -> Any:
    message = pb.ModelInferRequest(model_name="m")
    tensor = message.inputs.add(name="x", datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return message


@pytest.mark.parametrize("datatype", list(TYPED), ids=lambda d: d.value)
def test_typed_contents(datatype: DataType) -> None:
    field, values = TYPED[datatype]
    message = typed_request(datatype.value, [2, 3], field, values)
    (tensor,) = codec.decode_infer_request(message).request.inputs
    assert tensor.data.shape == (2, 3)
    assert tensor.data.reshape(-1).tolist() == values
    if datatype is not DataType.BYTES:
        assert tensor.data.dtype == datatype.numpy


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_typed_contents_refuse_raw_only_types(datatype: str) -> None:
    message = typed_request(datatype, [2], "fp32_contents", [1.0, 2.0])
    expect_invalid(message, "can only be sent in raw_input_contents")


def test_typed_contents_errors() -> None:
    expect_invalid(
        typed_request("INT32", [2, 3], "int_contents", [1, 2]),
        "input byte size mismatch for input 'x' for model 'm'. Expected 24, got 8",
    )
    expect_invalid(
        typed_request("INT32", [2], "fp32_contents", [1.0, 2.0]), "must be in contents.int_contents"
    )
    expect_invalid(typed_request("INT8", [2], "int_contents", [1, 300]), "out of range for INT8")
    expect_invalid(typed_request("UINT8", [1], "uint_contents", [256]), "out of range for UINT8")


def test_raw_contents_errors() -> None:
    base = tritonclient_request({"x": SAMPLES[DataType.INT32], "y": SAMPLES[DataType.INT32]})

    fewer = pb.ModelInferRequest()
    fewer.CopyFrom(base)
    del fewer.raw_input_contents[1]
    expect_invalid(fewer, "unable to find data for input tensor 'y' for model 'm' in request.")

    short = pb.ModelInferRequest()
    short.CopyFrom(base)
    short.raw_input_contents[0] = short.raw_input_contents[0][:-4]
    expect_invalid(
        short, "input byte size mismatch for input 'x' for model 'm'. Expected 24, got 20"
    )

    both = pb.ModelInferRequest()
    both.CopyFrom(base)
    both.inputs[0].contents.int_contents.extend([1] * 6)
    expect_invalid(both, "contents field must not be specified when using raw_input_contents")

    unknown = pb.ModelInferRequest()
    unknown.CopyFrom(base)
    unknown.inputs[1].datatype = "INT33"
    expect_invalid(unknown, "invalid datatype 'INT33'")

    bad_bytes = tritonclient_request({"x": SAMPLES[DataType.BYTES]})
    bad_bytes.raw_input_contents[0] = b"\x05\x00\x00\x00ab"
    expect_invalid(bad_bytes, "has length 5, which overruns the buffer")

    no_data = pb.ModelInferRequest(model_name="m")
    no_data.inputs.add(name="x", datatype="INT32", shape=[2])
    expect_invalid(no_data, "unable to find data for input tensor")

    negative = pb.ModelInferRequest(model_name="m")
    negative.inputs.add(name="x", datatype="INT32", shape=[-1])
    expect_invalid(negative, "non-negative")


def shm_request() -> pb.ModelInferRequest:
    """tritonclient's request with input `a` in shared memory, `b` raw, output `y` in shm."""
    a = triton_grpc.InferInput("a", [2], "INT32")
    a.set_shared_memory("in", 8, offset=4)
    b = triton_grpc.InferInput("b", [2], "INT32")
    b.set_data_from_numpy(np.array([5, 6], dtype=np.int32))
    y = triton_grpc.InferRequestedOutput("y")
    y.set_shared_memory("out", 8)
    return ours(_get_inference_request("m", [a, b], outputs=[y], model_version="",
                request_id="", sequence_id=0, sequence_start=False, sequence_end=False,
                priority=0, timeout=None, parameters=None))  # fmt: skip


def test_shared_memory_references_and_raw_contents_counted_as_triton_does() -> None:
    message = shm_request()
    # Only the input not in shared memory has raw contents.
    assert len(message.raw_input_contents) == 1
    request = codec.decode_infer_request(message).request
    a, b = request.inputs
    assert a.shm == SharedMemoryRef("in", 8, 4) and a.parameters == {}
    assert b.shm is None and b.data.tolist() == [5, 6]
    assert request.outputs[0].shm == SharedMemoryRef("out", 8)
    assert request.outputs[0].parameters == {}


def test_shared_memory_input_errors() -> None:
    message = shm_request()
    message.raw_input_contents.append(b"\0" * 8)
    expect_invalid(message, "unexpected additional input data for model 'm'")

    message = shm_request()
    message.inputs[0].contents.int_contents.extend([1, 2])
    expect_invalid(message, "unexpected 'content' provided when using shared memory")

    message = shm_request()
    del message.inputs[0].parameters["shared_memory_byte_size"]
    expect_invalid(message, "'shared_memory_byte_size' must be specified along with")

    message = shm_request()
    message.inputs[0].parameters["shared_memory_region"].int64_param = 3
    expect_invalid(message, "invalid value type for 'shared_memory_region'")

    message = shm_request()
    message.outputs[0].parameters["classification"].int64_param = 2
    expect_invalid(message, "Output can't set both 'shared_memory_region' and 'classification'")


def test_shared_memory_output_keeps_its_place_in_raw_output_contents() -> None:
    data = np.arange(3, dtype=np.int32)
    response = InferResponse(
        model_name="m",
        model_version="1",
        outputs=[
            Tensor("y", DataType.INT32, (3,), data, shm=SharedMemoryRef("out", 12)),
            Tensor("z", DataType.INT32, (3,), data),
        ],
    )
    message = codec.encode_infer_response(response)
    assert list(message.raw_output_contents) == [b"", data.tobytes()]
    assert [o.name for o in message.outputs] == ["y", "z"]
    assert list(message.outputs[0].shape) == [3]
    # tritonclient reads the other output correctly past the empty entry.
    np.testing.assert_array_equal(InferResult(message).as_numpy("z"), data)


# --- responses ------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", list(SAMPLES), ids=lambda d: d.value)
def test_response_reads_back_in_tritonclient(datatype: DataType) -> None:
    array = SAMPLES[datatype]
    response = InferResponse(
        model_name="m",
        model_version="1",
        id="i",
        outputs=[Tensor("y", datatype, array.shape, array)],
        parameters={"big": 2**64 - 1, "neg": -3, "flag": True, "f": 0.5, "s": "t"},
    )
    message = codec.encode_infer_response(response)
    assert len(message.raw_output_contents) == 1
    assert not message.outputs[0].HasField("contents")
    result = InferResult(
        triton_grpc.service_pb2.ModelInferResponse.FromString(message.SerializeToString())
    )
    got = result.as_numpy("y")
    assert got.shape == array.shape
    if datatype is DataType.BYTES:
        assert got.tolist() == array.tolist()
    elif datatype is DataType.BF16:
        np.testing.assert_array_equal(got, array.astype(np.float32))
    else:
        np.testing.assert_array_equal(got, array)
    parameters = codec.decode_parameters(message.parameters, "the response")
    assert parameters == {"big": 2**64 - 1, "neg": -3, "flag": True, "f": 0.5, "s": "t"}
    assert message.parameters["big"].WhichOneof("parameter_choice") == "uint64_param"


def test_stream_wrappers() -> None:
    request = pb.ModelInferRequest(model_name="m", model_version="1", id="r")
    error = codec.stream_error(request, ServerError(ErrorCode.NOT_FOUND, "gone"))
    assert error.error_message == "gone" and error.infer_response.id == "r"
    final = codec.empty_final_response(request)
    assert final.infer_response.id == "r" and not final.infer_response.outputs
    assert final.infer_response.parameters[codec.FINAL_RESPONSE].bool_param is True
    streamed = codec.stream_response(pb.ModelInferResponse(id="r"), final=False)
    assert streamed.infer_response.parameters[codec.FINAL_RESPONSE].bool_param is False
    assert not streamed.error_message
