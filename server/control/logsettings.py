"""Triton's logging extension: log settings that can change while the server runs.

One handler on the root logger carries a filter and a formatter that read these settings,
so a change applies to every logger at once. The lines are Triton's (logformat.py).
"""

from __future__ import annotations

import logging
import os
from typing import Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Field, WrapValidator

from ..errors import ErrorCode, ServerError
from .json_documents import Document, validate, worded
from .logformat import SplitStreamHandler, TritonFormatter, escaping

log = logging.getLogger(__name__)

LogFormat = Literal["default", "ISO8601"]
FORMATS: tuple[str, ...] = get_args(LogFormat)
# The gRPC extension reports the level as a uint32.
_MAX_VERBOSE_LEVEL = 2**32 - 1


def _expect_boolean(key: str) -> WrapValidator:
    return worded(f"expect boolean for '{key}' setting")


def _bad_format(value: Any) -> str:
    return f"invalid 'log_format' setting '{value}': expected one of " + ", ".join(
        f"'{f}'" for f in FORMATS
    )


class LogSettings(Document):
    """Triton's log settings. An update names the settings it changes; the others keep
    their values. (Also the schema of the `/v2/logging` body in the OpenAPI document.)"""

    model_config = ConfigDict(extra="forbid")
    unknown_field = "unknown log setting '{field}': expected one of {fields}"

    log_file: str = ""
    log_info: Annotated[bool, _expect_boolean("log_info")] = True
    log_warning: Annotated[bool, _expect_boolean("log_warning")] = True
    log_error: Annotated[bool, _expect_boolean("log_error")] = True
    log_verbose_level: Annotated[
        int,
        Field(ge=0, le=_MAX_VERBOSE_LEVEL),
        worded("expect unsigned integer for 'log_verbose_level' setting"),
    ] = 0
    log_format: Annotated[LogFormat, worded(_bad_format)] = "default"


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

    def __init__(self, initial: LogSettings | None = None, escape: bool | None = None) -> None:
        self.current = initial or LogSettings()
        # Read once, as Triton reads TRITON_SERVER_ESCAPE_LOG_MESSAGES when it starts.
        self.escape = escaping() if escape is None else escape
        self._handler: logging.Handler | None = None

    def install(self, stream: Any = None) -> None:
        """Log to `stream`, or append to `log_file` when one is set, or else write info
        and verbose lines to stdout and warnings and errors to stderr, as Triton does,
        through one handler that follows these settings."""
        handler = self._new_handler(stream)
        root = logging.getLogger()
        if self._handler is not None:
            root.removeHandler(self._handler)
        root.addHandler(handler)
        self._handler = handler
        self._apply()

    def attach(self, logger: logging.Logger) -> None:
        """A handler that follows these settings on `logger` alone, which then stops
        propagating: an HTTP worker's uvicorn lines (vLLM's --uvicorn-log-level and access
        log), in the server's format and place, under its settings as they were when the
        worker started (the logging extension's later changes reach the server only)."""
        handler = self._new_handler(None)
        iso = self.current.log_format == "ISO8601"
        handler.setFormatter(TritonFormatter(iso8601=iso, escape=self.escape))
        logger.addHandler(handler)
        logger.propagate = False

    def _new_handler(self, stream: Any) -> logging.Handler:
        handler: logging.Handler
        if stream is not None:
            handler = logging.StreamHandler(stream)
        elif self.current.log_file:
            handler = logging.FileHandler(self.current.log_file, encoding="utf-8")
        else:
            handler = SplitStreamHandler()
        handler.addFilter(_SettingsFilter(self))
        return handler

    def settings(self) -> dict[str, Any]:
        return self.current.model_dump()

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Check every change first, so a bad request changes nothing."""
        # Triton refuses any log_file in an update, even the current one, as unsupported:
        # HTTP 501, gRPC UNIMPLEMENTED. (A null is refused below, as for every setting.)
        if changes.get("log_file") is not None:
            raise ServerError(
                ErrorCode.UNSUPPORTED,
                "log file location can not be updated through network protocol",
            )
        self.current = validate(LogSettings, {**self.settings(), **changes}, "log settings")
        self._apply()
        log.info("log settings changed: %s", changes)
        log.debug("log settings now: %s", self.settings())
        return self.settings()

    def _apply(self) -> None:
        if self._handler is None:
            return
        iso = self.current.log_format == "ISO8601"
        self._handler.setFormatter(TritonFormatter(iso8601=iso, escape=self.escape))
        # The filter decides what shows; the root level only keeps debug records from
        # being built when nothing verbose is wanted.
        verbose = self.current.log_verbose_level > 0
        logging.getLogger().setLevel(logging.DEBUG if verbose else logging.INFO)
        # grpc's Python layer logs at DEBUG on every call: --log-verbose is for our own
        # lines, and gRPC's debug output stays behind gRPC's own switch.
        grpc_debug = os.environ.get("GRPC_VERBOSITY", "").lower() == "debug"
        logging.getLogger("grpc").setLevel(
            logging.DEBUG if verbose and grpc_debug else logging.INFO
        )
