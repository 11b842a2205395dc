"""A ModelConfig as Triton's JSON: proto field names, every field, 64-bit ints as numbers.

The core serves it on /config; a Python model gets it in `initialize` (`model_config`)
and completes it in `auto_complete_config`; so it is one function, here.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from ge_serve.protos import model_config_pb2


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
    """json_format prints 64-bit integers as strings; Triton prints them as numbers."""
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
