"""Log lines as Triton writes them (common repo src/logging.cc), and where they go.

`default`: `I1206 08:27:59.929123 4242 core.py:123] "message"`: the level letter, the
UTC month and day, the time to the microsecond, the pid, and the file and line of the
call. `ISO8601`: `2026-12-06T08:27:59Z I 4242 core.py:123] "message"`. Verbose lines
are `I` lines, as in Triton. The message is written as a JSON string (quoted, newlines
and control characters escaped), so that no message can forge a line of its own, unless
TRITON_SERVER_ESCAPE_LOG_MESSAGES=0. Without a log file, `I` lines go to stdout and `W`
and `E` lines to stderr.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

ESCAPE_VARIABLE = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"


def escaping(environ: Mapping[str, str] = os.environ) -> bool:
    """Triton escapes unless the variable is exactly "0"."""
    return environ.get(ESCAPE_VARIABLE) != "0"


def _letter(levelno: int) -> str:
    if levelno >= logging.ERROR:
        return "E"
    return "W" if levelno >= logging.WARNING else "I"


class TritonFormatter(logging.Formatter):
    def __init__(self, iso8601: bool = False, escape: bool = True) -> None:
        super().__init__()
        self.iso8601 = iso8601
        self.escape = escape

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        if record.stack_info:
            message = f"{message}\n{self.formatStack(record.stack_info)}"
        if self.escape:
            message = json.dumps(message, ensure_ascii=False)
        # A table the server made (`extra={"table": ...}`) follows on lines of its own,
        # unescaped, as Triton prints its tables (LOG_TABLE_INFO).
        table = getattr(record, "table", None)
        if isinstance(table, str):
            message = f"{message}\n{table}"
        seconds = int(record.created)
        t = time.gmtime(seconds)
        where = f"{record.process} {record.filename}:{record.lineno}]"
        level = _letter(record.levelno)
        if self.iso8601:
            stamp = (
                f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}"
                f"T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}Z"
            )
            return f"{stamp} {level} {where} {message}"
        # Rounded: `created` is a float, whose fraction is a hair off the microsecond.
        micros = min(round((record.created - seconds) * 1_000_000), 999_999)
        return (
            f"{level}{t.tm_mon:02d}{t.tm_mday:02d} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.{micros:06d} {where} {message}"
        )


class SplitStreamHandler(logging.Handler):
    """`I` lines to one stream (stdout), `W` and `E` lines to another (stderr), as
    Triton's Logger::Log does without a log file. The streams are looked up at each
    line, so a test's capture of sys.stdout and sys.stderr sees them."""

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        super().__init__()
        self._out = out
        self._err = err

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
            if record.levelno >= logging.WARNING:
                stream = self._err or sys.stderr
            else:
                stream = self._out or sys.stdout
            stream.write(line + "\n")
            stream.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)


def worker_logging(config: Mapping[str, Any]) -> None:
    """A front-end worker process's warnings and errors, in the server's format, to
    stderr (Triton's stream for them); `config["log_format"]` names the format."""
    handler = logging.StreamHandler(sys.stderr)
    iso = config.get("log_format") == "ISO8601"
    handler.setFormatter(TritonFormatter(iso8601=iso, escape=escaping()))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
