"""Triton's trace file (triton mode): a JSON array with, per trace, its model record and one
record per timestamp (and per tensor at the TENSORS level), as Triton writes them.

With `log_frequency` N > 0, every N traces go to `<file>.<index>` (index from 0), and so do
the last ones when `count` runs out; what is left at shutdown, and everything when N is 0
and no count runs out, goes to `<file>`. Writes are small and run
on the event loop, as requests end.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import orjson

from .tracing import Trace

log = logging.getLogger(__name__)


def records(trace: Trace) -> list[dict[str, Any]]:
    head: dict[str, Any] = {
        "id": trace.id,
        "model_name": trace.model_name,
        "model_version": trace.model_version,
    }
    if trace.request_id:
        head["request_id"] = trace.request_id
    if trace.parent_id:
        head["parent_id"] = trace.parent_id
    out = [head]
    if "TIMESTAMPS" in trace.level:
        out += [
            {"id": trace.id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in trace.marks
        ]
    for activity, name, datatype, shape, data in trace.tensors:
        out.append(
            {
                "id": trace.id,
                "activity": activity,
                "tensor": {
                    "name": name,
                    "data": data,
                    "shape": ",".join(str(d) for d in shape),
                    "dtype": datatype,
                },
            }
        )
    return out


class TraceFileSink:
    def __init__(self, control: Any) -> None:
        # The settings are read as each trace ends, so run-time changes apply.
        self._control = control
        self._pending: list[dict[str, Any]] = []
        self._in_pending = 0
        self._index = 0
        self._open = 0

    def started(self, trace: Trace) -> None:
        self._open += 1

    def finished(self, trace: Trace) -> None:
        self._open -= 1
        settings = self._control.settings_for(trace.model_name)
        if not settings.file:
            # Nowhere to write it (the control samples nothing then; a trace begun
            # before cannot be kept either).
            return
        self._pending += records(trace)
        self._in_pending += 1
        frequency = settings.log_frequency
        # As Triton: every `log_frequency` traces, and when `count` has run out and the
        # last trace has ended, go to the next indexed file.
        if (frequency and self._in_pending >= frequency) or (
            self._open == 0 and self._control.exhausted(trace.model_name)
        ):
            self._write(Path(f"{settings.file}.{self._index}"))
            self._index += 1

    def close(self) -> None:
        file = self._control.settings_for("").file
        if self._pending and file:
            self._write(Path(file))

    def _write(self, path: Path) -> None:
        try:
            path.write_bytes(orjson.dumps(self._pending))
        except OSError as exc:
            log.error("failed creating trace file '%s': %s", path, exc.strerror or exc)
        self._pending, self._in_pending = [], 0
