"""A loaded version's own health reports (ModelEvents), applied to its lifecycle state.

A backend whose executors can fail and recover on their own (a Python model's worker
dies and is restarted) reports it from its threads; the report is applied on the event
loop, where the lifecycle's state lives. While unavailable, the version is UNAVAILABLE
with the backend's reason (the repository index shows it, and requests are refused with
it); once recovered it is READY again. Only READY, or the state a report set, is changed:
a version being unloaded or reloaded keeps what the lifecycle says.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any, Protocol

from ..errors import ErrorCode, ServerError, no_available_versions
from ..inference.reports import ModelState


class _Entry(Protocol):
    """The lifecycle's record of one version (VersionRecord)."""

    version: int
    state: ModelState
    reason: str
    model: Any


class VersionHealth:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._entry: _Entry | None = None
        # The reason this object set, so that recovering clears only its own state.
        self._reason: str | None = None

    def bind(self, entry: _Entry) -> None:
        """On the loop, once the version is installed: reports apply to `entry` from now
        on (one made before, while the version still loaded, has nothing to change)."""
        self._loop = asyncio.get_running_loop()
        self._entry = entry

    # ModelEvents, from any thread.

    def unavailable(self, reason: str) -> None:
        self._report(reason)

    def available(self) -> None:
        self._report(None)

    def _report(self, reason: str | None) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
            loop.call_soon_threadsafe(self._apply, reason)

    def _apply(self, reason: str | None) -> None:
        entry = self._entry
        if entry is None:
            return
        own = self._reason is not None and (
            entry.state is ModelState.UNAVAILABLE and entry.reason == self._reason
        )
        if reason is not None:
            if entry.state is ModelState.READY or own:
                entry.state = ModelState.UNAVAILABLE
                entry.reason = reason
                self._reason = reason
        else:
            if own:
                entry.state = ModelState.READY
                entry.reason = ""
            self._reason = None


def not_ready(name: str, versions: Iterable[_Entry]) -> ServerError:
    """Why a model has no version to serve: a loaded one down for now (its reason), or
    Triton's "no available versions"."""
    down = [v for v in versions if v.model is not None and v.reason]
    if down and all(v.state is ModelState.UNAVAILABLE for v in down):
        reason = max(down, key=lambda v: v.version).reason
        return ServerError(ErrorCode.UNAVAILABLE, f"model '{name}' is unavailable: {reason}")
    return no_available_versions(name)
