"""A ModelConfig as Triton's JSON: proto field names, every field, 64-bit ints as numbers.

The core serves it on /config; a Python model gets it in `initialize` (`model_config`)
and completes it in `auto_complete_config`; so it is one function, here. `as_served`
adds the defaults Triton's core writes into every config it serves.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from ge_serve.protos import model_config_pb2

# Triton's default max_sequence_idle_microseconds (core constants.h).
SEQUENCE_IDLE_DEFAULT_US = 1_000_000


def as_served(config: model_config_pb2.ModelConfig) -> model_config_pb2.ModelConfig:
    """A copy with the defaults Triton's NormalizeModelConfig (core model_config_utils.cc)
    fills in, as Triton's config API and a Python model's `initialize` show them.

    A copy, not the loaded config: ge-serve's schedulers read the config as written, and
    a preferred_batch_size of max_batch_size would change its dynamic batcher's choices
    (its batcher sends a batch at once when no preferred size is set). The other
    defaults are what ge-serve applies anyway: latest 1 version, a 1 s sequence idle
    time, oldest's preferred size of max_batch_size; pinned memory has no meaning here.
    """
    served = model_config_pb2.ModelConfig()
    served.CopyFrom(config)
    mbs = served.max_batch_size
    if not served.HasField("version_policy"):
        served.version_policy.latest.num_versions = 1
    dynamic = served.dynamic_batching
    if served.HasField("dynamic_batching") and not dynamic.preferred_batch_size and mbs > 0:
        dynamic.preferred_batch_size.append(mbs)
    if served.HasField("sequence_batching"):
        sequence = served.sequence_batching
        if sequence.max_sequence_idle_microseconds == 0:
            sequence.max_sequence_idle_microseconds = SEQUENCE_IDLE_DEFAULT_US
        if sequence.HasField("oldest") and not sequence.oldest.preferred_batch_size and mbs > 0:
            sequence.oldest.preferred_batch_size.append(mbs)
    if not served.HasField("ensemble_scheduling"):
        optimization = served.optimization
        if not optimization.HasField("input_pinned_memory"):
            optimization.input_pinned_memory.enable = True
        if not optimization.HasField("output_pinned_memory"):
            optimization.output_pinned_memory.enable = True
    return served


def config_to_json(config: model_config_pb2.ModelConfig) -> dict[str, Any]:
    data: dict[str, Any] = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    _ints_as_numbers(config, data)
    return data


_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _ints_as_numbers(message: Message, data: dict[str, Any]) -> None:
    """json_format prints 64-bit integers as strings; Triton prints them as numbers. It
    also prints the fields it adds for their defaults after the set ones; Triton prints
    every field in the proto's order (qa L0_config_json greps a queue policy's JSON)."""
    order = [field.name for field in message.DESCRIPTOR.fields if field.name in data]
    if list(data) != order:
        ordered = {name: data[name] for name in order}
        data.clear()
        data.update(ordered)
    for field in message.DESCRIPTOR.fields:
        if field.name not in data:
            continue
        value = getattr(message, field.name)
        if field.type in _INT64_TYPES:
            if field.is_repeated:
                data[field.name] = [int(v) for v in value]
            else:
                data[field.name] = int(value)
        elif field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.type == FieldDescriptor.TYPE_MESSAGE:
                    for key, sub in value.items():
                        _ints_as_numbers(sub, data[field.name][str(key)])
                elif value_field.type in _INT64_TYPES:
                    data[field.name] = {k: int(v) for k, v in data[field.name].items()}
            elif field.is_repeated:
                for sub, sub_data in zip(value, data[field.name], strict=True):
                    _ints_as_numbers(sub, sub_data)
            else:
                _ints_as_numbers(value, data[field.name])
