"""The central types (every Triton datatype) and the config as /config prints it."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest
from google.protobuf import json_format, text_format

from ge_serve.backends.config_json import as_served
from ge_serve.protos import model_config_pb2
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.http.codec import encode_json
from ge_serve.server.http.encode import config_to_json
from ge_serve.server.inference.types import DataType, InferRequest, lift_request_parameters

# --- DataType ------------------------------------------------------------------------------------

NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
    "BF16": ml_dtypes.bfloat16,
}
SIZES = {"BOOL": 1, "BF16": 2, "FP16": 2, "BYTES": 0}


def test_every_triton_datatype_is_there() -> None:
    assert sorted(d.value for d in DataType) == sorted(NUMPY)


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_datatype_maps(name: str) -> None:
    datatype = DataType.parse(name)
    assert datatype.value == name
    assert datatype.numpy == np.dtype(NUMPY[name])
    expected_size = SIZES.get(name, np.dtype(NUMPY[name]).itemsize)
    assert datatype.itemsize == expected_size
    config_name = "TYPE_STRING" if name == "BYTES" else f"TYPE_{name}"
    assert datatype.config_name == config_name
    assert DataType.from_config(config_name) is datatype
    # Every config name is one the proto knows.
    assert model_config_pb2.DataType.Value(config_name) > 0
    assert DataType.from_numpy(datatype.numpy) is datatype


def test_bf16_is_ml_dtypes_bfloat16() -> None:
    data = np.array([1.5, -2.0, 3.0e38], dtype=DataType.BF16.numpy)
    assert data.dtype.itemsize == 2
    words = data.view(np.uint16)
    assert np.array_equal(words.view(ml_dtypes.bfloat16), data)
    # bf16 is the top half of the fp32 bit pattern.
    assert words[0] == np.array([1.5], np.float32).view(np.uint32)[0] >> 16


def test_bytes_arrays_are_object_arrays_and_strings_map_to_bytes() -> None:
    assert DataType.from_numpy(np.dtype("S5")) is DataType.BYTES
    assert DataType.from_numpy(np.dtype("U3")) is DataType.BYTES
    assert DataType.from_numpy(np.dtype(object)) is DataType.BYTES


def test_unknown_datatypes_are_refused() -> None:
    with pytest.raises(ServerError) as info:
        DataType.parse("FP8")
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message == "invalid datatype 'FP8'"
    with pytest.raises(ServerError) as info:
        DataType.from_numpy(np.dtype(np.complex64))
    assert info.value.code is ErrorCode.INTERNAL


# --- request parameters ---------------------------------------------------------------------------


def test_priority_and_timeout_are_lifted_out() -> None:
    request = InferRequest("m", parameters={"priority": 2, "timeout": 1500, "custom": "x"})
    lift_request_parameters(request)
    assert (request.priority, request.timeout_us) == (2, 1500)
    assert request.parameters == {"custom": "x"}


@pytest.mark.parametrize("key", ["triton_enable_empty_final_response", "triton_anything"])
def test_reserved_parameter_keys_are_refused(key: str) -> None:
    with pytest.raises(ServerError) as info:
        lift_request_parameters(InferRequest("m", parameters={key: True}))
    assert info.value.code is ErrorCode.INVALID_ARG
    assert f"'{key}'" in info.value.message and "reserved" in info.value.message


@pytest.mark.parametrize("key", ["priority", "timeout"])
@pytest.mark.parametrize("value", [-1, 1.5, "3", True, 2**64])
def test_priority_and_timeout_must_be_uint64s(key: str, value: Any) -> None:
    with pytest.raises(ServerError) as info:
        lift_request_parameters(InferRequest("m", parameters={key: value}))
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message == (
        f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as unsigned-integer"
    )


def test_priority_and_timeout_are_lifted_up_to_the_uint64_maximum() -> None:
    request = InferRequest("m", parameters={"priority": 2**64 - 1, "timeout": 0, "x": 1})
    lift_request_parameters(request)
    assert (request.priority, request.timeout_us, request.parameters) == (2**64 - 1, 0, {"x": 1})


# --- the config as JSON ------------------------------------------------------------------

CONFIG = """
name: "big"
backend: "onnxruntime"
max_batch_size: 16
input [ { name: "IN" data_type: TYPE_INT64 dims: [ -1, 9007199254740993 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 18446744073709551615
  priority_levels: 2
  default_queue_policy { default_timeout_microseconds: 1234567890123 max_queue_size: 7 }
  priority_queue_policy {
    key: 1
    value { timeout_action: DELAY default_timeout_microseconds: 42 }
  }
}
parameters { key: "intra_op_thread_count" value { string_value: "4" } }
parameters { key: "big_number" value { string_value: "12345678901234567890" } }
model_warmup [
  {
    name: "w"
    batch_size: 1
    inputs { key: "IN" value { data_type: TYPE_INT64 dims: [ 1, 2 ] zero_data: true } }
  }
]
"""


@pytest.fixture(scope="module")
def config() -> model_config_pb2.ModelConfig:
    return text_format.Parse(CONFIG, model_config_pb2.ModelConfig())


def test_64_bit_integers_are_json_numbers(config: model_config_pb2.ModelConfig) -> None:
    data = config_to_json(config)
    batching = data["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == 18446744073709551615
    assert batching["preferred_batch_size"] == [4, 8]
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 1234567890123
    assert batching["priority_queue_policy"]["1"]["default_timeout_microseconds"] == 42
    assert batching["priority_queue_policy"]["1"]["timeout_action"] == "DELAY"
    assert data["input"][0]["dims"] == [-1, 9007199254740993]
    assert data["model_warmup"][0]["inputs"]["IN"]["dims"] == [1, 2]
    assert data["max_batch_size"] == 16
    assert data["instance_group"][0]["count"] == 2
    # The bytes the HTTP front end sends carry numbers, big ones exactly.
    text = encode_json(data).decode()
    assert '"max_queue_delay_microseconds":18446744073709551615' in text
    assert '"dims":[-1,9007199254740993]' in text


def test_string_parameters_that_look_numeric_stay_strings(
    config: model_config_pb2.ModelConfig,
) -> None:
    parameters = config_to_json(config)["parameters"]
    assert parameters["intra_op_thread_count"] == {"string_value": "4"}
    assert parameters["big_number"] == {"string_value": "12345678901234567890"}


def test_proto_field_names_and_every_field(config: model_config_pb2.ModelConfig) -> None:
    data = config_to_json(config)
    assert "max_batch_size" in data and "maxBatchSize" not in data
    assert data["input"][0]["data_type"] == "TYPE_INT64"
    assert data["instance_group"][0]["kind"] == "KIND_CPU"
    # Every field outside a oneof that is not a nested message is printed, default or not.
    for field in model_config_pb2.ModelConfig.DESCRIPTOR.fields:
        is_message = (
            field.message_type is not None and not field.message_type.GetOptions().map_entry
        )
        repeated = field.is_repeated
        if field.containing_oneof is None and (not is_message or repeated):
            assert field.name in data, field.name
    assert data["platform"] == "" and data["runtime"] == ""
    assert data["batch_input"] == [] and data["cc_model_filenames"] == {}
    assert data["output"][0]["is_shape_tensor"] is False
    assert data["input"][0]["optional"] is False


def test_json_round_trips_to_the_same_config(config: model_config_pb2.ModelConfig) -> None:
    parsed = json_format.ParseDict(config_to_json(config), model_config_pb2.ModelConfig())
    assert parsed == config


def test_empty_config_prints_defaults() -> None:
    data = config_to_json(model_config_pb2.ModelConfig(name="e"))
    assert data["name"] == "e"
    assert data["max_batch_size"] == 0
    assert data["input"] == [] and data["parameters"] == {}
    assert "dynamic_batching" not in data


def served_json(text: str) -> dict[str, Any]:
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    return config_to_json(as_served(config))


def test_the_served_config_has_tritons_filled_in_defaults() -> None:
    # Triton's NormalizeModelConfig (core model_config_utils.cc), as its config API shows.
    dynamic = served_json('name: "m" max_batch_size: 8 dynamic_batching { }')
    assert dynamic["version_policy"] == {"latest": {"num_versions": 1}}
    assert dynamic["dynamic_batching"]["preferred_batch_size"] == [8]
    assert dynamic["optimization"]["input_pinned_memory"] == {"enable": True}
    assert dynamic["optimization"]["output_pinned_memory"] == {"enable": True}
    sequence = served_json('name: "m" max_batch_size: 4 sequence_batching { oldest { } }')
    assert sequence["sequence_batching"]["max_sequence_idle_microseconds"] == 1_000_000
    assert sequence["sequence_batching"]["oldest"]["preferred_batch_size"] == [4]


def test_the_served_config_keeps_what_the_config_says() -> None:
    text = """
        name: "m" max_batch_size: 8
        version_policy { all { } }
        dynamic_batching { preferred_batch_size: [ 2 ] }
        optimization { input_pinned_memory { enable: false } }
    """
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    served = config_to_json(as_served(config))
    assert served["version_policy"] == {"all": {}}
    assert served["dynamic_batching"]["preferred_batch_size"] == [2]
    assert served["optimization"]["input_pinned_memory"] == {"enable": False}
    assert served["optimization"]["output_pinned_memory"] == {"enable": True}
    # A copy: the loaded config, which the schedulers read, is left as it was.
    assert (
        not config.HasField("optimization") or not config.optimization.output_pinned_memory.enable
    )
    unbatched = served_json('name: "m" dynamic_batching { }')
    assert unbatched["dynamic_batching"]["preferred_batch_size"] == []
    ensemble = served_json('name: "e" platform: "ensemble" ensemble_scheduling { }')
    assert "optimization" not in ensemble


def test_fields_print_in_the_protos_order_as_tritons_json() -> None:
    # qa L0_config_json greps this exact text; json_format put default-valued fields last.
    text = """
        name: "m" max_batch_size: 2
        dynamic_batching {
          priority_levels: 2 default_priority_level: 1
          priority_queue_policy {
            key: 2
            value { default_timeout_microseconds: 100 allow_timeout_override: true
                    max_queue_size: 10 }
          }
        }
    """
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    policy = config_to_json(config)["dynamic_batching"]["priority_queue_policy"]["2"]
    assert encode_json(policy) == (
        b'{"timeout_action":"REJECT","default_timeout_microseconds":100,'
        b'"allow_timeout_override":true,"max_queue_size":10}'
    )
