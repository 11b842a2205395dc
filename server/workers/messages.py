"""The messages between the server and a front-end worker (ge_serve.link messages).

A worker sends `Infer` (a decoded request), `Cancel` (its client went away) and `Done`
(it has encoded the answer, so the answer's shared memory is free again). The server
answers each request with `Answer` or `Failed`, and says `Stop` when it stops. Nothing
else travels here: what is not inference a worker passes on to the server's own front
end on its Unix socket.

Tensors are `WireTensor`s: numeric data as placed bytes (inline or an arena region) and
the numpy dtype it has, BYTES as the list of its items (or, past INLINE_MAX, serialized
into an arena region), and none at all for data in a client's shared-memory region.
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
    # Placed bytes of a numeric tensor, or of a large BYTES one serialized; None: the data
    # is in the client's region.
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


# --- worker to server --------------------------------------------------------------------


class Infer(Message):
    id: int
    endpoint: str
    request: WireRequest


class Cancel(Message):
    id: int


class Done(Message):
    id: int


# --- server to worker --------------------------------------------------------------------


class Answer(Message):
    id: int
    response: WireResponse


class Failed(Message):
    id: int
    code: str
    message: str
    reason: str | None = None


class Stop(Message):
    """The server stops: finish the requests taken in, within the grace the worker was
    started with, and exit. A message, not a signal: workers leave SIGINT and SIGTERM to
    the server (ge_serve.link.child.leave_stop_signals_to_parent)."""


TO_SERVER = Codec((Infer, Cancel, Done))
TO_WORKER = Codec((Answer, Failed, Stop))
