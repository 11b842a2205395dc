"""ge-serve against the least a Python server on its stack can do (bench/lib/bare.py) on
`simple`: how much of a request's cost is ge-serve's own, and how much the frameworks'.

The bare server is uvicorn (httptools) and grpc.aio on one uvloop loop, as ge-serve, and
does only what the protocol requires (parse, add and subtract with numpy, encode). Its
throughput is the ceiling of any change to ge-serve's request path that keeps these
frameworks: a measuring stick for where the cost lies (and where Triton stands against
it), not a goal. Both serve `simple` as ../shared/peers builds it (max batch 8,
`dynamic_batching {}`). perf_analyzer drives HTTP binary and gRPC, wrk plain JSON. The
two servers alternate in rounds (ge first, then bare first, ...); each figure is the
median of its rounds, and each ratio the median of the rounds' ratios.

    python -m bench run ceiling --out bench/results/ceiling
    python -m bench run ceiling --rounds 1 --concurrency 1 --protocols grpc  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from bench.lib.models import Batching, make_repo
from bench.lib.perfa import find_perf_analyzer, run_perf_analyzer
from bench.lib.server import REPO_ROOT, free_ports, serve
from ge_serve.server.startup.grpc_core import grpc_core_environment

PROG = "python -m bench run ceiling"
WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '%s'
"""
BODY = json.dumps({"inputs": [
    {"name": name, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
    for name in ("INPUT0", "INPUT1")
]})  # fmt: skip


class BareServer(NamedTuple):
    """Where bench/lib/bare.py answers ("127.0.0.1:PORT"), and its process."""

    http: str
    grpc: str
    pid: int


@contextmanager
def bare_server(timeout: float = 30.0) -> Iterator[BareServer]:
    """bench/lib/bare.py on free ports."""
    http_port, grpc_port = free_ports(2)
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.lib.bare", str(http_port), str(grpc_port)],
        cwd=REPO_ROOT,
        # grpc core as ge-serve runs it (server/startup/grpc_core.py).
        env={**os.environ, **grpc_core_environment(os.environ)},
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2", timeout=1).read()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the bare server did not start") from None
                time.sleep(0.2)
        yield BareServer(f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", process.pid)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def contender(name: str, repo: Path) -> Iterator[tuple[str, str]]:
    if name == "bare":
        with bare_server() as bare:
            yield bare.http, bare.grpc
    else:
        with serve(repo, ["--allow-metrics", "false"]) as server:
            yield server.http_url, server.grpc_url


def wrk(url: str, concurrency: int, seconds: int, script: Path) -> tuple[float, float]:
    """(requests/s, p50 ms) of wrk posting BODY with `concurrency` connections."""
    target = f"http://{url}/v2/models/simple/infer"
    base = ["wrk", "-t1", f"-c{concurrency}", "--timeout", "10s", "-s", str(script)]
    subprocess.run([*base, "-d2s", target], capture_output=True, check=True, timeout=60)
    out = subprocess.run(
        [*base, f"-d{seconds}s", "--latency", target],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    ).stdout  # fmt: skip
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    rate = float(next(line.split()[1] for line in out.splitlines() if "Requests/sec" in line))
    p50 = next(line.split()[1] for line in out.splitlines() if line.strip().startswith("50%"))
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    unit = "us" if p50.endswith("us") else "ms" if p50.endswith("ms") else "s"
    return rate, float(p50.removesuffix(unit)) * scale[unit]


def measure(
    urls: tuple[str, str], protocol: str, concurrency: int, args: argparse.Namespace,
    pa: tuple[str, dict[str, str]], script: Path,
) -> tuple[float, float]:  # fmt: skip
    if protocol == "json":
        return wrk(urls[0], concurrency, args.wrk_seconds, script)
    url = urls[0] if protocol == "http" else urls[1]
    row = run_perf_analyzer(
        "simple", url, protocol, concurrency,
        measurement_interval_ms=args.interval_ms, perf_analyzer=pa,
    )  # fmt: skip
    return float(row["throughput"]), float(row["p50_us"]) / 1000


def summarise(runs: list[dict[str, Any]], points: list[tuple[str, int]]) -> list[dict[str, Any]]:
    rows = []
    for protocol, concurrency in points:
        key = f"{protocol}/c{concurrency}"
        ge = [run["ge"][key] for run in runs]
        bare = [run["bare"][key] for run in runs]
        rows.append({
            "protocol": protocol, "concurrency": concurrency,
            "ge_ips": statistics.median(g[0] for g in ge),
            "bare_ips": statistics.median(b[0] for b in bare),
            "ge_p50_ms": statistics.median(g[1] for g in ge),
            "bare_p50_ms": statistics.median(b[1] for b in bare),
            "ips_ratio": statistics.median(g[0] / b[0] for g, b in zip(ge, bare, strict=True)),
            "p50_ratio": statistics.median(g[1] / b[1] for g, b in zip(ge, bare, strict=True)),
        })  # fmt: skip
    return rows


def report(rows: list[dict[str, Any]], command: str, rounds: int) -> str:
    lines = [
        "# ge-serve against the bare frameworks (bench/lib/bare.py), `simple`",
        "",
        f"Medians over {rounds} alternating rounds. `{command}`",
        "",
        "| protocol | clients | ge infer/s | bare infer/s | ge ÷ bare | ge p50 ms | bare p50 ms |"
        " p50 ge ÷ bare |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['protocol']} | {r['concurrency']} | {r['ge_ips']:.0f} | {r['bare_ips']:.0f} "
            f"| {r['ips_ratio']:.2f} | {r['ge_p50_ms']:.2f} | {r['bare_p50_ms']:.2f} "
            f"| {r['p50_ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--protocols", default="http grpc json")
    parser.add_argument("--concurrency", default="1 16")
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--wrk-seconds", type=int, default=5)
    parser.add_argument("--out", type=Path, help="OUT.md and OUT.json")
    args = parser.parse_args(argv)
    protocols = args.protocols.split()
    if "json" in protocols and shutil.which("wrk") is None:
        print(f"{PROG}: wrk is not installed (apt-get install wrk): json left out")
        protocols.remove("json")
    points = [(p, int(c)) for p in protocols for c in args.concurrency.split()]
    pa = find_perf_analyzer()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ceiling-") as tmp:
        repo = make_repo(Path(tmp) / "repo", "simple", batching=Batching())
        script = Path(tmp) / "post.lua"
        script.write_text(WRK_SCRIPT % BODY)
        for index in range(args.rounds):
            run: dict[str, Any] = {}
            for name in ("ge", "bare") if index % 2 == 0 else ("bare", "ge"):
                with contender(name, repo) as urls:
                    run[name] = {}
                    for protocol, concurrency in points:
                        figures = measure(urls, protocol, concurrency, args, pa, script)
                        run[name][f"{protocol}/c{concurrency}"] = figures
                        ips, p50 = figures
                        point = f"round {index + 1} {name} {protocol} c={concurrency}"
                        print(f"{point}: {ips:.0f} infer/s, p50 {p50:.2f} ms", flush=True)
            runs.append(run)
    rows = summarise(runs, points)
    command = " ".join([PROG, *(argv if argv is not None else sys.argv[1:])])
    text = report(rows, command, args.rounds)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text)
        result = {"command": command, "rounds": runs, "summary": rows}
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    return 0
