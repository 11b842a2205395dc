"""Two ge-serve replicas behind HAProxy, on loopback, no containers: one replica is stopped
with SIGTERM and started again while HTTP and gRPC load runs through the balancer, and no
request may fail.

The balancer runs with deploy/compose/haproxy.cfg, the compose stack's own file, so this
also checks the stack's failover. HAProxy comes from Debian's `haproxy` package; .ci/run
installs it where apt-get works, and the test skips, saying so, where it is missing.

What each protocol leans on (haproxy.cfg says more):
- HTTP: the balancer's active health check and its retry on 503 and refused connections.
- gRPC: the same health check and connection retries, and the client's standard gRPC
  retry policy for UNAVAILABLE, since no HTTP balancer can retry on a gRPC status. One
  extra gRPC client without that policy measures what the balancer alone achieves.

The figures (requests, failures, throughput with two replicas, with one, and with two again
after the restart) are printed; `pytest -s` shows them. On a machine with few cores the
client, the balancer and both replicas share them, so two replicas need not be faster.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from polling import poll
from promtext import scrape
from serverproc import EXAMPLE_MODELS, REPO_ROOT, ServerProcess, free_ports, start_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

HAPROXY_CFG = REPO_ROOT / "deploy" / "compose" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy") or next(
    (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if os.access(p, os.X_OK)),
    None,
)

# The standard gRPC retry policy a client sets for a replica that is stopping: UNAVAILABLE
# means the call was refused before it ran, so sending it again is safe. gRPC caps attempts
# at 5 and waits a random time up to each backoff, so the backoffs must add up to more than
# the moment a stopping replica refuses calls before the balancer takes it out (its
# linger, at most a second): otherwise a call can spend every attempt on that replica.
RETRY_SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "inference.GRPCInferenceService"}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.2s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 3,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)

# How long each throughput window lasts; long enough to average out a busy machine's
# jitter, short enough that the whole test stays well under a minute.
WINDOW_S = 3.0

DATA = np.arange(16, dtype=np.int32).reshape(1, 16)
HTTP_BODY = json.dumps(
    {
        "inputs": [
            {"name": name, "shape": [1, 16], "datatype": "INT32", "data": DATA.ravel().tolist()}
            for name in ("INPUT0", "INPUT1")
        ]
    }
)


@dataclass
class Tally:
    """What one kind of client saw: when each request succeeded, and every failure."""

    done: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def between(self, start: float, end: float) -> int:
        return sum(1 for t in self.done if start <= t < end)


class Load:
    """Client threads that send requests through the balancer until stopped."""

    def __init__(self, http_url: str, grpc_url: str) -> None:
        self.http_url = http_url
        self.grpc_url = grpc_url
        self.http = Tally()
        self.grpc = Tally()
        self.grpc_plain = Tally()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self, http_clients: int = 3, grpc_clients: int = 3) -> None:
        workers: list[Callable[[], None]] = [self._http] * http_clients
        workers += [lambda: self._grpc(self.grpc, retry=True)] * grpc_clients
        workers.append(lambda: self._grpc(self.grpc_plain, retry=False))
        for worker in workers:
            thread = threading.Thread(target=worker, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        assert not any(t.is_alive() for t in self._threads), "a load thread hung"

    def _http(self) -> None:
        url = f"http://{self.http_url}/v2/models/simple/infer"
        headers = {"Content-Type": "application/json"}
        with httpx.Client(timeout=15.0) as client:
            while not self._stop.is_set():
                try:
                    response = client.post(url, content=HTTP_BODY, headers=headers)
                except httpx.HTTPError as exc:
                    self.http.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                if response.status_code != 200:
                    self.http.failures.append(f"HTTP {response.status_code}: {response.text}")
                    continue
                out = response.json()["outputs"]
                sums = next(o for o in out if o["name"] == "OUTPUT0")["data"]
                if sums != (DATA * 2).ravel().tolist():
                    self.http.failures.append(f"wrong answer {sums}")
                    continue
                self.http.done.append(time.monotonic())

    def _grpc(self, tally: Tally, retry: bool) -> None:
        args = [("grpc.enable_retries", 1), ("grpc.service_config", RETRY_SERVICE_CONFIG)]
        client = grpcclient.InferenceServerClient(
            self.grpc_url, channel_args=args if retry else [("grpc.enable_retries", 0)]
        )
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for item in inputs:
            item.set_data_from_numpy(DATA)
        try:
            while not self._stop.is_set():
                try:
                    result = client.infer("simple", inputs, client_timeout=15.0)
                except InferenceServerException as exc:
                    tally.failures.append(f"{exc.status()}: {exc.message()}")
                    continue
                if not np.array_equal(result.as_numpy("OUTPUT0"), DATA * 2):
                    tally.failures.append("wrong answer")
                    continue
                tally.done.append(time.monotonic())
        finally:
            client.close()


@dataclass
class Balancer:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    stats_port: int
    log_path: Path

    def states(self) -> dict[tuple[str, str], str]:
        """(backend, server) -> UP, DOWN, ... from the stats page's CSV."""
        text = httpx.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=2.0).text
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {
            (row["pxname"], row["svname"]): row["status"]
            for row in rows
            if row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_state(self, server: str, state: str, timeout: float = 20.0) -> None:
        def reached() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"haproxy exited:\n{self.log_path.read_text()}")
            found = self.states()
            return all(found[(backend, server)] == state for backend in ("ge_http", "ge_grpc"))

        poll(reached, timeout, f"{server} {state} in haproxy", interval=0.05)


