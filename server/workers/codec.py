"""Requests and responses as the messages a front-end worker's link carries.

A numeric tensor travels as its bytes (placed by the link: inline or in shared memory)
and is rebuilt as a zero-copy numpy view of them; a small BYTES tensor travels as its list
of items, a large one serialized (Triton's form) in shared memory; data in a client's
shared-memory region does not travel at all.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ge_serve.link.endpoint import Endpoint
from ge_serve.link.messages import Region
from ge_serve.link.tensors import deserialize_bytes, raw_bytes, serialize_bytes

from ..control.sharedmemory import IN_SHARED_MEMORY
from ..inference.types import (
    DataType,
    InferRequest,
    InferResponse,
    RequestedOutput,
    SharedMemoryRef,
    Tensor,
)
from ..inference.wire import object_array
from .messages import ShmRef, WireOutput, WireRequest, WireResponse, WireTensor


def _ref(ref: SharedMemoryRef | None) -> ShmRef | None:
    return None if ref is None else (ref.region, ref.byte_size, ref.offset)


def _unref(wire: ShmRef | None) -> SharedMemoryRef | None:
    return None if wire is None else SharedMemoryRef(wire[0], wire[1], wire[2])


def _tensor(link: Endpoint, tensor: Tensor, regions: list[Region]) -> WireTensor:
    wire = WireTensor(
        tensor.name, tensor.datatype.value, tensor.shape, tensor.parameters, _ref(tensor.shm)
    )
    array = tensor.data
    if tensor.shm is not None and (array is IN_SHARED_MEMORY or array.size == 0):
        return wire
    if array.dtype == np.object_:
        items = array.ravel().tolist()
        if _small(items, link.inline_max):
            wire.items = items
            return wire
        # Large BYTES data travels as numeric data does, serialized into the arena: inside
        # the message it could pass the link's frame limit, which ends the link.
        wire.data = link.place(memoryview(serialize_bytes(items)), regions)
        return wire
    wire.dtype = array.dtype.str if array.dtype.kind != "V" else ""
    wire.data = link.place(raw_bytes(array), regions)
    return wire


def _small(items: list[Any], limit: int) -> bool:
    """Whether BYTES items hold at most `limit` bytes (4 per element for its length)."""
    try:
        return 4 * len(items) + sum(map(len, items)) <= limit
    except TypeError:  # an element that is not bytes or str: serialized as its text
        return False


def _array(link: Endpoint, wire: WireTensor, datatype: DataType, shape: tuple[int, ...]) -> Any:
    if wire.items is not None:
        return object_array(wire.items).reshape(shape)
    if wire.data is None:
        return IN_SHARED_MEMORY
    if datatype is DataType.BYTES:
        # Copied into bytes objects, so the region is not read after the message.
        return deserialize_bytes(link.view(wire.data), math.prod(shape)).reshape(shape)
    dtype = np.dtype(wire.dtype) if wire.dtype else datatype.numpy
    return np.frombuffer(link.view(wire.data), dtype=dtype).reshape(shape)


def _untensor(link: Endpoint, wire: WireTensor) -> Tensor:
    datatype = DataType(wire.datatype)
    shape = tuple(wire.shape)
    array = _array(link, wire, datatype, shape)
    return Tensor(wire.name, datatype, shape, array, wire.parameters, _unref(wire.shm))


def request_to_wire(link: Endpoint, request: InferRequest, regions: list[Region]) -> WireRequest:
    return WireRequest(
        request.model_name,
        request.model_version,
        request.id,
        [_tensor(link, t, regions) for t in request.inputs],
        [WireOutput(o.name, o.classification, o.parameters, _ref(o.shm)) for o in request.outputs],
        request.parameters,
        request.priority,
        request.timeout_us,
        request.wire,
        request.traceparent,
    )


def request_from_wire(link: Endpoint, wire: WireRequest) -> InferRequest:
    return InferRequest(
        model_name=wire.model_name,
        model_version=wire.model_version,
        id=wire.id,
        inputs=[_untensor(link, t) for t in wire.inputs],
        outputs=[
            RequestedOutput(o.name, o.classification, o.parameters, _unref(o.shm))
            for o in wire.outputs
        ],
        parameters=wire.parameters,
        priority=wire.priority,
        timeout_us=wire.timeout_us,
        wire=wire.wire,
        traceparent=wire.traceparent,
    )


def response_to_wire(
    link: Endpoint, response: InferResponse, regions: list[Region]
) -> WireResponse:
    outputs = []
    for tensor in response.outputs:
        if tensor.shm is not None:
            # Written to the client's region already: the front end sends no data for it.
            outputs.append(
                WireTensor(tensor.name, tensor.datatype.value, tensor.shape, tensor.parameters,
                           _ref(tensor.shm))
            )  # fmt: skip
        else:
            outputs.append(_tensor(link, tensor, regions))
    return WireResponse(
        response.model_name,
        response.model_version,
        response.id,
        outputs,
        response.parameters,
        response.final,
    )


def response_from_wire(link: Endpoint, wire: WireResponse) -> InferResponse:
    tensors = []
    for out in wire.outputs:
        datatype = DataType(out.datatype)
        shape = tuple(out.shape)
        if out.shm is not None and out.data is None and out.items is None:
            # Only its shape and type reach the wire; a zero-cost array of that size stands
            # in for the data the client reads from its region.
            zero = np.zeros(1, dtype=datatype.numpy if datatype is not DataType.BYTES else object)
            array = np.broadcast_to(zero, shape) if math.prod(shape) else zero[:0].reshape(shape)
        else:
            array = _array(link, out, datatype, shape)
        tensors.append(Tensor(out.name, datatype, shape, array, out.parameters, _unref(out.shm)))
    return InferResponse(
        wire.model_name, wire.model_version, wire.id, tensors, wire.parameters, wire.final
    )
