"""What the clients record: each answer's outcome, and one protocol's counts and latencies."""

from __future__ import annotations

import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

EXPECTED = "expected"
SERVER_ERROR = "server_error"
UNEXPECTED = "unexpected"
GRPC_EXPECTED: Final = frozenset({"INVALID_ARGUMENT", "NOT_FOUND"})
GRPC_SERVER_ERROR: Final = frozenset({"INTERNAL", "UNKNOWN", "DATA_LOSS"})


def classify_http(status: int) -> str:
    if 400 <= status < 500:
        return EXPECTED
    if status >= 500:
        return SERVER_ERROR
    return UNEXPECTED


def classify_grpc(code: str) -> str:
    if code in GRPC_EXPECTED:
        return EXPECTED
    if code in GRPC_SERVER_ERROR:
        return SERVER_ERROR
    return UNEXPECTED


MAX_FAILURE_SAMPLES: Final = 20


@dataclass(slots=True)
class Tally:
    """One protocol's counts, as the clients record them."""

    valid_ok: int = 0
    valid_failed: int = 0
    failed_during_reload: int = 0
    invalid: Counter[str] = field(default_factory=Counter)  # EXPECTED / SERVER_ERROR / ...
    # Each valid request that succeeded: when it finished (s into the run) and its latency.
    finished_s: array.array[float] = field(default_factory=lambda: array.array("d"))
    latencies_s: array.array[float] = field(default_factory=lambda: array.array("d"))
    clients: array.array[int] = field(default_factory=lambda: array.array("i"))
    failures: list[str] = field(default_factory=list)
    # case -> answer ("400", "INVALID_ARGUMENT", "transport: ReadError") -> count
    cases: dict[str, Counter[str]] = field(default_factory=dict)

    def ok(self, at_s: float, latency_s: float, client: int = 0) -> None:
        self.valid_ok += 1
        self.finished_s.append(at_s)
        self.latencies_s.append(latency_s)
        self.clients.append(client)

    def failed(self, at_s: float, why: str, during_reload: bool) -> None:
        self.valid_failed += 1
        self.failed_during_reload += during_reload
        if len(self.failures) < MAX_FAILURE_SAMPLES:
            when = " (during a reload)" if during_reload else ""
            self.failures.append(f"t={at_s:.1f}s{when}: {why}")

    def answered(self, case: str, answer: str, outcome: str) -> None:
        self.invalid[outcome] += 1
        self.cases.setdefault(case, Counter())[answer] += 1
