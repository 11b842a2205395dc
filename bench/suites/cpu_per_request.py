"""Server CPU per request: ge-serve against real Triton and the bare frameworks, each alone.

Throughput on a shared 2-core machine swings by 2x within minutes, and the load generator
takes its share of the same cores; the CPU time a server spends per request moves far
less, so it is the figure to optimise. Each server is started alone on `simple` as
../shared/peers builds it (INT32 [-1,16] add/sub, max batch 8, `dynamic_batching {}`):

- `ge`: ge-serve (this checkout, its defaults plus `--ge-flags`);
- `triton`: Triton 2.51 from ../shared/peers (`LAB=$HOME/lab run_peers.sh setup` first),
  onnxruntime inside its Python backend;
- `bare`: bench/lib/bare.py, uvicorn and grpc.aio on one uvloop loop doing only what the
  protocol requires: the frameworks' floor.

perf_analyzer drives gRPC and HTTP with the binary tensor extension, wrk plain JSON, at each
concurrency. Around each point the suite reads the CPU time of the server's whole process
tree from /proc (every thread of the server and of its children: Triton's Python-backend
stubs, ge-serve's front-end workers) and the inferences the server answered (its
statistics: `success.count`), so a point's figure is CPU ns ÷ inferences, warm-up
included on both sides. infer/s and p50 come from the load generator. For ge-serve, the
share of its CPU time spent in its main process (the serial part, with front-end workers)
is reported too.

Servers alternate their order between rounds; each figure is the median over rounds, and
each ratio (ge ÷ triton, ge ÷ bare) the median of the rounds' ratios.

    python -m bench run cpu-per-request --against triton --out /tmp/cpu     # ~4 min a round
    python -m bench run cpu-per-request --rounds 1 --protocols grpc --concurrency 16
    python -m bench run cpu-per-request --ge-flags "--grpc-workers 2" --protocols grpc
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.cpu_per_request import thread_cpu_ns
from bench.lib.peers import wait_ready
from bench.lib.perfa import find_perf_analyzer, run_perf_analyzer
from bench.lib.server import free_ports, serve
from bench.suites.ceiling import BODY, WRK_SCRIPT, bare_server, wrk
from bench.suites.peers import PEERS_DIRS

PROG = "python -m bench run cpu-per-request"
# ../shared/peers beside the checkout (or beside the folder of worktrees).
PEERS = next((p for p in PEERS_DIRS if p.is_dir()), PEERS_DIRS[0])
MODEL = "simple"


@dataclass(frozen=True)
class Urls:
    """Where a running server answers, and the root of its process tree."""

    http: str
    grpc: str
    pid: int


@dataclass(frozen=True)
class Point:
    """One server at one protocol and concurrency."""

    cpu_us: float  # server CPU µs per inference answered
    main_share: float  # the share of that CPU time in the server's main process
    ips: float  # infer/s the load generator saw
    p50_ms: float
    answered: int


def cpu_split(pid: int) -> tuple[int, int]:
    """(CPU ns of the whole process tree under `pid`, of `pid`'s own threads)."""
    threads = thread_cpu_ns(pid)
    total = sum(threads.values())
    main = sum(v for k, v in threads.items() if not k.startswith("worker:"))
    return total, main


def answered_count(stats: Mapping[str, Any]) -> int:
    """Inferences answered, from a KServe-v2 statistics answer (Triton's JSON shape)."""
    return sum(int(m["inference_stats"]["success"]["count"]) for m in stats["model_stats"])


def answered(http: str) -> int:
    with urllib.request.urlopen(f"http://{http}/v2/models/{MODEL}/stats", timeout=10) as r:
        return answered_count(json.loads(r.read()))


def point_of(
    cpu: tuple[int, int], count: int, ips: float, p50_ms: float
) -> Point:  # fmt: skip
    """A point from its CPU ns (tree, main process) and inferences answered."""
    if count <= 0:
        raise RuntimeError("the server answered no inference during the point")
    total, main = cpu
    return Point(total / count / 1000, main / total if total else 0.0, ips, p50_ms, count)


# --- servers ------------------------------------------------------------------------------


def _stop_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(30)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextmanager
def triton(models: Path, lab: Path, log: Path) -> Iterator[Urls]:
    """Triton 2.51 as ../shared/peers starts it, in a process group of its own."""
    http, grpc, metrics = free_ports(3)
    start = PEERS / "peers" / "triton_start.sh"
    command = ["bash", str(start), str(lab), str(models), str(http), str(grpc), str(metrics)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        if wait_ready(http, [MODEL], 180) is None:
            raise RuntimeError(f"Triton did not become ready; see {log}")
        yield Urls(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", process.pid)
    finally:
        _stop_group(process)


@contextmanager
def server(name: str, models: Path, args: argparse.Namespace, logs: Path) -> Iterator[Urls]:
    if name == "triton":
        with triton(models, args.lab, logs / "triton.log") as urls:
            yield urls
    elif name == "bare":
        with bare_server() as bare:
            yield Urls(bare.http, bare.grpc, bare.pid)
    else:
        flags = ["--log-verbose", "0", *shlex.split(args.ge_flags)]
        with serve(models, flags, keep_log=logs / "ge.log") as ge:
            yield Urls(ge.http_url, ge.grpc_url, ge.process.pid)


# --- measuring ----------------------------------------------------------------------------


def measure(
    urls: Urls, protocol: str, concurrency: int, args: argparse.Namespace,
    pa: tuple[str, dict[str, str]], script: Path,
) -> Point:  # fmt: skip
    count0, cpu0 = answered(urls.http), cpu_split(urls.pid)
    if protocol == "json":
        ips, p50_ms = wrk(urls.http, concurrency, args.wrk_seconds, script)
    else:
        row = run_perf_analyzer(
            MODEL, urls.grpc if protocol == "grpc" else urls.http, protocol, concurrency,
            measurement_interval_ms=args.interval_ms, max_trials=args.max_trials,
            stability_percentage=args.stability, perf_analyzer=pa,
        )  # fmt: skip
        ips, p50_ms = float(row["throughput"]), float(row["p50_us"]) / 1000
    cpu1, count1 = cpu_split(urls.pid), answered(urls.http)
    return point_of((cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]), count1 - count0, ips, p50_ms)


def _ratio(runs: list[dict[str, Point]], a: str, b: str, field: str) -> float | None:
    values = [
        getattr(run[a], field) / getattr(run[b], field)
        for run in runs
        if a in run and b in run and getattr(run[b], field)
    ]
    return statistics.median(values) if values else None


def summarise(
    rounds: Sequence[Mapping[str, Mapping[str, Point]]], servers: Sequence[str]
) -> list[dict[str, Any]]:
    """One row per point ("grpc/c16"): each server's medians, and ge's ratios to the
    others (medians of the rounds' ratios)."""
    keys = list(dict.fromkeys(key for run in rounds for point in run.values() for key in point))
    rows = []
    for key in keys:
        runs = [{s: run[s][key] for s in servers if key in run.get(s, {})} for run in rounds]
        row: dict[str, Any] = {"point": key}
        for name in servers:
            points = [run[name] for run in runs if name in run]
            if points:
                row[name] = {
                    field: statistics.median(getattr(p, field) for p in points)
                    for field in ("cpu_us", "main_share", "ips", "p50_ms")
                }
        for other in servers[1:]:
            row[f"ge/{other}"] = {
                field: _ratio(runs, "ge", other, field) for field in ("cpu_us", "ips", "p50_ms")
            }
        rows.append(row)
    return rows


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def report(rows: Sequence[Mapping[str, Any]], servers: Sequence[str], header: str) -> str:
    """The markdown tables: CPU per request with infer/s and p50 beside it, then ratios."""
    cols = " | ".join(f"{s} µs/req | {s} infer/s | {s} p50 ms" for s in servers)
    lines = [header, "", f"| point | {cols} | ge main share |"]
    lines.append("|---" * (2 + 3 * len(servers)) + "|")
    for row in rows:
        cells = []
        for s in servers:
            f = row.get(s)
            cells += (
                ["-"] * 3
                if f is None
                else [f"{f['cpu_us']:.0f}", f"{f['ips']:.0f}", _fmt(f["p50_ms"])]
            )
        share = row.get("ge", {}).get("main_share")
        lines.append(f"| {row['point']} | {' | '.join(cells)} | {_fmt(share)} |")
    others = servers[1:]
    if others:
        lines += ["", "ge-serve ÷ each (median of the rounds' ratios):", ""]
        heads = " | ".join(f"CPU/req ÷ {o} | infer/s ÷ {o} | p50 ÷ {o}" for o in others)
        lines += [f"| point | {heads} |", "|---" * (1 + 3 * len(others)) + "|"]
        for row in rows:
            cells = []
            for o in others:
                r = row[f"ge/{o}"]
                cells += [_fmt(r["cpu_us"]), _fmt(r["ips"]), _fmt(r["p50_ms"])]
            lines.append(f"| {row['point']} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def build_models(lab: Path, out: Path) -> Path:
    """`simple` as ../shared/peers/build_models.py builds it, alone in `out`."""
    python = lab / "venv" / "bin" / "python"
    if not python.exists():
        python = Path(sys.executable)
    script = PEERS / "build_models.py"
    subprocess.run(
        [str(python), str(script), str(out), "--only", MODEL], check=True, capture_output=True
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--against", nargs="*", default=["triton"], choices=["triton"],
        help="peers measured beside ge-serve (the bare server always is, unless --no-bare)",
    )  # fmt: skip
    parser.add_argument("--no-bare", action="store_true")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--protocols", default="grpc http json")
    parser.add_argument("--concurrency", default="1 16")
    parser.add_argument("--ge-flags", default="", help="extra ge-serve flags, one string")
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--max-trials", type=int, default=4)
    parser.add_argument("--stability", type=float, default=30)
    parser.add_argument("--wrk-seconds", type=int, default=3)
    lab = Path(os.environ.get("LAB", Path.home() / "lab"))
    parser.add_argument("--lab", type=Path, default=lab, help="run_peers.sh's LAB")
    parser.add_argument("--out", type=Path, help="OUT.md and OUT.json")
    args = parser.parse_args(argv)
    servers = ["ge", *args.against, *([] if args.no_bare else ["bare"])]
    if "triton" in servers and not (args.lab / "venv-triton").is_dir():
        print(f"{PROG}: no Triton under {args.lab} (run_peers.sh setup): left out")
        servers.remove("triton")
    protocols = args.protocols.split()
    if "json" in protocols and shutil.which("wrk") is None:
        print(f"{PROG}: wrk is not installed: json left out")
        protocols.remove("json")
    points = [(p, int(c)) for p in protocols for c in args.concurrency.split()]
    pa = find_perf_analyzer()
    rounds: list[dict[str, dict[str, Point]]] = []
    with tempfile.TemporaryDirectory(prefix="cpu-per-request-") as tmp:
        models = build_models(args.lab, Path(tmp) / "models")
        logs = Path(tmp) / "logs"
        logs.mkdir()
        script = Path(tmp) / "post.lua"
        script.write_text(WRK_SCRIPT % BODY)
        for index in range(args.rounds):
            run: dict[str, dict[str, Point]] = {}
            order = servers if index % 2 == 0 else list(reversed(servers))
            for name in order:
                with server(name, models, args, logs) as urls:
                    run[name] = {}
                    for protocol, concurrency in points:
                        point = measure(urls, protocol, concurrency, args, pa, script)
                        run[name][f"{protocol}/c{concurrency}"] = point
                        print(
                            f"round {index + 1} {name:<6} {protocol:<4} c={concurrency:<3}"
                            f" {point.cpu_us:6.0f} µs/req  {point.ips:6.0f} infer/s"
                            f"  p50 {point.p50_ms:.2f} ms",
                            flush=True,
                        )
            rounds.append(run)
    rows = summarise(rounds, servers)
    command = " ".join([PROG, *(argv if argv is not None else sys.argv[1:])])
    header = (
        f"# Server CPU per request on `{MODEL}`: ge-serve, "
        + ", ".join(servers[1:])
        + f"\n\nMedians over {args.rounds} round(s), servers alone, order alternating."
        f" `{command}`"
    )
    text = report(rows, servers, header)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text)
        raw = [{s: {k: asdict(p) for k, p in run[s].items()} for s in run} for run in rounds]
        result = {"command": command, "rounds": raw, "summary": rows}
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    return 0
