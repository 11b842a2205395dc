"""The messages between the server and a front-end worker (ge_serve.link messages).

A worker sends `Infer` (a decoded request), `Forward` (an HTTP request the server's own
application answers), `Cancel` (its client went away) and `Done` (it has encoded an
answer, so the answer's shared memory is free again). The server answers each request
with `Answer` or `Forwarded`, or `Failed`; a streamed HTTP answer comes first as
`Start` and `Part`s.

Tensors are `WireTensor`s: numeric data as placed bytes (inline or an arena region) and
the numpy dtype it has, BYTES as the list of its items, and none at all for data in a
client's shared-memory region.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ge_serve.link.messages import Codec, Message, Region

# Bytes of one tensor that travel inside the message rather than in shared memory.
INLINE_MAX = 64 << 10

# (region name, byte size, offset) of a client's shared-memory region.
ShmRef = tuple[str, int, int]


class WireTensor(msgspec.Struct, array_like=True):
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    shm: ShmRef | None
    # Placed bytes of a numeric tensor; None: the data is in the client's region.
    data: bytes | Region | None = None
    # The numpy dtype of `data` ("": the datatype's own).
    dtype: str = ""
    # A BYTES tensor's items.
    items: list[Any] | None = None


class WireOutput(msgspec.Struct, array_like=True):
    name: str
    classification: int
    parameters: dict[str, Any]
    shm: ShmRef | None


class WireRequest(msgspec.Struct, array_like=True):
    model_name: str
    model_version: str
    id: str
    inputs: list[WireTensor]
    outputs: list[WireOutput]
    parameters: dict[str, Any]
    priority: int
    timeout_us: int
    wire: dict[str, Any]
    traceparent: str


class WireResponse(msgspec.Struct, array_like=True):
    model_name: str
    model_version: str
    id: str
    outputs: list[WireTensor]
    parameters: dict[str, Any]
    final: bool


Headers = list[tuple[bytes, bytes]]

# --- worker to server --------------------------------------------------------------------


class Infer(Message):
    id: int
    endpoint: str
    request: WireRequest


class Forward(Message):
    """An HTTP request, its ASGI scope as builtins and its whole body."""

    id: int
    scope: dict[str, Any]
    headers: Headers
    body: bytes | Region


class Cancel(Message):
    id: int


class Done(Message):
    id: int


# --- server to worker --------------------------------------------------------------------


class Answer(Message):
    id: int
    response: WireResponse


class Forwarded(Message):
    id: int
    status: int
    headers: Headers
    body: bytes | Region


class Start(Message):
    """A streamed HTTP answer begins (its chunks follow as `Part`s)."""

    id: int
    status: int
    headers: Headers


class Part(Message):
    id: int
    chunk: bytes


class Failed(Message):
    id: int
    code: str
    message: str
    reason: str | None = None


TO_SERVER = Codec((Infer, Forward, Cancel, Done))
TO_WORKER = Codec((Answer, Forwarded, Start, Part, Failed))
