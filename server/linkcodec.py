"""Requests and responses as the builtins a worker link carries (server/link.py).

Pickling the dataclasses and numpy arrays themselves costs ~20x what tuples of builtins
do, and would need an unpickler that may build classes. A numeric tensor travels as its
bytes (placed by the link: inline or in shared memory) and is rebuilt as a zero-copy
numpy view of them; BYTES tensors travel as their list of items.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ge_serve.backends.memfd import Region

from .control.sharedmemory import IN_SHARED_MEMORY
from .inference.types import (
    DataType,
    InferRequest,
    InferResponse,
    RequestedOutput,
    SharedMemoryRef,
    Tensor,
)
from .link import Link

# How a tensor's data travels.
_RAW = 0  # (kind, dtype str, placed bytes)
_ITEMS = 1  # (kind, list of items): object arrays
_IN_SHM = 2  # (kind,): a client shared-memory input the core maps / an output written there


def _ref(ref: SharedMemoryRef | None) -> tuple[str, int, int] | None:
    return None if ref is None else (ref.region, ref.byte_size, ref.offset)


def _unref(wire: Any) -> SharedMemoryRef | None:
    return None if wire is None else SharedMemoryRef(str(wire[0]), int(wire[1]), int(wire[2]))


def _data(link: Link, tensor: Tensor, regions: list[Region]) -> tuple[Any, ...]:
    array = tensor.data
    if tensor.shm is not None and (array is IN_SHARED_MEMORY or array.size == 0):
        return (_IN_SHM,)
    if array.dtype == np.object_:
        return (_ITEMS, array.ravel().tolist())
    array = np.ascontiguousarray(array)
    flat = array.reshape(-1).view(np.uint8)
    dtype = array.dtype.str if array.dtype.kind != "V" else ""
    return (_RAW, dtype, link.place(flat.data, regions))


def _array(link: Link, wire: tuple[Any, ...], datatype: DataType, shape: tuple[int, ...]) -> Any:
    kind = wire[0]
    if kind == _IN_SHM:
        return IN_SHARED_MEMORY
    if kind == _ITEMS:
        array = np.empty(len(wire[1]), dtype=np.object_)
        array[:] = wire[1]
        return array.reshape(shape)
    dtype = np.dtype(wire[1]) if wire[1] else np.dtype(datatype.numpy)
    return np.frombuffer(link.view(wire[2]), dtype=dtype).reshape(shape)


def _tensor(link: Link, tensor: Tensor, regions: list[Region]) -> tuple[Any, ...]:
    return (
        tensor.name,
        tensor.datatype.value,
        tensor.shape,
        _data(link, tensor, regions),
        tensor.parameters,
        _ref(tensor.shm),
    )


def _untensor(link: Link, wire: tuple[Any, ...]) -> Tensor:
    name, datatype_name, shape, data, parameters, ref = wire
    datatype = DataType(datatype_name)
    shape = tuple(shape)
    shm = _unref(ref)
    return Tensor(name, datatype, shape, _array(link, data, datatype, shape), parameters, shm)


def request_to_wire(link: Link, request: InferRequest, regions: list[Region]) -> tuple[Any, ...]:
    outputs = [(o.name, o.classification, o.parameters, _ref(o.shm)) for o in request.outputs]
    return (
        request.model_name,
        request.model_version,
        request.id,
        [_tensor(link, t, regions) for t in request.inputs],
        outputs,
        request.parameters,
        request.priority,
        request.timeout_us,
        request.wire,
        request.traceparent,
    )


def request_from_wire(link: Link, wire: tuple[Any, ...]) -> InferRequest:
    model, version, request_id, inputs, outputs, parameters, priority, timeout_us, how, trace = wire
    return InferRequest(
        model_name=model,
        model_version=version,
        id=request_id,
        inputs=[_untensor(link, t) for t in inputs],
        outputs=[RequestedOutput(n, c, p, _unref(s)) for n, c, p, s in outputs],
        parameters=parameters,
        priority=priority,
        timeout_us=timeout_us,
        wire=how,
        traceparent=trace,
    )


def response_to_wire(link: Link, response: InferResponse, regions: list[Region]) -> tuple[Any, ...]:
    outputs = []
    for tensor in response.outputs:
        if tensor.shm is not None:
            # Written to the client's region already: the front end sends no data for it.
            outputs.append(
                (tensor.name, tensor.datatype.value, tensor.shape, (_IN_SHM,), tensor.parameters,
                 _ref(tensor.shm))
            )  # fmt: skip
        else:
            outputs.append(_tensor(link, tensor, regions))
    return (
        response.model_name,
        response.model_version,
        response.id,
        outputs,
        response.parameters,
        response.final,
    )


def response_from_wire(link: Link, wire: tuple[Any, ...]) -> InferResponse:
    model, version, response_id, outputs, parameters, final = wire
    tensors = []
    for out in outputs:
        name, datatype_name, shape, data, params, ref = out
        datatype = DataType(datatype_name)
        shape = tuple(shape)
        if data[0] == _IN_SHM:
            # Only its shape and type reach the wire; a zero-cost array of that size stands
            # in for the data the client reads from its region.
            zero = np.zeros(1, dtype=datatype.numpy if datatype is not DataType.BYTES else object)
            array = np.broadcast_to(zero, shape) if math.prod(shape) else zero[:0].reshape(shape)
        else:
            array = _array(link, data, datatype, shape)
        tensors.append(Tensor(name, datatype, shape, array, params, _unref(ref)))
    return InferResponse(model, version, response_id, tensors, parameters, final)
