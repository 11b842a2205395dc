"""A front end's own trace timestamps for one request (Triton's HTTP_RECV/SEND and
GRPC_WAITREAD/SEND, and INFER_RESPONSE_COMPLETE), kept until the core's trace is there.

Apart from tracing.py so that the request type can name it without the trace's machinery
(tracing.py reads the request type's datatypes).
"""

from __future__ import annotations

import time
from typing import Protocol


class HeldTrace(Protocol):
    """What a front end's marks need of the core's trace (tracing.Trace)."""

    marks: list[tuple[str, int]]
    holds: int

    def release(self) -> None: ...


class FrontTrace:
    """A front end's timestamps for one request, made only while tracing is active. The
    core hands it the request's trace when it samples the request (`attach`); the front
    end marks on, and `release` adds its marks and lets the trace be written.

    Where they go in the trace follows Triton's file: HTTP's receive marks before
    REQUEST_START (Triton records them as it starts the trace), gRPC's all at release
    (Triton keeps them on the call's state until then); the rest after REQUEST_END."""

    __slots__ = ("_deferred", "marks", "trace")

    def __init__(self, first: str, deferred: bool = False, ns: int | None = None) -> None:
        self.marks: list[tuple[str, int]] = [(first, time.monotonic_ns() if ns is None else ns)]
        self.trace: HeldTrace | None = None
        self._deferred = deferred

    def mark(self, name: str) -> None:
        self.marks.append((name, time.monotonic_ns()))

    def attach(self, trace: HeldTrace) -> None:
        self.trace = trace
        trace.holds += 1
        if not self._deferred:
            trace.marks[:0] = self.marks
            self.marks = []

    def release(self) -> None:
        """Once, when the answer has been sent (or cannot be): later calls do nothing."""
        trace, self.trace = self.trace, None
        if trace is not None:
            trace.marks += self.marks
            trace.release()
