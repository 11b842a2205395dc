"""vLLM's flags of how its HTTP server serves (startup/vllmserve.py), as the command line
reads them and the front end is given them."""

from __future__ import annotations

from pathlib import Path

import pytest
from certs import make_tls_files
from cryptography.hazmat.primitives import serialization

from ge_serve.server.cli import parse_settings
from ge_serve.server.control.requestlog import RequestLogging
from ge_serve.server.control.tls import HttpTls
from ge_serve.server.http.app import HttpSettings
from ge_serve.server.startup.part_settings import http_settings


def http(*given: str) -> HttpSettings:
    return http_settings(parse_settings(["--model-repo", "m", *given]))


def refused(capsys: pytest.CaptureFixture[str], *given: str) -> str:
    with pytest.raises(SystemExit) as exited:
        parse_settings(["--model-repo", "m", *given])
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_sse_keep_alive_interval(capsys: pytest.CaptureFixture[str]) -> None:
    assert http().tools.sse_keep_alive == 0
    assert http("--sse-keep-alive-interval", "15").tools.sse_keep_alive == 15
    assert (
        http("--sse-keep-alive-interval=5", "--sse-keep-alive-interval=0").tools.sse_keep_alive == 0
    )
    assert (
        "Error: --sse-keep-alive-interval must be a non-negative integer (0 disables "
        "keep-alive comments)." in refused(capsys, "--sse-keep-alive-interval", "-1")
    )
    assert "argument --sse-keep-alive-interval: invalid int value: '1.5'" in refused(
        capsys, "--sse-keep-alive-interval", "1.5"
    )
    assert "argument --sse-keep-alive-interval: expected one argument" in refused(
        capsys, "--sse-keep-alive-interval"
    )


def test_root_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert http().root_path == ""
    assert http("--root-path", "/proxy").root_path == "/proxy"
    # A trailing slash would keep every prefixed path from its route: dropped.
    assert http("--root-path=/a/b/").root_path == "/a/b"
    for empty in (("--root-path", ""), ("--root-path",), ("--root-path", "/")):
        assert http(*empty).root_path == ""
    assert "--root-path must start with '/', got 'proxy'" in refused(capsys, "--root-path", "proxy")


def test_disable_fastapi_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert http().openapi
    assert not http("--disable-fastapi-docs").openapi
    assert not http("--disable-fastapi-docs=true", "--root-path", "/p").openapi
    assert http("--disable-fastapi-docs", "false").openapi
    assert "argument --disable-fastapi-docs: expected true or false" in refused(
        capsys, "--disable-fastapi-docs=maybe"
    )


def test_request_log_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert http().request_log == RequestLogging(False, None, False, True)
    given = http(
        "--enable-log-requests", "--enable-log-outputs", "--max-log-len", "100",
        "--enable-log-deltas=false",
    )  # fmt: skip
    assert given.request_log == RequestLogging(True, 100, True, False)
    # vLLM's spelling of a switch off (its one way to turn the deltas off).
    off = http("--enable-log-requests", "--enable-log-outputs", "--no-enable-log-deltas")
    assert off.request_log == RequestLogging(True, None, True, False)
    assert not http("--enable-log-requests", "--no-enable-log-requests").request_log.requests
    assert "Error: --enable-log-outputs requires --enable-log-requests" in refused(
        capsys, "--enable-log-outputs"
    )
    assert "argument --max-log-len: must be 0 or more, got -1" in refused(
        capsys, "--max-log-len", "-1"
    )
    assert "argument --max-log-len: invalid int value: 'x'" in refused(capsys, "--max-log-len=x")


def test_vllms_host_and_port_are_the_http_endpoints() -> None:
    settings = parse_settings(["--model-repo", "m", "--host", "127.0.0.1", "--port", "9123"])
    assert (settings.http_address, settings.http_port) == ("127.0.0.1", 9123)


def test_https_flags_are_checked_as_the_command_line_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = make_tls_files(tmp_path)
    cert, key, ca = str(files.cert), str(files.key), str(files.ca)
    assert not http().tls.on and http().tls.uvicorn_options() == {}
    given = http("--ssl-certfile", cert, "--ssl-keyfile", key).tls
    assert given == HttpTls(key, cert) and given.uvicorn_options()["ssl_cert_reqs"] == 0
    mutual = http("--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-ca-certs", ca,
                  "--ssl-cert-reqs", "2").tls  # fmt: skip
    assert (mutual.ca_certs, mutual.cert_reqs) == (ca, 2)
    assert "--ssl-certfile is needed for HTTPS" in refused(capsys, "--ssl-keyfile", key)
    assert "give --ssl-ca-certs" in refused(
        capsys, "--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-cert-reqs", "1"
    )
    assert "invalid choice: '3'" in refused(
        capsys, "--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-cert-reqs", "3"
    )
    # Each problem named by its flag: a key that is not the certificate's, a file that
    # does not open, a key behind a pass phrase, ciphers that name none.
    err = refused(capsys, "--ssl-certfile", cert, "--ssl-keyfile", ca)
    assert "--ssl-certfile and --ssl-keyfile: no certificate and its private key load" in err
    missing = str(tmp_path / "missing.pem")
    assert f"--ssl-keyfile: no such file: {missing}" in refused(
        capsys, "--ssl-certfile", cert, "--ssl-keyfile", missing
    )
    locked = tmp_path / "locked.key"
    key_object = serialization.load_pem_private_key(files.key.read_bytes(), None)
    locked.write_bytes(
        key_object.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"phrase"),
        )
    )
    assert "--ssl-keyfile: the key is encrypted" in refused(
        capsys, "--ssl-certfile", cert, "--ssl-keyfile", str(locked)
    )
    assert "--ssl-ciphers: no cipher matches 'NOPE'" in refused(
        capsys, "--ssl-certfile", cert, "--ssl-keyfile", key, "--ssl-ciphers", "NOPE"
    )
