"""The load API's `config` JSON read as Triton's core reads it.

Triton parses it with protobuf's C++ JsonStringToMessage, which turns on its legacy
syntax and Triton's case-insensitive enums (core model_config_utils.cc JsonToModelConfig):
a single value stands for a one-element array (qa L0_lifecycle sends
`"instance_group": {"count": 2, "kind": "KIND_CPU"}`), and an enum name may be in any
case. Python's json_format allows neither, so the JSON is brought to the strict form
first; what is still wrong is left for json_format to name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


def load_object(text: str) -> Any:
    """json.loads, refusing a key given twice as json_format does."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key}")
        result[key] = value
    return result


def as_strict(data: Any, message: Message) -> Any:
    """`data` (`message`'s JSON object) with each lone value of a repeated field put in a
    list and each enum name upper-cased where that names a value; anything else as it is."""
    return _object(data, message.DESCRIPTOR.fields)


def _object(data: Any, fields_of: Sequence[Any]) -> Any:
    # Any: protobuf's stubs type a message's fields as either of two FieldDescriptor
    # classes (pure Python or upb); both have what is read here.
    if not isinstance(data, dict):
        return data
    fields: dict[str, Any] = {}
    for field in fields_of:
        fields[field.name] = field
        fields[field.json_name] = field
    return {key: _value(value, fields.get(key)) for key, value in data.items()}


def _value(value: Any, field: FieldDescriptor | None) -> Any:
    if field is None:
        return value
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        entry = message.fields_by_name["value"]
        if isinstance(value, dict):
            return {k: _element(v, entry) for k, v in value.items()}
        return value
    if field.is_repeated:
        if isinstance(value, list):
            return [_element(item, field) for item in value]
        if message is None or isinstance(value, dict):
            return [_element(value, field)]
        return value  # not a message: json_format names the field
    return _element(value, field)


def _element(value: Any, field: FieldDescriptor) -> Any:
    if field.message_type is not None:
        return _object(value, field.message_type.fields)
    if field.enum_type is not None and isinstance(value, str):
        upper = value.upper()
        if value not in field.enum_type.values_by_name and upper in field.enum_type.values_by_name:
            return upper
    return value
