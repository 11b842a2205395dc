"""The worker's side of its link to the server, which `triton_python_backend_utils` uses.

A worker serves one model instance, and its model's code finds the link through
`current()`: the stub installs it once, before it imports `model.py`. Everything here is
thread-safe, since a model may answer from threads of its own (a decoupled model's
response sender) or from an asyncio loop (async BLS).

Calls that need an answer (a BLS request, a metric's value) are numbered; the stub's
reader thread hands each answer to the caller waiting on that number.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .channel import Channel, Message
from .shm import Arena, PeerSegments, Region
from .tensors import Array, TensorDesc, read_tensor, write_tensor

# A response as it travels: (outputs, error as (code name, message) or None, parameters
# as a JSON text).
EncodedResponse = tuple[list[TensorDesc], tuple[str, str] | None, str]


@dataclass(slots=True)
class Decoded:
    """A response read back from shared memory (copied out, so it outlives the region)."""

    outputs: dict[str, Array]
    order: list[str]
    error: tuple[str, str] | None
    parameters: str


@dataclass(slots=True)
class _Waiter:
    """One numbered call's answers: a queue for a blocking caller, or a callback."""

    answers: queue.SimpleQueue[tuple[Any, bool]] = field(default_factory=queue.SimpleQueue)
    on_answer: Callable[[Any, bool], None] | None = None


class Runtime:
    def __init__(self, channel: Channel, arena: Arena, peers: PeerSegments) -> None:
        self.channel = channel
        self.arena = arena
        self.peers = peers
        self.model_name = ""
        self.instance_name = ""
        self.decoupled = False
        self._numbers = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._lock = threading.Lock()
        # Regions of the server's arena this side has read and no longer needs.
        self._released: list[Region] = []

    # --- sending ---------------------------------------------------------------------------

    def send(self, message: Message) -> None:
        """Send a message, with any releases still owed to the server before it."""
        with self._lock:
            released, self._released = self._released, []
        if released:
            self.channel.send(("release", released), message)
        else:
            self.channel.send(message)

    def release(self, regions: list[Region]) -> None:
        with self._lock:
            self._released.extend(regions)

    def flush_releases(self) -> None:
        with self._lock:
            released, self._released = self._released, []
        if released:
            self.channel.send(("release", released))

    def encode_tensors(self, tensors: list[tuple[str, Array]]) -> list[TensorDesc]:
        return [write_tensor(self.arena, name, array) for name, array in tensors]

    def decode(self, encoded: EncodedResponse) -> Decoded:
        """Copy a response out of the server's arena and note its regions as released."""
        descs, error, parameters = encoded
        outputs = {desc[0]: read_tensor(self.peers, desc, copy=True) for desc in descs}
        self.release([desc[3] for desc in descs])
        return Decoded(outputs, [desc[0] for desc in descs], error, parameters)

    # --- numbered calls ----------------------------------------------------------------------

    def open_call(self) -> tuple[int, _Waiter]:
        number = next(self._numbers)
        waiter = _Waiter()
        with self._lock:
            self._waiters[number] = waiter
        return number, waiter

    def open_async_call(self, on_answer: Callable[[Any, bool], None]) -> int:
        """A call whose answers are handed to `on_answer(value, final)` on the reader
        thread (it must not block)."""
        number = next(self._numbers)
        with self._lock:
            self._waiters[number] = _Waiter(on_answer=on_answer)
        return number

    def answer(self, number: int, value: Any, final: bool) -> None:
        """An answer arrived (reader thread)."""
        with self._lock:
            waiter = self._waiters.get(number)
            if waiter is not None and final:
                del self._waiters[number]
        if waiter is None:
            return
        if waiter.on_answer is not None:
            waiter.on_answer(value, final)
        else:
            waiter.answers.put((value, final))

    def fail_all(self, reason: str) -> None:
        """The server went away: every caller still waiting gets an error answer."""
        with self._lock:
            waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            value = ("error", reason)
            if waiter.on_answer is not None:
                waiter.on_answer(value, True)
            else:
                waiter.answers.put((value, True))

    def request(self, name: str, *args: Any) -> Any:
        """Ask the server something and wait for its answer; raises RuntimeError with the
        server's reason if it refused."""
        number, waiter = self.open_call()
        self.send(("call", number, name, args))
        (status, value), _final = waiter.answers.get()
        if status == "error":
            raise RuntimeError(str(value))
        return value


_current: Runtime | None = None


def install(runtime: Runtime) -> None:
    global _current
    _current = runtime


def current() -> Runtime:
    if _current is None:
        raise RuntimeError(
            "triton_python_backend_utils can talk to the server only inside a model that "
            "ge-serve runs"
        )
    return _current
