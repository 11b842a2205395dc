"""What a user sees of the endpoints' flags as the server starts, as in Triton: a port
matters only for an endpoint that is on (qa L0_socket), two endpoints on one address and
port are refused before any model loads (CheckPortCollision), and --grpc-use-ssl and
--grpc-use-ssl-mutual are read in order, the last one given deciding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from certs import make_tls_files
from polling import poll
from serverproc import EXAMPLE_MODELS, REPO_ROOT, ServerProcess, free_ports, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ge_serve.server.cli", "--model-repo", str(EXAMPLE_MODELS), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )


def grpc_live(server: ServerProcess, ssl: bool, ca: Path | None = None) -> bool:
    """Whether a gRPC call, in TLS or in the clear, is answered."""
    client = grpcclient.InferenceServerClient(
        server.grpc_url, ssl=ssl, root_certificates=str(ca) if ca else None
    )
    try:
        return bool(client.is_server_live(client_timeout=5))
    except Exception:
        return False
    finally:
        client.close()


@pytest.mark.parametrize("endpoint", ["http", "grpc", "metrics"])
def test_only_an_endpoint_that_is_on_needs_a_port_in_range(endpoint: str) -> None:
    flag = f"--{endpoint}-port"
    result = run_cli(flag, "-47")
    assert result.returncode == 2
    assert f"{flag}: a port is 0 to 65535, got -47" in result.stderr
    assert "successfully loaded" not in result.stdout + result.stderr

    # Off, its port is never used: the server starts (qa L0_socket).
    extra = [flag, "-47", f"--allow-{endpoint}", "0"]
    with running_server(extra=extra, wait_ready=endpoint != "http") as server:
        if endpoint == "http":  # else it was waited ready on HTTP
            poll(lambda: grpc_live(server, ssl=False), 60, "gRPC to answer", interval=0.2)
        assert server.alive()


def test_two_endpoints_on_one_address_and_port_are_refused_before_any_model_loads() -> None:
    port, other = (str(p) for p in free_ports(2))
    result = run_cli("--http-port", port, "--grpc-port", port, "--metrics-port", other)
    assert result.returncode == 2
    assert (
        "The server cannot listen to HTTP requests and GRPC requests at the same address "
        f"and port 0.0.0.0:{port}"
    ) in result.stderr
    assert "successfully loaded" not in result.stdout + result.stderr

    result = run_cli(
        "--grpc-address", "127.0.0.1", "--grpc-port", port,
        "--metrics-address", "127.0.0.1", "--metrics-port", port,
    )  # fmt: skip
    assert result.returncode == 2
    assert (
        "The server cannot listen to GRPC requests and metrics requests at the same address "
        f"and port 127.0.0.1:{port}"
    ) in result.stderr


@pytest.mark.parametrize(
    ("flags", "tls"),
    [
        # Any --grpc-use-ssl-mutual turns TLS on; false: clients need no certificate.
        (["--grpc-use-ssl-mutual=false"], True),
        # The last one wins: plaintext, as in Triton.
        (["--grpc-use-ssl-mutual=true", "--grpc-use-ssl=false"], False),
        (["--grpc-use-ssl=false", "--grpc-use-ssl-mutual=false"], True),
    ],
)
def test_the_last_ssl_flag_decides_what_grpc_serves(
    flags: list[str], tls: bool, tmp_path: Path
) -> None:
    files = make_tls_files(tmp_path)
    extra = [
        *flags,
        f"--grpc-server-cert={files.cert}",
        f"--grpc-server-key={files.key}",
        # Needed only for client certificates: with TLS that checks the server alone,
        # Triton reads a file it cannot open as empty, and starts.
        f"--grpc-root-cert={tmp_path / 'absent.crt'}",
    ]
    with running_server(extra=extra) as server:
        poll(lambda: grpc_live(server, ssl=tls, ca=files.ca), 30, "the gRPC call", interval=0.2)
        assert not grpc_live(server, ssl=not tls, ca=files.ca)


def test_mutual_tls_without_a_root_certificate_is_refused(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    result = run_cli(
        "--grpc-use-ssl-mutual=true",
        f"--grpc-server-cert={files.cert}",
        f"--grpc-server-key={files.key}",
        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
    )  # fmt: skip
    assert result.returncode == 1
    assert "--grpc-use-ssl-mutual=true needs --grpc-root-cert" in result.stdout + result.stderr