@contextlib.contextmanager
def balancer(replicas: list[ServerProcess]) -> Iterator[Balancer]:
    assert HAPROXY is not None
    http_port, grpc_port, stats_port = free_ports(3)
    env = dict(os.environ)
    env.update(
        LB_BIND="127.0.0.1",
        LB_HTTP_PORT=str(http_port),
        LB_GRPC_PORT=str(grpc_port),
        LB_STATS_PORT=str(stats_port),
    )
    for index, replica in enumerate(replicas, start=1):
        env[f"GE{index}_HOST"] = "127.0.0.1"
        env[f"GE{index}_HTTP_PORT"] = str(replica.http_port)
        env[f"GE{index}_GRPC_PORT"] = str(replica.grpc_port)
    log_dir = Path(tempfile.mkdtemp(prefix="haproxy-log-"))
    log_path = log_dir / "haproxy.log"
    with open(log_path, "wb") as log_file:
        # -db: stay in the foreground, so the PID we hold is the one that serves.
        process = subprocess.Popen(
            [HAPROXY, "-db", "-f", str(HAPROXY_CFG)],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
    lb = Balancer(process, http_port, grpc_port, stats_port, log_path)
    try:

        def answers() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"haproxy exited:\n{log_path.read_text()}")
            try:
                lb.states()
            except httpx.HTTPError:
                return False
            return True

        poll(answers, 10.0, "haproxy stats page", interval=0.05)
        yield lb
    except BaseException:
        print("the end of haproxy's log:\n" + log_path.read_text()[-4000:])
        raise
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        shutil.rmtree(log_dir, ignore_errors=True)


def _successes(server: ServerProcess) -> float:
    return sum(
        v
        for _, v in scrape(server.metrics_url).find("nv_inference_request_success", model="simple")
    )


@pytest.mark.skipif(
    HAPROXY is None,
    reason="haproxy is not installed (Debian package `haproxy`; .ci/run installs it "
    "where apt-get works)",
)
def test_sigterm_and_restart_of_a_replica_loses_no_request() -> None:
    args = ["--exit-timeout-secs", "10"]
    replicas = [start_server([EXAMPLE_MODELS], args) for _ in range(2)]
    first = replicas[0]
    load: Load | None = None
    try:
        with balancer(replicas) as lb:
            for name in ("r1", "r2"):
                lb.wait_state(name, "UP")
            load = Load(f"127.0.0.1:{lb.http_port}", f"127.0.0.1:{lb.grpc_port}")
            load.start()
            # Two replicas: a warm-up second, then a measured window.
            time.sleep(1.0)
            two_start = time.monotonic()
            time.sleep(WINDOW_S)
            two_end = time.monotonic()

            stopped_at = time.monotonic()
            assert first.stop(signal.SIGTERM, timeout=30.0) == 0, first.log()
            drained_s = time.monotonic() - stopped_at
            lb.wait_state("r1", "DOWN")

            # One replica, the balancer already knowing it.
            one_start = time.monotonic()
            time.sleep(WINDOW_S)
            one_end = time.monotonic()

            restarted_at = time.monotonic()
            first = replicas[0] = start_server(
                [EXAMPLE_MODELS],
                args,
                ports=(first.http_port, first.grpc_port, first.metrics_port),
            )
            lb.wait_state("r1", "UP")
            back_s = time.monotonic() - restarted_at
            # Two replicas again, the restarted one taking its share.
            again_start = time.monotonic()
            time.sleep(WINDOW_S)
            again_end = time.monotonic()
            load.stop()

            served_after_restart = _successes(first)
    finally:
        if load is not None:
            load.stop()
        for replica in replicas:
            replica.stop()
            shutil.rmtree(replica.log_path.parent, ignore_errors=True)

    figures: dict[str, float | None] = {
        "http_requests": len(load.http.done),
        "http_failed": len(load.http.failures),
        "grpc_requests": len(load.grpc.done),
        "grpc_failed": len(load.grpc.failures),
        "grpc_without_client_retry_requests": len(load.grpc_plain.done),
        "grpc_without_client_retry_failed": len(load.grpc_plain.failures),
        "drain_s": round(drained_s, 2),
        "restart_to_up_s": round(back_s, 2),
        # Other work on the machine moves throughput more than a replica does on few cores.
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    # Throughputs apart from figures, whose cpu count may be None, to assert on them.
    rps: dict[str, float] = {}
    for name, tally in (("http", load.http), ("grpc", load.grpc)):
        two = tally.between(two_start, two_end) / (two_end - two_start)
        one = tally.between(one_start, one_end) / (one_end - one_start)
        again = tally.between(again_start, again_end) / (again_end - again_start)
        rps[f"{name}_rps_2_replicas"] = round(two, 1)
        rps[f"{name}_rps_1_replica"] = round(one, 1)
        rps[f"{name}_rps_2_replicas_after_restart"] = round(again, 1)
    figures.update(rps)
    print("failover figures:", json.dumps(figures, indent=1))
    print("gRPC failures without a client retry policy:", load.grpc_plain.failures[:5])

    assert not load.http.failures, load.http.failures[:10]
    assert not load.grpc.failures, load.grpc.failures[:10]
    # The load really ran through the whole sequence, and the restarted replica rejoined.
    assert rps["http_rps_1_replica"] > 0 and rps["grpc_rps_1_replica"] > 0
    assert served_after_restart > 0
