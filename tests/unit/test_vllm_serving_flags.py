"""vLLM's serving flags, read into one recorded setting (`Settings.serving`), as vLLM
reads them: each switch may be given alone, or with a BOOL; the last given wins."""

from __future__ import annotations

import json

import pytest

from ge_serve.server.cli import parse_settings
from ge_serve.server.control.uvicornlogs import UvicornLogs
from ge_serve.server.http.app import HttpSettings
from ge_serve.server.startup.part_settings import http_settings


def http(*given: str) -> HttpSettings:
    return http_settings(parse_settings(["--model-repo", "m", *given]))


def test_server_load_tracking_reaches_the_front_end(capsys: pytest.CaptureFixture[str]) -> None:
    assert not http().load_tracking
    assert http("--enable-server-load-tracking", "--http-port", "9000").load_tracking
    assert http("--enable-server-load-tracking=true").load_tracking
    assert not http(
        "--enable-server-load-tracking", "--enable-server-load-tracking", "false"
    ).load_tracking
    with pytest.raises(SystemExit) as exited:
        http("--enable-server-load-tracking=maybe")
    assert exited.value.code == 2
    assert "argument --enable-server-load-tracking: expected true or false, got 'maybe'" in (
        capsys.readouterr().err
    )


def test_the_tokenizer_info_switch_is_taken() -> None:
    """Taken so that vLLM's launch lines start; GET /tokenizer_info is served without it
    (tests/component/test_openai_tokenize.py)."""
    given = ["--model-repo", "m", "--enable-tokenizer-info-endpoint", "--http-port", "9000"]
    settings = parse_settings(given)
    assert settings.serving.tokenizer_info and settings.http_port == 9000
    assert not parse_settings(
        [*given[:2], "--enable-tokenizer-info-endpoint=false"]
    ).serving.tokenizer_info


def test_uvicorn_log_flags_are_read_as_vllm_reads_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert http().uvicorn_logs == UvicornLogs("warning", True, ())
    given = http(
        "--uvicorn-log-level", "DEBUG", "--disable-access-log-for-endpoints", "/health, /metrics,,",
        "--disable-uvicorn-access-log", "--enable-server-load-tracking", "--http-port", "9000",
    )  # fmt: skip
    assert given.uvicorn_logs == UvicornLogs("debug", False, ("/health", "/metrics"))
    assert given.load_tracking and not given.uvicorn_logs.access
    assert http("--uvicorn-log-level=trace").uvicorn_logs.access
    assert not http(
        "--uvicorn-log-level=info", "--disable-uvicorn-access-log=true"
    ).uvicorn_logs.access
    assert http(
        "--disable-uvicorn-access-log", "--disable-uvicorn-access-log=false"
    ).uvicorn_logs.access_log
    # HTTP workers get them as JSON.
    assert (
        UvicornLogs.from_json(json.loads(json.dumps(given.uvicorn_logs.to_json())))
        == given.uvicorn_logs
    )
    choices = "'critical', 'error', 'warning', 'info', 'debug', 'trace'"
    for argv, message in (
        (["--uvicorn-log-level", "loud"], f"invalid choice: 'loud' (choose from {choices})"),
        (["--uvicorn-log-level"], "argument --uvicorn-log-level: expected one argument"),
        (
            ["--disable-access-log-for-endpoints"],
            "--disable-access-log-for-endpoints: expected one",
        ),
        (["--disable-uvicorn-access-log=no way"], "expected true or false, got 'no way'"),
    ):
        with pytest.raises(SystemExit) as exited:
            http(*argv)
        assert exited.value.code == 2
        assert message in capsys.readouterr().err
