"""An input's JSON `data` as a numpy array: the KServe v2 JSON tensor form, checked.

The elements' types are read once, as a set, which also says whether the data is nested;
an all-integer array is built by numpy straight from the list, since numpy >= 2 refuses
a Python integer out of the dtype's range (NEP 50) rather than wrapping it. Only then,
on that error, are the extremes looked for, to name the value as the message does.

NaN and the infinities travel as the literals `NaN`, `Infinity` and `-Infinity`, both
ways, as Triton's TritonJson writes and reads them (rapidjson's kWriteNanAndInfFlag and
kParseNanAndInfFlag) and as Python's json, tritonclient's parser, reads them. orjson does
neither, so each side takes a slower way only when such a value is there: an output is
checked in one cheap pass, a body is read again only when orjson refused a literal.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from ..errors import ServerError, invalid_arg
from ..inference import error_texts
from ..inference.error_texts import MAX_JSON_DEPTH, InputRef
from ..inference.types import DataType
from ..inference.wire import RAW_ONLY, object_array

_INTEGER_TYPES: Final = frozenset(
    {
        DataType.UINT8,
        DataType.UINT16,
        DataType.UINT32,
        DataType.UINT64,
        DataType.INT8,
        DataType.INT16,
        DataType.INT32,
        DataType.INT64,
    }
)
_FP32_MAX: Final = float(np.finfo(np.float32).max)
# Each integer datatype's least value, to say which end of its range a value is past.
_INTEGER_MIN: Final = {t: int(np.iinfo(t.numpy).min) for t in _INTEGER_TYPES}
# The element types each datatype takes, as sets to compare the data's own with.
_INTS: Final = frozenset({int})
_BOOLS: Final = frozenset({bool})
_STRS: Final = frozenset({str})
_NUMBERS: Final = frozenset({int, float})
# What orjson stops at when a body holds a non-finite literal (`-Infinity` at its `I`).
_LITERALS: Final = ("NaN", "Infinity")
# The integers orjson reads as integers; it reads others as floats.
_ORJSON_INT_MIN: Final = -(2**63)
_ORJSON_INT_MAX: Final = 2**64 - 1


def json_input(
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    count: int,
    data: Any,
    model: str,
    request_id: str,
) -> npt.NDArray[Any]:
    """Input `name`'s array, whose `shape` holds `count` elements, from its JSON `data`
    (flat or nested, row-major); `model` and `request_id` are for Triton's messages."""
    if datatype in RAW_ONLY:
        raise invalid_arg(
            f"receiving {datatype.value} data via JSON is not supported. Please use the "
            f"binary data format for input {name}"
        )
    if not isinstance(data, list):
        raise invalid_arg(f"'data' of input '{name}' must be an array, not {json_kind(data)}")
    kinds = set(map(type, data))
    if list in kinds:
        flat = flatten_nested(data, error_texts.json_too_deep)
        kinds = set(map(type, flat))
    else:
        flat = data
    if len(flat) != count:
        if datatype is DataType.BYTES:
            ref = InputRef(name, model, request_id)
            if len(flat) > count:
                raise error_texts.too_many_strings(ref, count + 1, count)
            raise error_texts.too_few_strings(ref, count, len(flat))
        if len(flat) > count:
            raise error_texts.json_data_too_long()
        raise error_texts.json_data_too_short()
    arr = _to_numpy(name, datatype, flat, kinds)
    # A 1-D shape is the flat array's own (its length is the count).
    return arr if len(shape) == 1 else arr.reshape(shape)


