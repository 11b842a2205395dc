"""What metrics cost: throughput on `simple` at concurrency 16, metrics on versus off.

Two ge-serve processes run side by side, one with the default metrics (summaries and
histograms on) and one with `--allow-metrics=false`. The load generator measures them in
alternating short rounds (ABBA order, so drift on a shared machine falls on both), and the
result is the ratio of the medians, measured in the same run.

    python bench/metrics_overhead.py                     # 8 rounds of 3 s
    python bench/metrics_overhead.py --rounds 2 --seconds 1   # smoke run

The load generator is perf_analyzer when it can run (`$PERF_ANALYZER`, or PATH; it ships in
the tritonclient 2.51.0 wheel), else an asyncio tritonclient loop; the output says which.
Each server is scraped once at the end, to show that the metrics server did the counting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_MODELS = ROOT / "examples" / "models"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    name: str
    process: subprocess.Popen[bytes]
    http_port: int
    metrics_port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def start_server(name: str, repo: Path, extra: list[str], log_dir: Path) -> Server:
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log_path = log_dir / f"{name}.log"
    cmd = [
        sys.executable, "-m", "ge_serve.server.cli", "--model-repository", str(repo),
        "--http-address", "127.0.0.1", "--http-port", str(http_port),
        "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port),
        "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics_port),
        "--load-model", "simple", "--model-control-mode", "explicit", *extra,
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    server = Server(name, process, http_port, metrics_port, log_path)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server '{name}' exited:\n{log_path.read_text()}")
        try:
            if httpx.get(f"http://{server.url}/v2/health/ready", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise TimeoutError(f"server '{name}' not ready:\n{log_path.read_text()}")


def find_perf_analyzer() -> tuple[str, dict[str, str]] | None:
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    try:
        import nvidia.cuda_runtime as cuda_runtime  # type: ignore[import-not-found]

        paths += [str(Path(p) / "lib") for p in cuda_runtime.__path__]
    except ImportError:
        pass
    env = {**os.environ, "LD_LIBRARY_PATH": ":".join(paths)}
    for candidate in (os.environ.get("PERF_ANALYZER", ""), shutil.which("perf_analyzer") or ""):
        if candidate and Path(candidate).is_file():
            probe = subprocess.run([candidate, "--version"], env=env, capture_output=True)
            if probe.returncode == 0:
                return candidate, env
    return None


def perf_analyzer_round(
    binary: str, env: dict[str, str], server: Server, concurrency: int, seconds: float
) -> float:
    """Mean of the measurement passes after the first (which warms up the connections).

    Passes are read from perf_analyzer's verbose output, so a round counts even when the
    shared machine is too noisy for perf_analyzer's own stability rule.
    """
    window_ms = max(200, int(seconds * 1000))
    command = [
        binary, "-m", "simple", "-u", server.url, "-i", "http", "-v",
        "--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms),
        "--max-trials", "3", "--stability-percentage", "100",
    ]  # fmt: skip
    result = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120 + 10 * seconds
    )
    passes = [
        float(v) for v in re.findall(r"Pass \[\d+\] throughput: ([\d.]+) infer/sec", result.stdout)
    ]
    if not passes:
        raise RuntimeError(f"perf_analyzer failed:\n{result.stdout}\n{result.stderr}")
    measured = passes[1:] or passes
    return sum(measured) / len(measured)


async def _python_round(server: Server, concurrency: int, seconds: float) -> float:
    import tritonclient.http.aio as aioclient

    client = aioclient.InferenceServerClient(server.url, conn_limit=concurrency)
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [aioclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    done = 0
    stop_at = 0.0

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await client.infer("simple", inputs)
            done += 1

    try:
        stop_at = time.perf_counter() + 0.3  # warm up the connections
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        done = 0
        started = time.perf_counter()
        stop_at = started + seconds
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds per configuration")
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement per round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repo", type=Path, default=EXAMPLE_MODELS)
    parser.add_argument("--load", choices=["auto", "perf_analyzer", "python"], default="auto")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    tool = find_perf_analyzer() if args.load in ("auto", "perf_analyzer") else None
    if args.load == "perf_analyzer" and tool is None:
        print("perf_analyzer cannot run here; use --load python", file=sys.stderr)
        return 2
    load = "perf_analyzer" if tool else "python (tritonclient.http.aio)"

    configs = {"metrics on": [], "metrics off": ["--allow-metrics=false"]}
    log_dir = Path(tempfile.mkdtemp(prefix="metrics-overhead-"))
    servers: dict[str, Server] = {}
    results: dict[str, list[float]] = {name: [] for name in configs}
    try:
        for name, extra in configs.items():
            servers[name] = start_server(name.replace(" ", "_"), args.repo, extra, log_dir)
        names = list(configs)
        for round_index in range(args.rounds):
            order = names if round_index % 2 == 0 else names[::-1]  # ABBA
            for name in order:
                server = servers[name]
                if tool:
                    value = perf_analyzer_round(*tool, server, args.concurrency, args.seconds)
                else:
                    value = asyncio.run(_python_round(server, args.concurrency, args.seconds))
                results[name].append(value)
                print(f"round {round_index + 1}/{args.rounds}  {name:<12} {value:10.1f} infer/s")
        scraped = httpx.get(f"http://127.0.0.1:{servers['metrics on'].metrics_port}/metrics")
        counted = re.search(
            r'nv_inference_request_success\{model="simple"[^}]*\} (\S+)', scraped.text
        )
    finally:
        for server in servers.values():
            server.stop()
    on = statistics.median(results["metrics on"])
    off = statistics.median(results["metrics off"])
    loss = (1 - on / off) * 100 if off else float("nan")
    print()
    print(f"load generator: {load}; concurrency {args.concurrency}; model simple; HTTP")
    print(f"{args.rounds} rounds x {args.seconds:g} s per configuration, alternating (ABBA)")
    print()
    print("| configuration | median infer/s | min | max |")
    print("|---|---|---|---|")
    for name, values in results.items():
        print(
            f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |"
        )
    print()
    print(f"ratio on/off: {on / off:.3f}  (throughput loss with metrics: {loss:.1f}%)")
    if counted:
        print(f"the metrics-on server counted {float(counted.group(1)):.0f} successful requests")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "load": load,
                    "concurrency": args.concurrency,
                    "rounds": args.rounds,
                    "seconds": args.seconds,
                    "infer_per_s": results,
                    "ratio_on_off": on / off,
                    "loss_percent": loss,
                },
                indent=2,
            )
        )
    shutil.rmtree(log_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
