"""The server runs under its installed name only: `python -m server.cli` from a checkout
would import its modules twice, and is refused with what to run instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


def run_help(module: str) -> subprocess.CompletedProcess[str]:
    """`python -m <module> --help`, from the checkout's root."""
    command = [sys.executable, "-m", module, "--help"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=50)


def test_the_checkout_name_is_refused_with_the_one_to_use() -> None:
    ran = run_help("server.cli")
    assert ran.returncode == 1
    assert ran.stderr.strip() == (
        "run `ge-serve` or `python -m ge_serve.server.cli`, not server.cli"
    )


def test_the_installed_name_runs() -> None:
    ran = run_help("ge_serve.server.cli")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("usage: ge-serve")
