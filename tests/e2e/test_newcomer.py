"""A newcomer's first five minutes: a fresh clone, the README's quick start as written, and
the README's curl inference.

The commands are read from the README itself, so the test fails when the README and the
project drift apart. The only change made to them is the ports: tests bind free loopback
ports, never the defaults.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from polling import poll
from serverproc import REPO_ROOT, free_ports

README = REPO_ROOT / "README.md"
SERVE = "ge-serve "


def bash_blocks(section: str) -> list[str]:
    """The ```bash blocks of one `## ` section of the README, in order."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"the README has no '## {section}' section"
    return re.findall(r"```bash\n(.*?)```", match.group(1), re.S)


def quick_start() -> tuple[str, str]:
    """(the install part, the serve command) of the quick start's first command."""
    line = bash_blocks("Quick start")[0].strip()
    install, serve = line.rsplit("&& ", 1)
    assert serve.startswith(SERVE), f"the quick start does not end by serving: {line!r}"
    return install.strip(), serve


def curl_inference() -> str:
    """The README's curl command that runs an inference."""
    for block in bash_blocks("Talking to it"):
        for command in re.split(r"\n(?=curl )", block.strip()):
            if command.startswith("curl ") and "/infer" in command:
                return command
    raise AssertionError("the README shows no curl inference")


def test_the_readme_commands_are_found() -> None:
    install, serve = quick_start()
    assert "pip install" in install
    assert "examples/models" in serve
    assert "/v2/models/simple/infer" in curl_inference()


@pytest.mark.e2e
@pytest.mark.timeout(1200)
def test_a_fresh_clone_follows_the_quick_start(tmp_path: Path) -> None:
    clone = tmp_path / "ge-serve"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(clone)],
        check=True,
        timeout=120,
    )
    install, serve = quick_start()
    # The venv's own pip, nothing from ours: the clone installs what pyproject declares.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        ["bash", "-c", install],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    http, grpc, metrics = free_ports(3)
    ports = f" --http-port {http} --grpc-port {grpc} --metrics-port {metrics}"
    command = ". .venv/bin/activate && exec " + serve + ports
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            ["bash", "-c", command], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:

        def ready() -> bool:
            assert server.poll() is None, log.read_text(errors="replace")
            try:
                return httpx.get(f"http://127.0.0.1:{http}/v2/health/ready").status_code == 200
            except httpx.HTTPError:
                return False

        poll(ready, 120, "the quick-start server to be ready", interval=0.2)
        curl = curl_inference().replace("localhost:8000", f"127.0.0.1:{http}")
        answer = subprocess.run(
            ["bash", "-c", curl], capture_output=True, text=True, timeout=60, check=True
        )
        outputs = {o["name"]: o["data"] for o in json.loads(answer.stdout)["outputs"]}
        request = json.loads(shlex.split(curl)[-1])
        a, b = (entry["data"] for entry in request["inputs"])
        assert outputs["OUTPUT0"] == [x + y for x, y in zip(a, b, strict=True)]
        assert outputs["OUTPUT1"] == [x - y for x, y in zip(a, b, strict=True)]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
    assert server.returncode == 0, log.read_text(errors="replace")
