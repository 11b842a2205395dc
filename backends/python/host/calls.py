"""What a Python model may ask of the server's core, as the backend sees it.

Backends import nothing of the server, so the core's side of BLS is handed in (the
composition root passes an implementation of `CoreCalls`) and speaks these plain types.
A BLS request enters the core exactly as a client's request would: through the called
model's scheduler and batcher, counted in its statistics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ge_serve.backends.base import Array, ModelError, ParamValue


@dataclass(frozen=True, slots=True)
class CoreCall:
    """One BLS request."""

    model_name: str
    model_version: str
    request_id: str
    # (name, Triton datatype, data)
    inputs: list[tuple[str, str, Array]]
    requested_outputs: list[str]
    parameters: dict[str, ParamValue] = field(default_factory=dict)
    timeout_us: int = 0
    # The caller wants every response of a decoupled model (exec(decoupled=True)).
    decoupled: bool = False
    # The trace of the request the call was made for (its RequestContext.trace).
    parent_trace: object | None = None
    # Its sequence, as the model set it on the pb_utils.InferenceRequest: correlation ID
    # (0 or "": none) and Triton's flags (1: START, 2: END).
    correlation_id: int | str = 0
    flags: int = 0


@dataclass(frozen=True, slots=True)
class CoreResponse:
    """One response to a BLS request: its outputs (name, data), or why it failed."""

    outputs: list[tuple[str, Array]] = field(default_factory=list)
    error: ModelError | None = None
    parameters: dict[str, ParamValue] = field(default_factory=dict)


# Called (on the core's event loop) with each response, and `final` on the last one; a
# call that ends without a response of its own ends with (None, True).
Reply = Callable[[CoreResponse | None, bool], None]


@dataclass(frozen=True, slots=True)
class CallControl:
    """What the backend may do to a BLS request in flight. Thread-safe."""

    # The model cancelled it (`ResponseIterator.cancel()`): Triton's request cancellation.
    # The called model sees `is_cancelled()`, a request still queued ends CANCELLED, and
    # the responses the model goes on sending still come back.
    cancel: Callable[[], None]
    # The caller's worker is gone: the request stops and nothing more comes back.
    abandon: Callable[[], None]


class CoreCalls(Protocol):
    """The core, for a model's BLS and model-control calls. Thread-safe: the backend calls
    it from its own threads."""

    def infer(self, call: CoreCall, reply: Reply) -> CallControl:
        """Start a request; returns what cancels it."""
        ...

    def model_ready(self, name: str, version: str) -> bool:
        """Blocking."""
        ...

    def load_model(self, name: str, config_json: str, files: dict[str, bytes]) -> None:
        """Blocking; raises ValueError saying why the load failed."""
        ...

    def unload_model(self, name: str, unload_dependents: bool) -> None:
        """Blocking; raises ValueError saying why the unload failed."""
        ...

    def stopping(self) -> bool:
        """Whether the server's stop has begun: a worker that dies from then on is not
        started again (its model is about to be unloaded)."""
        ...
