"""grpc core's I/O path, set in the environment before grpc loads
(server/startup/grpc_core.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ge_serve.server import app, cli
from ge_serve.server.startup.grpc_core import EXPERIMENTS, VARIABLE, grpc_core_environment

START_A_SERVER = """
import asyncio
import grpc

async def main():
    server = grpc.aio.server()
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await server.stop(0)

asyncio.run(main())
print("served")
"""


def test_the_listener_is_switched_off_unless_the_user_chose() -> None:
    assert grpc_core_environment({}) == {VARIABLE: EXPERIMENTS}
    assert grpc_core_environment({VARIABLE: "event_engine_listener"}) == {}
    assert grpc_core_environment({VARIABLE: ""}) == {}


def test_the_installed_grpc_knows_the_experiment() -> None:
    """A grpcio that dropped it would log "Unknown experiment" at every start."""
    env = {**os.environ, VARIABLE: EXPERIMENTS}
    done = subprocess.run(
        [sys.executable, "-c", START_A_SERVER], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "served", done.stderr
    assert "Unknown experiment" not in done.stderr


def test_the_command_line_does_not_load_grpc_before_it_sets_the_environment() -> None:
    check = (
        "import sys, ge_serve.server.cli\n"
        "print(sorted(m for m in sys.modules if m == 'grpc' or m.startswith('grpc.')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("chosen", [None, "event_engine_listener"])
def test_the_server_runs_with_the_environment_it_was_given(
    chosen: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set only while grpc loads: the processes the server starts (Python models'
    workers) see the environment the server was started with."""
    if chosen is None:
        monkeypatch.delenv(VARIABLE, raising=False)
    else:
        monkeypatch.setenv(VARIABLE, chosen)
    seen: list[str | None] = []

    def run(settings: object) -> int:
        seen.append(os.environ.get(VARIABLE))
        return 0

    monkeypatch.setattr(app, "run", run)
    assert cli.main(["--model-repository", str(tmp_path)]) == 0
    assert seen == [chosen]
