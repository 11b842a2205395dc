"""The messages between the server and a Python model's worker (ge_serve.link messages).

Both processes import this module: host/ (the server's side) and child/ (the worker's).
Tensors travel as `ArenaTensor`s placed in the sender's arena; the receiver says it has
read them with the link's `Release`.

The server asks with numbered calls (`Init`, `Execute`, `Autocomplete`, `Finalize`) that
the worker answers with `Done`; the model's own calls go the other way (`Bls`, `Call`,
answered with `BlsAnswer` and `Reply`), and the rest needs no answer (`Respond`,
`BlsCancel`, `MetricUpdate`, `MetricDelete`, `Log`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ge_serve.link.messages import Codec, Message
from ge_serve.link.tensors import ArenaTensor


class ErrorText(msgspec.Struct, array_like=True):
    """A Triton error: its code name and message."""

    code: str
    message: str


class Encoded(msgspec.Struct, array_like=True):
    """A response as it travels: outputs, or an error; parameters as JSON text."""

    outputs: list[ArenaTensor]
    error: ErrorText | None
    parameters: str


class Request(msgspec.Struct, array_like=True):
    """One request of an `Execute` batch."""

    key: int
    id: str
    inputs: list[ArenaTensor]
    requested: list[str]
    parameters: str
    # Its sequence: correlation ID (0 or "": none) and Triton's flags (1 START, 2 END).
    correlation_id: int | str = 0
    flags: int = 0
    # Its timeout, microseconds (0: none).
    timeout: int = 0


class BlsRequest(msgspec.Struct, array_like=True):
    model: str
    version: str
    id: str
    inputs: list[ArenaTensor]
    requested: list[str]
    parameters: str
    timeout: int
    # The key of the request (still in the worker's hands) the call was made for.
    parent: int | None
    correlation_id: int | str = 0
    flags: int = 0


# --- server to worker ---------------------------------------------------------------------


class Init(Message):
    number: int
    payload: dict[str, Any]


class Execute(Message):
    number: int
    batch: list[Request]


class Autocomplete(Message):
    number: int
    model_path: str
    config_json: str
    # A Python-based backend's model.py, run in the model's stead ("" for none).
    backend_file: str = ""


class Finalize(Message):
    number: int


class BlsAnswer(Message):
    number: int
    response: Encoded | None
    final: bool


class Reply(Message):
    number: int
    ok: bool
    value: Any


# --- worker to server ---------------------------------------------------------------------


class Done(Message):
    """A numbered call answered: `error` says why it failed; an execute's `responses`
    (None, for all of them or for one: the model answers through the response sender);
    an autocomplete's `text`."""

    number: int
    error: str | None = None
    responses: list[Encoded | None] | None = None
    text: str | None = None


class Respond(Message):
    key: int
    response: Encoded | None
    final: bool


class Bls(Message):
    number: int
    request: BlsRequest
    decoupled: bool


class BlsCancel(Message):
    number: int


class Call(Message):
    number: int
    name: str
    args: list[Any]


class MetricUpdate(Message):
    id: int
    op: str
    value: float


class MetricDelete(Message):
    id: int


class Log(Message):
    level: int
    text: str
    where: str


TO_WORKER = Codec((Init, Execute, Autocomplete, Finalize, BlsAnswer, Reply))
TO_SERVER = Codec((Done, Respond, Bls, BlsCancel, Call, MetricUpdate, MetricDelete, Log))
