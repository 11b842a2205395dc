"""Protocol-neutral request and response types over numpy.

Front ends build these from their wire forms and encode them back; nothing below the front
ends sees HTTP, gRPC or JSON.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, SupportsIndex

import numpy as np
import numpy.typing as npt

from ge_serve.link.dtypes import NUMPY_OF, triton_of

from ..errors import ErrorCode, ServerError
from . import error_texts

if TYPE_CHECKING:
    from ..observability.fronttrace import FrontTrace

ParamValue = bool | int | float | str
Parameters = dict[str, ParamValue]


class DataType(enum.Enum):
    """Triton's tensor datatypes, by their wire names."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"
    BF16 = "BF16"

    # Members are singletons, so identity hashes them; Enum's own __hash__ is a Python
    # function, and datatypes key the lookups that run several times a request.
    __hash__ = object.__hash__

    @classmethod
    def parse(cls, name: str) -> DataType:
        # The enum's own value map: `cls(name)` costs several times more, on every input.
        found = cls._value2member_map_.get(name)
        if found is None:
            raise ServerError(ErrorCode.INVALID_ARG, f"invalid datatype '{name}'")
        return found  # type: ignore[return-value]

    @classmethod
    def from_config(cls, config_type: str) -> DataType:
        """Map a ModelConfig `TYPE_*` name (e.g. TYPE_FP32, TYPE_STRING) to a DataType."""
        name = config_type.removeprefix("TYPE_")
        if name == "STRING":
            return cls.BYTES
        return cls.parse(name)

    @property
    def config_name(self) -> str:
        return "TYPE_STRING" if self is DataType.BYTES else f"TYPE_{self.value}"

    @property
    def numpy(self) -> np.dtype[Any]:
        return _NUMPY[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element on the wire; 0 for BYTES, whose elements vary."""
        return 0 if self is DataType.BYTES else _NUMPY[self].itemsize

    @classmethod
    def from_numpy(cls, dtype: np.dtype[Any]) -> DataType:
        try:
            return cls.parse(triton_of(dtype))
        except TypeError:
            raise ServerError(ErrorCode.INTERNAL, f"unsupported numpy dtype {dtype}") from None


# The one table of datatypes and numpy dtypes (ge_serve.link.dtypes), by member.
_NUMPY: dict[DataType, np.dtype[Any]] = {
    datatype: NUMPY_OF[datatype.value] for datatype in DataType
}


# numpy < 2 builds arrays of at most 32 dimensions (numpy 2: 64), so no tensor has more.
MAX_DIMS: Final = 32
# The most elements a tensor of any datatype can hold: at 8 bytes an element (INT64, FP64,
# and the object slot of a BYTES element) its byte size must still fit an int64.
MAX_ELEMENTS: Final = (2**63 - 1) // 8


def plain_count(shape: Sequence[object]) -> int | None:
    """The element count of the usual shape, positive ints within MAX_DIMS and
    MAX_ELEMENTS, in which check_shape finds nothing to refuse; None for any other."""
    if len(shape) > MAX_DIMS:
        return None
    count = 1
    for dim in shape:
        if type(dim) is not int or dim <= 0:
            return None
        count *= dim
    return count if count <= MAX_ELEMENTS else None


def check_shape(shape: Sequence[SupportsIndex], name: str, itemsize: int = 0) -> int:
    """The element count of an input's shape; a shape no tensor can have is INVALID_ARG.
    With the datatype's `itemsize` (0: BYTES, or not known yet), a byte size past INT64_MAX
    is refused in Triton's words ("byte size overflow for input ...").

    The bound is on the product of the non-zero dimensions, so a zero cannot hide absurd
    others: `[0, 2**62]` holds no elements, yet numpy cannot build it for most datatypes,
    and no client means it. (Triton multiplies as it goes, so a leading zero hides the
    rest from its overflow check.)
    """
    count = plain_count(shape)
    if count is not None:
        return count
    if len(shape) > MAX_DIMS:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"invalid shape for input '{name}': {len(shape)} dimensions, more than the "
            f"maximum of {MAX_DIMS}",
        )
    nominal = 1
    has_zero = False
    for dim in shape:
        if isinstance(dim, bool):
            raise _not_integers(name)
        try:
            value = operator.index(dim)
        except TypeError:
            raise _not_integers(name) from None
        if value < 0:
            raise ServerError(
                ErrorCode.INVALID_ARG, f"input '{name}' has a negative dimension in its shape"
            )
        if value == 0:
            has_zero = True
        else:
            nominal *= value
    if nominal > MAX_ELEMENTS:
        shown = [operator.index(d) for d in shape]
        if nominal > error_texts.INT64_MAX:
            raise error_texts.element_count_overflow(name, shown)
        if itemsize > 1 and nominal > error_texts.INT64_MAX // itemsize and not has_zero:
            raise error_texts.byte_size_overflow(name, nominal, itemsize)
        raise error_texts.element_count_overflow(name, shown, MAX_ELEMENTS)
    return 0 if has_zero else nominal


def _not_integers(name: str) -> ServerError:
    return ServerError(ErrorCode.INVALID_ARG, f"the shape of input '{name}' must hold integers")


@dataclass(frozen=True, slots=True)
class SharedMemoryRef:
    """Where a tensor lives in a registered shared-memory region (Triton's
    `shared_memory_region`, `shared_memory_offset` and `shared_memory_byte_size`)."""

    region: str
    byte_size: int
    offset: int = 0


@dataclass(slots=True)
class Tensor:
    """A named tensor. BYTES data is an object array of `bytes`; BF16 uses ml_dtypes.

    `shm` set on a request input means its data is still in shared memory: the core
    replaces `data` (empty until then) with a read-only view of the region. Set on a
    response output, it means the core wrote the output there, so the wire carries no data.
    """

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    data: npt.NDArray[Any]
    parameters: Parameters = field(default_factory=dict)
    shm: SharedMemoryRef | None = None


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output parameters.

    `binary_data` is a wire hint the front end keeps; `classification` (top-k) is applied by
    the core, so it is lifted out of the parameters here.
    """

    name: str
    classification: int = 0
    parameters: Parameters = field(default_factory=dict)
    # The region the core writes this output into instead of returning it on the wire.
    shm: SharedMemoryRef | None = None


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    # Empty means "every output of the model".
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: Parameters = field(default_factory=dict)
    # Lifted out of `parameters` at the edge; 0 means "the model's default".
    priority: int = 0
    timeout_us: int = 0
    # How the front end that decoded the request should encode its response (HTTP's
    # `binary_data_output`); never seen by the model.
    wire: Parameters = field(default_factory=dict)
    # The client's W3C trace context, read only while tracing is on.
    traceparent: str = ""
    # The front end's trace timestamps, made only while tracing is on.
    front: FrontTrace | None = None


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    id: str = ""
    outputs: list[Tensor] = field(default_factory=list)
    parameters: Parameters = field(default_factory=dict)
    # A decoupled model's last response for its request (the COMPLETE_FINAL flag came
    # with it); a stream marks it `triton_final_response: true`.
    final: bool = False
    # A decoupled model's error response, for the front ends that deliver it in the
    # stream and go on (`infer_responses(..., errors_inline=True)`); it has no outputs.
    error: ServerError | None = None


RESERVED_PARAMETER_PREFIX = "triton_"


def lift_request_parameters(request: InferRequest) -> None:
    """Move `priority` and `timeout` out of the parameters and refuse reserved keys.

    Every front end calls this once, so the rules live in one place.
    """
    params = request.parameters
    for key in params:
        if key.startswith(RESERVED_PARAMETER_PREFIX):
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"parameter keys starting with '{RESERVED_PARAMETER_PREFIX}' are reserved "
                f"for Triton usage, and should not be specified: '{key}'",
            )
    if "priority" in params:
        request.priority = _unsigned_64(params.pop("priority"), "priority")
    if "timeout" in params:
        request.timeout_us = _unsigned_64(params.pop("timeout"), "timeout")


def requested_output(name: str, params: Parameters) -> RequestedOutput:
    """A requested output with its `classification` count lifted out of `params`.

    Both front ends call this, so the rule and its message live in one place.
    """
    classification = params.pop("classification", 0)
    if (
        isinstance(classification, bool)
        or not isinstance(classification, int)
        or classification < 0
    ):
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"'classification' of output '{name}' must be a non-negative integer",
        )
    return RequestedOutput(name, classification, params)


def _unsigned_64(value: ParamValue, key: str) -> int:
    """A uint64, as Triton's HTTP front end reads `priority` and `timeout`, with its
    message. The gRPC codec has refused what Triton's gRPC front end refuses, in its
    words, before this; what it passes always fits."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"Unable to parse '{key}': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer",
        )
    return value
