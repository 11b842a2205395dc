"""Log lines as Triton writes them (common src/logging.cc): the preamble of each format,
the message as a JSON string unless TRITON_SERVER_ESCAPE_LOG_MESSAGES=0, and info lines
on stdout, warnings and errors on stderr."""

from __future__ import annotations

import calendar
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ge_serve.server.control.logformat import TritonFormatter, escaping
from ge_serve.server.control.logsettings import LogControl, LogSettings

# 2026-12-06 08:27:59.929123 UTC
CREATED = calendar.timegm((2026, 12, 6, 8, 27, 59, 0, 0, 0)) + 0.929123


def record(level: int, message: str, *args: object) -> logging.LogRecord:
    made = logging.LogRecord("ge_serve.x", level, "/src/ge_serve/core.py", 123, message, args, None)
    made.created = CREATED
    made.process = 4242
    return made


def test_the_default_line_is_tritons() -> None:
    line = TritonFormatter().format(record(logging.INFO, "model %s loaded", '"simple"'))
    assert line == 'I1206 08:27:59.929123 4242 core.py:123] "model \\"simple\\" loaded"'


def test_the_iso8601_line_is_tritons() -> None:
    line = TritonFormatter(iso8601=True).format(record(logging.WARNING, "slow"))
    assert line == '2026-12-06T08:27:59Z W 4242 core.py:123] "slow"'


@pytest.mark.parametrize(
    ("level", "letter"),
    [(logging.DEBUG, "I"), (logging.INFO, "I"), (logging.ERROR, "E"), (logging.CRITICAL, "E")],
)
def test_verbose_lines_are_info_lines(level: int, letter: str) -> None:
    assert TritonFormatter().format(record(level, "x")).startswith(f"{letter}1206 ")


def test_a_message_cannot_forge_a_line_unless_escaping_is_off() -> None:
    forged = 'x\nI0205 18:34:18.707423 1 file.cc:123] "THIS ENTRY WAS INJECTED"\x1b[31m'
    escaped = TritonFormatter().format(record(logging.INFO, forged))
    assert "\n" not in escaped and "\x1b" not in escaped
    assert escaped.endswith(
        '] "x\\nI0205 18:34:18.707423 1 file.cc:123] ' + '\\"THIS ENTRY WAS INJECTED\\"\\u001b[31m"'
    )
    raw = TritonFormatter(escape=False).format(record(logging.INFO, forged))
    assert raw.endswith("] " + forged)


def test_a_traceback_is_part_of_the_escaped_message() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        failed = record(logging.ERROR, "failed")
        failed.exc_info = sys.exc_info()
    line = TritonFormatter().format(failed)
    assert "\n" not in line and line.startswith("E1206 ")
    assert '] "failed\\nTraceback' in line and "ValueError: boom" in line


def test_a_table_follows_its_heading_unescaped() -> None:
    table = record(logging.INFO, "models:")
    table.table = 'Model | "Status"\nsimple | READY'
    line = TritonFormatter().format(table)
    assert line.endswith('] "models:"\nModel | "Status"\nsimple | READY')


def test_escaping_follows_the_environment_variable() -> None:
    assert escaping({}) and escaping({"TRITON_SERVER_ESCAPE_LOG_MESSAGES": "1"})
    assert not escaping({"TRITON_SERVER_ESCAPE_LOG_MESSAGES": "0"})


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    logger = logging.getLogger()
    level, handlers = logger.level, list(logger.handlers)
    yield logger
    for handler in logger.handlers[:]:
        if handler not in handlers:
            logger.removeHandler(handler)
            handler.close()
    logger.setLevel(level)


def test_info_goes_to_stdout_and_warnings_to_stderr(
    root: logging.Logger, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "0")
    LogControl(LogSettings(log_verbose_level=1)).install()
    logger = logging.getLogger("ge_serve.test")
    logger.info("an info line")
    logger.debug("a verbose line")
    logger.warning("a warning line")
    logger.error("an error line")
    out, err = capsys.readouterr()
    pid = os.getpid()
    assert [line.split("] ", 1)[1] for line in out.splitlines()] == [
        "an info line",
        "a verbose line",
    ]
    assert [line.split("] ", 1)[1] for line in err.splitlines()] == [
        "a warning line",
        "an error line",
    ]
    assert f" {pid} test_log_format.py:" in out and err.startswith("W")


def test_a_log_file_gets_every_line(
    root: logging.Logger, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "server.log"
    LogControl(LogSettings(log_file=str(path), log_format="ISO8601"), escape=True).install()
    logger = logging.getLogger("ge_serve.test")
    logger.info("an info line")
    logger.warning("a warning line")
    lines = path.read_text().splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ['"an info line"', '"a warning line"']
    assert lines[1].split(" ")[1] == "W"
    assert capsys.readouterr() == ("", "")
