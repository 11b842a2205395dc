"""The README's client examples (examples/clients/) run against the real server."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from serverproc import REPO_ROOT, ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CLIENTS = REPO_ROOT / "examples" / "clients"
HTTP_SCRIPTS = [
    "simple_http.py",
    "simple_aio.py",
    "simple_string_http.py",
    "image_classifier_http.py",
]


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=90, cwd=REPO_ROOT)


@pytest.mark.parametrize("script", HTTP_SCRIPTS)
def test_http_client_script(server: ServerProcess, script: str) -> None:
    result = run([sys.executable, str(CLIENTS / script), "--url", server.http_url])
    assert result.returncode == 0, result.stdout + result.stderr
    name = script.removesuffix(".py")
    assert f"PASS: {name}" in result.stdout


def test_client_script_fails_against_no_server() -> None:
    # The scripts report failure honestly: nothing listens on this port.
    result = run([sys.executable, str(CLIENTS / "simple_http.py"), "--url", "127.0.0.1:9"])
    assert result.returncode != 0
    assert "PASS" not in result.stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_script(server: ServerProcess) -> None:
    result = run(["bash", str(CLIENTS / "curl.sh"), "--url", server.http_url])
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "live:  HTTP 200" in out and "ready: HTTP 200" in out
    assert '"extensions":[' in out
    assert '"name":"simple","versions":["1"]' in out
    assert '"data":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]' in out
    assert '"data":[-1,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14]' in out


def test_grpc_client_script(server: ServerProcess) -> None:
    result = run([sys.executable, str(CLIENTS / "simple_grpc.py"), "--url", server.grpc_url])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS: simple_grpc" in result.stdout