def flatten_nested(data: list[Any], too_deep: Callable[[], ServerError]) -> list[Any]:
    """Row-major elements of nested `data` arrays, without recursion (the nesting is the
    client's to choose), raising `too_deep()` past MAX_JSON_DEPTH levels as Triton does."""
    for item in data:
        if type(item) is list:
            break
    else:
        return data
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                if len(stack) == MAX_JSON_DEPTH:
                    raise too_deep()
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _to_numpy(name: str, datatype: DataType, flat: list[Any], kinds: set[type]) -> npt.NDArray[Any]:
    """`flat` as a 1-D array of `datatype`; `kinds`, the types of its elements."""
    if datatype in _INTEGER_TYPES:
        if not kinds <= _INTS:
            raise _wrong_elements(name, datatype, "integers")
        try:
            return np.array(flat, dtype=datatype.numpy)
        except OverflowError:
            raise _out_of_range(name, datatype, flat) from None
    if datatype is DataType.BOOL:
        if not kinds <= _BOOLS:
            raise _wrong_elements(name, datatype, "booleans")
        return np.array(flat, dtype=np.bool_)
    if datatype is DataType.BYTES:
        if not kinds <= _STRS:
            raise _wrong_elements(name, datatype, "strings")
        return object_array([s.encode("utf-8") for s in flat])
    # FP32 and FP64; JSON integers are fine as floats.
    if not kinds <= _NUMBERS:
        raise _wrong_elements(name, datatype, "numbers")
    return float_array(flat, datatype, name)


def float_array(flat: list[Any], datatype: DataType, name: str) -> npt.NDArray[Any]:
    """JSON numbers as FP64, or FP32 when every one fits it (INVALID_ARG otherwise)."""
    array = np.array(flat, dtype=np.float64)
    if datatype is DataType.FP32:
        # `not <=` holds for a NaN too. An infinity or NaN is kept as the client wrote it;
        # then only the finite values are held to FP32's range.
        if array.size and not float(np.abs(array).max()) <= _FP32_MAX:
            finite = np.abs(array[np.isfinite(array)])
            if finite.size and float(finite.max()) > _FP32_MAX:
                raise invalid_arg(f"input '{name}': a value is out of range for FP32")
        return array.astype(np.float32)
    return array


def reread_nonfinite(refusal: json.JSONDecodeError) -> Any:
    """The document orjson refused with `refusal`, read again with NaN, Infinity and
    -Infinity as numbers, when a literal is what orjson refused; None when its refusal
    stands (no such literal there, or the document is refused for something else too)."""
    text, pos = refusal.doc, refusal.pos
    if not text.startswith(_LITERALS, pos):
        return None
    try:
        doc = json.loads(text, parse_int=_orjson_int, parse_float=_finite_float)
        # Python's json keeps what orjson refuses, lone surrogates (`"\ud800"`): writing
        # the document with orjson refuses them too.
        orjson.dumps(doc)
    except (ValueError, TypeError, RecursionError):
        return None
    return doc


def _orjson_int(text: str) -> int | float:
    """An integer as orjson reads it: a float past the 64-bit integers."""
    value = int(text) if len(text) < 22 else _ORJSON_INT_MAX + 1
    return value if _ORJSON_INT_MIN <= value <= _ORJSON_INT_MAX else _finite_float(text)


def _finite_float(text: str) -> float:
    """A number as orjson reads it: one past the doubles (`1e400`) is refused."""
    value = float(text)
    if math.isinf(value):
        raise ValueError("number is infinity when parsed as double")
    return value


def literal_json(flat: npt.NDArray[Any], scalar: bool = False) -> orjson.Fragment:
    """A flat FP32 or FP64 array holding NaN or an infinity, or its one element
    (`scalar`), as JSON with the literals NaN, Infinity and -Infinity where orjson would
    write null (which loses the value, and the infinity's sign)."""
    finite = np.isfinite(flat)
    # orjson writes each non-finite value, and nothing else, as null (no number holds
    # "null"): each in turn is replaced by its literal.
    text = orjson.dumps(flat[0] if scalar else flat, option=orjson.OPT_SERIALIZE_NUMPY)
    parts = text.split(b"null")
    pieces = [parts[0]]
    for number, part in zip(flat[~finite].tolist(), parts[1:], strict=True):
        pieces.append(b"NaN" if number != number else b"Infinity" if number > 0 else b"-Infinity")
        pieces.append(part)
    return orjson.Fragment(b"".join(pieces))


def _out_of_range(name: str, datatype: DataType, flat: list[int]) -> ServerError:
    low = min(flat)
    bad = low if low < _INTEGER_MIN[datatype] else max(flat)
    return invalid_arg(f"input '{name}': value {bad} is out of range for {datatype.value}")


def _wrong_elements(name: str, datatype: DataType, expected: str) -> ServerError:
    return invalid_arg(f"input '{name}': {datatype.value} 'data' elements must be {expected}")


def json_kind(value: Any) -> str:
    """What a JSON value is, in words for a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
