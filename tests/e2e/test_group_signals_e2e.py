"""A stop signal sent to ge-serve's whole process group stops it as one sent to the server
alone does.

systemd's default stop (KillMode=control-group), `timeout` killing its child's group, and
Ctrl-C in a terminal signal every process of the group at once: the front-end workers
(`--http-workers`, `--grpc-workers`) and the Python models' workers get the signal beside
the server. As Triton's Python stub does, they leave it to the server, which ends them
itself: none dies of the signal, none is started again, each model's `finalize` runs, and
no process is left behind.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
from pathlib import Path

import httpx
import pymodels
import pytest
from polling import poll
from serverproc import start_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

WORKERS = ["--http-workers", "2", "--grpc-workers", "2"]
# The server, its 4 front-end workers and the add_sub model's worker.
CHILDREN = 5
# Far longer than the wait below: a stop that waits out the grace (a worker that ignores
# its stop until it is killed) is caught, however slow the machine.
EXIT_TIMEOUT_S = 120
WAIT_S = 60
# What the log says when a worker dies of the signal, or is started again.
DEATH_LINES = ("killed by", "restarting", "starting it again", "did not exit in time")


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return sorted(found)


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def all_children(pid: int) -> list[int] | None:
    found = children(pid)
    return found if len(found) == CHILDREN else None


def ours(pid: int) -> bool:
    try:
        return b"ge_serve" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pymodels.write(tmp_path_factory.mktemp("group-signals"), "add_sub")


@pytest.mark.parametrize(
    ("whole_group", "signum"),
    [(True, signal.SIGTERM), (True, signal.SIGINT), (False, signal.SIGTERM)],
    ids=["group-SIGTERM", "group-SIGINT", "server-SIGTERM"],
)
def test_a_stop_signal_ends_every_process_once_without_restarts(
    repo: Path, whole_group: bool, signum: signal.Signals
) -> None:
    server = start_server(
        [repo], [*WORKERS, "--exit-timeout-secs", str(EXIT_TIMEOUT_S)], new_group=True
    )
    pid = server.process.pid
    kids: list[int] = []
    try:
        kids = poll(lambda: all_children(pid), 60, "every worker")
        tensors = [
            {"name": name, "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}
            for name in ("INPUT0", "INPUT1")
        ]
        body = {"inputs": tensors}
        answer = httpx.post(f"{server.base_url}/v2/models/add_sub/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        if whole_group:
            os.killpg(pid, signum)  # the group this test made: the server leads it
        else:
            os.kill(pid, signum)
        code = server.process.wait(WAIT_S)
    finally:
        if server.alive():
            server.stop(signal.SIGKILL)
        left = [kid for kid in kids if running(kid)]
        for kid in left:
            if ours(kid):
                os.kill(kid, signal.SIGKILL)
    log = server.log()
    assert code == 0, log
    assert not left, f"processes left behind: {left}\n{log}"
    assert [line for line in log.splitlines() if any(d in line for d in DEATH_LINES)] == [], log
    assert "add_sub finalized" in log


def test_a_python_worker_that_dies_while_the_server_stops_is_not_started_again(
    tmp_path: Path,
) -> None:
    """Its model is about to be unloaded: its request fails saying so, and the server
    goes on stopping, with no worker started in its place."""
    repo = pymodels.write(tmp_path / "repo", "hanger")
    started = tmp_path / "started"
    server = start_server([repo], ["--exit-timeout-secs", str(EXIT_TIMEOUT_S)], new_group=True)
    pid = server.process.pid
    try:
        (stub,) = children(pid)
        body = {
            "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}],
            "parameters": {"started": str(started)},
        }
        url = f"{server.base_url}/v2/models/hanger/infer"
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            answer = pool.submit(httpx.post, url, json=body, timeout=WAIT_S)
            poll(started.exists, 30, "the request to reach the model")
            os.killpg(pid, signal.SIGTERM)
            poll(lambda: "signal received" in server.log(), 30, "the stop to begin")
            os.kill(stub, signal.SIGKILL)
            response = answer.result()
        code = server.process.wait(WAIT_S)
    finally:
        if server.alive():
            server.stop(signal.SIGKILL)
    log = server.log()
    assert code == 0, log
    assert "the server is stopping" in response.json()["error"], response.text
    assert "restarting" not in log
    assert log.count("worker process") == 2, log  # its start, and its end as the server stops
