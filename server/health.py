"""A loaded version's own health reports (ModelEvents), applied to its lifecycle state.

A backend whose executors can fail and recover on their own (a Python model's worker
dies and is restarted) reports it from its threads; the report is applied on the event
loop, where the lifecycle's state lives. While unavailable, the version is UNAVAILABLE
with the backend's reason (the repository index shows it, and requests are refused as
not ready); once recovered it is READY again. A version being retired ignores reports.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol


class _Entry(Protocol):
    """The lifecycle's record of one version (VersionRecord)."""

    state: Any
    reason: str


class VersionHealth:
    """`ready` and `unavailable` are the lifecycle's two states this switches between."""

    def __init__(self, loop: asyncio.AbstractEventLoop, ready: Any, unavailable: Any) -> None:
        self._loop = loop
        self._ready = ready
        self._unavailable = unavailable
        self._entry: _Entry | None = None
        # The reason this object set, so that recovering clears only its own state.
        self._reason: str | None = None

    def bind(self, entry: _Entry) -> None:
        """The version record the reports apply to (on the loop, once it is installed)."""
        self._entry = entry

    # ModelEvents, from any thread.

    def unavailable(self, reason: str) -> None:
        self._report(reason)

    def available(self) -> None:
        self._report(None)

    def _report(self, reason: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
            self._loop.call_soon_threadsafe(self._apply, reason)

    def _apply(self, reason: str | None) -> None:
        entry = self._entry
        if entry is None:
            return
        # Only a state this object set, or READY, is its to change: a version being
        # unloaded (or marked by a reload) keeps what the lifecycle says.
        own = self._reason is not None and (
            entry.state is self._unavailable and entry.reason == self._reason
        )
        if reason is not None:
            if entry.state is self._ready or own:
                entry.state = self._unavailable
                entry.reason = reason
                self._reason = reason
        else:
            if own:
                entry.state = self._ready
                entry.reason = ""
            self._reason = None
