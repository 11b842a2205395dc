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

from ge_serve.link.messages import Message, Region
from ge_serve.link.tensors import ArenaTensor, Array, read_tensor, regions_of, write_tensor
from ge_serve.link.thread import ThreadLink

from ..messages import Call, Encoded, ErrorText, Reply
from .pb_types import TritonModelException


@dataclass(slots=True)
class Decoded:
    """A response read back from shared memory (copied out, so it outlives the region)."""

    outputs: dict[str, Array]
    order: list[str]
    error: ErrorText | None
    parameters: str


@dataclass(frozen=True, slots=True)
class Gone:
    """The answer every waiting call gets when the server went away."""

    reason: str


@dataclass(slots=True)
class _Waiter:
    """One numbered call's answers: a queue for a blocking caller, or a callback."""

    answers: queue.SimpleQueue[tuple[Any, bool]] = field(default_factory=queue.SimpleQueue)
    on_answer: Callable[[Any, bool], None] | None = None


class Runtime:
    def __init__(self, link: ThreadLink) -> None:
        self.link = link
        self.model_name = ""
        self.instance_name = ""
        # The folder of the model's file, `<model>/<version>` (pb_utils.get_model_dir()).
        self.model_dir = ""
        self.decoupled = False
        # As Triton's stub: BLS once initialize returned, until finalize starts.
        self.bls_allowed = False
        self._numbers = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._lock = threading.Lock()

    # --- sending ---------------------------------------------------------------------------

    def send(self, message: Message) -> None:
        """Send a message, with any releases still owed to the server before it."""
        self.link.send(message)

    def release(self, regions: list[Region]) -> None:
        """Regions of the server's arena, read: owed back (ThreadLink.release)."""
        self.link.release(regions)

    def encode_tensors(self, tensors: list[tuple[str, Array]]) -> list[ArenaTensor]:
        regions: list[Region] = []
        return [write_tensor(self.link.arena, name, array, regions) for name, array in tensors]

    def read(self, tensor: ArenaTensor) -> Array:
        """An input tensor, a view of the server's memory (freed by the server itself)."""
        return read_tensor(self.link.peers, tensor, copy=False)

    def decode(self, encoded: Encoded) -> Decoded:
        """Copy a response out of the server's arena and note its regions as released."""
        peers = self.link.peers
        outputs = {t.name: read_tensor(peers, t, copy=True) for t in encoded.outputs}
        self.release(regions_of(encoded.outputs))
        order = [t.name for t in encoded.outputs]
        return Decoded(outputs, order, encoded.error, encoded.parameters)

    def check_bls(self) -> None:
        """Refuse a BLS request outside execute, with Triton's words (infer_request.cc)."""
        if not self.bls_allowed:
            raise TritonModelException("BLS is only supported during the 'execute' function.")

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
        """The server went away: every caller still waiting gets `Gone`."""
        with self._lock:
            waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            if waiter.on_answer is not None:
                waiter.on_answer(Gone(reason), True)
            else:
                waiter.answers.put((Gone(reason), True))

    def request(self, name: str, *args: Any) -> Any:
        """Ask the server something and wait for its answer; raises RuntimeError with the
        server's reason if it refused."""
        number, waiter = self.open_call()
        self.send(Call(number, name, list(args)))
        answer, _final = waiter.answers.get()
        if isinstance(answer, Gone):
            raise RuntimeError(answer.reason)
        assert isinstance(answer, Reply)
        if not answer.ok:
            raise RuntimeError(str(answer.value))
        return answer.value


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
