"""Start the real `ge-serve` process on free loopback ports, and stop it by its PID."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from polling import poll

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_MODELS = REPO_ROOT / "examples" / "models"


def free_ports(count: int) -> tuple[int, ...]:
    """`count` distinct free loopback ports. The sockets are held until all are bound:
    closed one by one, the kernel may hand the same port out twice (a CI run once gave a
    server the same gRPC and metrics port)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return tuple(ports)


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    metrics_port: int
    log_path: Path
    args: list[str] = field(default_factory=list)

    @property
    def http_url(self) -> str:
        """host:port, as tritonclient wants it."""
        return f"127.0.0.1:{self.http_port}"

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal our own process and wait; kill it if it does not exit in time."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return int(self.process.returncode)


def server_command(
    repos: Sequence[Path], extra: Sequence[str], ports: tuple[int, int, int]
) -> list[str]:
    http_port, grpc_port, metrics_port = ports
    cmd = [sys.executable, "-m", "ge_serve.server.cli"]
    for repo in repos:
        cmd += ["--model-repository", str(repo)]
    cmd += [
        "--http-address", "127.0.0.1", "--http-port", str(http_port),
        "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port),
        "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics_port),
    ]  # fmt: skip
    return cmd + list(extra)


# How many sets of free ports start_server tries before it gives up.
PORT_TRIES = 3


def start_server(
    repos: Sequence[Path] = (EXAMPLE_MODELS,),
    extra: Sequence[str] = (),
    wait_ready: bool = True,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    ports: tuple[int, int, int] | None = None,
    new_group: bool = False,
) -> ServerProcess:
    """`ports` (HTTP, gRPC, metrics) for a server that must come back where it was, e.g.
    behind a load balancer; free ones otherwise. `new_group`: the server leads a process
    group of its own (its PID is the group's ID), which a test may signal whole.

    Free ports are free when free_ports returns, not when the server binds them (after
    loading its models, a second or more later): another pytest worker's free_ports may
    hand one out meanwhile and its server take it. A server that cannot listen on ports it
    was not given starts again on others."""
    tries = 1 if ports is not None else PORT_TRIES
    for tried in range(1, tries + 1):
        http, grpc, metrics = ports or free_ports(3)
        server = _start(repos, extra, env, (http, grpc, metrics), new_group)
        if not wait_ready:
            return server
        try:
            wait_for(server, "/v2/health/ready", timeout)
        except RuntimeError:
            if tried == tries or "Address already in use" not in server.log():
                raise
            continue
        return server
    raise AssertionError("unreachable: the last try returns or raises")


def _start(
    repos: Sequence[Path],
    extra: Sequence[str],
    env: dict[str, str] | None,
    ports: tuple[int, int, int],
    new_group: bool,
) -> ServerProcess:
    log_dir = Path(tempfile.mkdtemp(prefix="ge-serve-log-"))
    log_path = log_dir / "server.log"
    cmd = server_command(repos, extra, ports)
    full_env = dict(os.environ)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    if env:
        full_env.update(env)
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(
            cmd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=REPO_ROOT,
            process_group=0 if new_group else None,
        )
    server = ServerProcess(process, *ports, log_path=log_path, args=cmd)
    # Callers that start and stop a server themselves read its log after the stop, so the
    # folder goes when the last reference does (or at exit), not at stop.
    weakref.finalize(server, shutil.rmtree, log_dir, ignore_errors=True)
    return server


def wait_for(server: ServerProcess, path: str, timeout: float) -> None:
    """Poll a real signal (an HTTP 200), never a fixed sleep."""

    def answered() -> bool:
        if not server.alive():
            raise RuntimeError(
                f"ge-serve exited early ({server.process.returncode}):\n{server.log()}"
            )
        try:
            return httpx.get(server.base_url + path, timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        poll(answered, timeout, path, interval=0.05)
    except TimeoutError:
        server.stop(signal.SIGKILL)
        raise TimeoutError(
            f"ge-serve did not answer {path} in {timeout}s:\n{server.log()}"
        ) from None


@contextmanager
def running_server(
    repos: Sequence[Path] = (EXAMPLE_MODELS,), extra: Sequence[str] = (), **kwargs: object
) -> Iterator[ServerProcess]:
    server = start_server(repos, extra, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    except BaseException:
        # pytest shows captured output with the failure: the server's side of the story.
        state = "running" if server.alive() else f"exited with {server.process.returncode}"
        print(f"ge-serve (pid {server.process.pid}) was {state}; the end of its log:")
        print(server.log()[-6000:])
        raise
    finally:
        server.stop()
        shutil.rmtree(server.log_path.parent, ignore_errors=True)
