"""Start ge-serve for a benchmark: free loopback ports, wait for ready, stop it by its PID.

Shares tests/serverproc.py (the same launcher the tests use), so the bench starts the server
exactly as the tests do: `python -m ge_serve.server.cli` with the caller's PYTHONPATH.

    with serve(repo, ["--log-verbose", "0"]) as srv:
        srv.http_url, srv.grpc_url     # "127.0.0.1:PORT", as perf_analyzer's -u wants
        srv.metrics_url, srv.process.pid
        grpc_ready(srv)                # False when the branch has no gRPC front end yet
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
# tests/ is not a package: put it on the path to share its launcher, as pytest does.
if str(REPO_ROOT / "tests") not in sys.path:
    sys.path.append(str(REPO_ROOT / "tests"))

from serverproc import ServerProcess, free_ports, start_server  # noqa: E402

__all__ = ["REPO_ROOT", "ServerProcess", "free_ports", "grpc_ready", "serve", "start_server"]


@contextmanager
def serve(
    repos: Path | Sequence[Path],
    flags: Sequence[str] = (),
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
    keep_log: Path | None = None,
) -> Iterator[ServerProcess]:
    """Start ge-serve on `repos` with extra CLI `flags`, wait for /v2/health/ready, yield it,
    then stop it (SIGTERM, then SIGKILL after 30 s). `keep_log`: copy the server log there
    when done (the temporary one is removed)."""
    # The server runs with cwd = the repository root: make paths absolute.
    repo_list = [p.resolve() for p in ([repos] if isinstance(repos, Path) else repos)]
    server = start_server(repo_list, list(flags), wait_ready=True, timeout=timeout, env=env)
    try:
        yield server
    finally:
        server.stop()
        if keep_log is not None:
            keep_log.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(server.log_path, keep_log)
        shutil.rmtree(server.log_path.parent, ignore_errors=True)


def grpc_ready(server: ServerProcess, timeout: float = 5.0) -> bool:
    """Whether the gRPC port answers ServerReady (polls until `timeout`)."""
    import tritonclient.grpc as grpcclient

    deadline = time.monotonic() + timeout
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        while True:
            try:
                if client.is_server_ready(client_timeout=1.0):
                    return True
            except Exception:  # any transport or status error means "not now"
                pass
            if time.monotonic() >= deadline or not server.alive():
                return False
            time.sleep(0.1)
    finally:
        client.close()
