"""tools/npu_smoke.py: it skips clearly without pyACL, and passes against the fake pyACL
and fake atc (the same flow it runs against real ones on a CANN machine)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ge_helpers import FAKE_ACL_SITE, FAKE_ATC_BIN, REPO_ROOT

pytestmark = pytest.mark.timeout(180)
SCRIPT = REPO_ROOT / "tools" / "npu_smoke.py"


def run(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--keep", str(tmp_path / "work")],
        capture_output=True, text=True, env=env, timeout=170, check=False,
    )  # fmt: skip


def test_without_pyacl_the_smoke_script_skips_and_says_why(tmp_path: Path) -> None:
    done = run(dict(os.environ), tmp_path)
    assert done.returncode == 2
    assert "SKIP: pyACL cannot be imported" in done.stdout


def test_against_the_fake_pyacl_every_check_passes(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{FAKE_ACL_SITE}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env["PATH"] = f"{FAKE_ATC_BIN}{os.pathsep}{env['PATH']}"
    env["FAKE_ACL_SOC"] = "Ascend310P3"
    done = run(env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 of 5 checks passed" in done.stdout
    assert done.stdout.count("PASS") == 5
