"""Triton's logging extension: log settings that can change while the server runs.

One handler on the root logger carries a filter and a formatter that read these settings,
so a change applies to every logger at once.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from .errors import ErrorCode, ServerError

log = logging.getLogger(__name__)

FORMATS = ("default", "ISO8601")
_LINE = "%(asctime)s %(levelname).1s %(name)s] %(message)s"


@dataclass(frozen=True, slots=True)
class LogSettings:
    log_file: str = ""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_verbose_level: int = 0
    log_format: str = "default"


class _SettingsFilter(logging.Filter):
    def __init__(self, control: LogControl) -> None:
        super().__init__()
        self._control = control

    def filter(self, record: logging.LogRecord) -> bool:
        current = self._control.current
        level = record.levelno
        if level >= logging.ERROR:
            return current.log_error
        if level >= logging.WARNING:
            return current.log_warning
        if level >= logging.INFO:
            return current.log_info
        return current.log_verbose_level > 0


class LogControl:
    """The current log settings, and the root-logger handler they steer once installed."""

    def __init__(self, initial: LogSettings | None = None) -> None:
        self.current = initial or LogSettings()
        self._handler: logging.Handler | None = None

    def install(self, stream: Any = None) -> None:
        """Log to `stream` (stderr) through one handler that follows these settings."""
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.addFilter(_SettingsFilter(self))
        root = logging.getLogger()
        if self._handler is not None:
            root.removeHandler(self._handler)
        root.addHandler(handler)
        self._handler = handler
        self._apply()

    def settings(self) -> dict[str, Any]:
        return asdict(self.current)

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Validate every change first, so a bad request changes nothing."""
        values: dict[str, Any] = {}
        for key, value in changes.items():
            values[key] = _check(key, value, self.current)
        self.current = replace(self.current, **values)
        self._apply()
        log.info("log settings changed: %s", values)
        log.debug("log settings now: %s", self.settings())
        return self.settings()

    def _apply(self) -> None:
        if self._handler is None:
            return
        iso = self.current.log_format == "ISO8601"
        formatter = logging.Formatter(_LINE, "%Y-%m-%dT%H:%M:%SZ" if iso else None)
        if iso:
            formatter.converter = time.gmtime
        self._handler.setFormatter(formatter)
        # The filter decides what shows; the root level only keeps debug records from
        # being built when nothing verbose is wanted.
        verbose = self.current.log_verbose_level > 0
        logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)


def _check(key: str, value: Any, current: LogSettings) -> Any:
    if key == "log_file":
        if value != current.log_file:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                "log file location can not be updated through network protocol: "
                "updating log file was deprecated and no longer supported",
            )
        return value
    if key in ("log_info", "log_warning", "log_error"):
        if not isinstance(value, bool):
            raise ServerError(ErrorCode.INVALID_ARG, f"expect boolean for '{key}' setting")
        return value
    if key == "log_verbose_level":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ServerError(
                ErrorCode.INVALID_ARG, "expect unsigned integer for 'log_verbose_level' setting"
            )
        return value
    if key == "log_format":
        if value not in FORMATS:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"invalid 'log_format' setting '{value}': expected one of "
                + ", ".join(f"'{f}'" for f in FORMATS),
            )
        return value
    raise ServerError(
        ErrorCode.INVALID_ARG,
        f"unknown log setting '{key}': expected one of "
        + ", ".join(f"'{name}'" for name in LogSettings.__dataclass_fields__),
    )
