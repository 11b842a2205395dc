"""The scheduler interface the core talks to: one scheduler per loaded model version."""

from __future__ import annotations

from typing import Protocol

from .work import Array, WorkItem


class Scheduler(Protocol):
    async def submit(self, item: WorkItem) -> dict[str, Array]:
        """Queue one request and return its outputs once its batch has run."""
        ...

    @property
    def pending(self) -> int:
        """Requests accepted and not yet executing, where the scheduler can tell (Triton's
        nv_inference_pending_request_count); else accepted and not yet answered."""
        ...

    async def close(self, drain_timeout_s: float) -> None:
        """Refuse new work, let in-flight work finish within the timeout, free the slots."""
        ...
