"""What metrics cost: throughput on `simple` at concurrency 16, metrics on versus off.

Two ge-serve processes run side by side, one with the default metrics (summaries and
histograms on) and one with `--allow-metrics=false`. perf_analyzer measures them in
alternating short rounds (ABBA order, so drift on a shared machine falls on both), and
the result is the ratio of the medians, from one run.

The rounds are split over `--sessions` pairs of servers, started in alternating order
(bench/abba.py says why).
`--control` adds an A/A check: two identical metrics-on servers measured the same way,
whose ratio shows the noise floor of the method in the same run.

    PYTHONPATH=$(tools/pyroot.sh) python3 bench/metrics_overhead.py          # 2 x 6 rounds of 3 s
    PYTHONPATH=$(tools/pyroot.sh) python3 bench/metrics_overhead.py --quick  # smoke run

perf_analyzer comes from bench/setup_perf_analyzer.sh (or $PERF_ANALYZER / PATH); where it
cannot run, `--load python` uses an asyncio tritonclient loop instead, and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import httpx
import numpy as np
from abba import ServerSpec, compare
from inputs import input_json_for
from perfa import PerfAnalyzerUnavailable, find_perf_analyzer, run_perf_analyzer

from server import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
SIMPLE_REPO = ROOT / "examples" / "models"
FLAGS = ("--model-control-mode", "explicit", "--load-model", "simple")
CONFIGS = {
    "metrics on": ServerSpec(SIMPLE_REPO, FLAGS),
    "metrics off": ServerSpec(SIMPLE_REPO, (*FLAGS, "--allow-metrics=false")),
}
SUCCESS_RE = re.compile(r'nv_inference_request_success\{model="simple"[^}]*\} (\S+)')
# The A/A control: the same flags twice.
CONTROL = {"metrics on (A)": CONFIGS["metrics on"], "metrics on (B)": CONFIGS["metrics on"]}


def locate_perf_analyzer() -> tuple[str, dict[str, str]] | None:
    """bench's setup (cached, never installing here), then $PERF_ANALYZER and PATH."""
    with contextlib.suppress(PerfAnalyzerUnavailable):
        return find_perf_analyzer(install=False)
    env = dict(os.environ)
    with contextlib.suppress(ImportError):
        import nvidia.cuda_runtime as cuda_runtime  # libcudart.so.12, loaded, never used

        libs = [str(Path(p) / "lib") for p in cuda_runtime.__path__]
        env["LD_LIBRARY_PATH"] = ":".join([*libs, env.get("LD_LIBRARY_PATH", "")])
    for candidate in (os.environ.get("PERF_ANALYZER", ""), shutil.which("perf_analyzer") or ""):
        if candidate and subprocess.run([candidate, "--version"], env=env).returncode == 0:
            return candidate, env
    return None


def perf_analyzer_round(
    tool: tuple[str, dict[str, str]], url: str, data: Path, concurrency: int, seconds: float
) -> float:
    row = run_perf_analyzer(
        "simple",
        url,
        "http",
        concurrency,
        data,
        measurement_interval_ms=max(200, int(seconds * 1000)),
        max_trials=3,
        stability_percentage=100,
        perf_analyzer=tool,
    )
    return float(row["throughput"])


async def python_round(url: str, concurrency: int, seconds: float) -> float:
    import tritonclient.http.aio as aioclient

    client = aioclient.InferenceServerClient(url, conn_limit=concurrency)
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds per session")
    parser.add_argument(
        "--sessions", type=int, default=2, help="server pairs, started in alternating order"
    )
    parser.add_argument("--control", action="store_true", help="also run the A/A control")
    parser.add_argument("--seconds", type=float, default=3.0, help="measurement per round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 1 s: a smoke run")
    parser.add_argument("--load", choices=["perf_analyzer", "python"], default="perf_analyzer")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.rounds, args.seconds = 2, 2, 1.0

    tool = locate_perf_analyzer() if args.load == "perf_analyzer" else None
    if args.load == "perf_analyzer" and tool is None:
        print(
            "perf_analyzer cannot run here (bench/setup_perf_analyzer.sh sets it up); "
            "use --load python for a Python load generator",
            file=sys.stderr,
        )
        return 2
    load = "perf_analyzer" if tool else "python (tritonclient.http.aio)"
    work = Path(tempfile.mkdtemp(prefix="metrics-overhead-"))
    data = input_json_for(SIMPLE_REPO / "simple", work / "simple.json")

    def measure(name: str, server: ServerProcess) -> dict[str, float]:
        url = server.http_url
        if tool is not None:
            value = perf_analyzer_round(tool, url, data, args.concurrency, args.seconds)
        else:
            value = asyncio.run(python_round(url, args.concurrency, args.seconds))
        return {"infer/s": value}

    counted = ["?"]

    def count_successes(servers: Mapping[str, ServerProcess]) -> None:
        with contextlib.suppress(httpx.HTTPError):
            text = httpx.get(servers["metrics on"].metrics_url, timeout=10).text
            found = SUCCESS_RE.search(text)
            counted[0] = found.group(1) if found else "?"

    try:
        rows = compare(CONFIGS, args.sessions, args.rounds, measure, count_successes)
        control_rows = compare(CONTROL, args.sessions, args.rounds, measure) if args.control else {}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = {name: [row["infer/s"] for row in found] for name, found in rows.items()}
    control = {name: [row["infer/s"] for row in found] for name, found in control_rows.items()}

    on = statistics.median(results["metrics on"])
    off = statistics.median(results["metrics off"])
    print(f"\nload generator: {load}; simple over HTTP at concurrency {args.concurrency}")
    print(
        f"{args.sessions} sessions x {args.rounds} rounds x {args.seconds:g} s per configuration, "
        "alternating (ABBA), server start order swapped per session\n"
    )
    print("| configuration | median infer/s | min | max |\n|---|---|---|---|")
    for name, values in {**results, **control}.items():
        print(
            f"| {name} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |"
        )
    print(
        f"\nratio on/off: {on / off:.3f} (throughput lost to metrics: {(1 - on / off) * 100:.1f}%)"
    )
    # Rounds measure the two servers back to back: the median of those pairs' ratios is less
    # sensitive to slow drift than the ratio of the medians.
    paired = statistics.median(
        a / b for a, b in zip(results["metrics on"], results["metrics off"], strict=True)
    )
    print(f"median of the per-round on/off ratios: {paired:.3f}")
    control_ratio = None
    if control:
        a, b = (statistics.median(v) for v in control.values())
        control_ratio = a / b
        print(f"A/A control ratio (identical servers): {control_ratio:.3f}")
    print(f"the metrics-on server counted {counted[0]} successful requests (last session)")
    if args.json:
        summary = {
            "load": load,
            "concurrency": args.concurrency,
            "sessions": args.sessions,
            "rounds": args.rounds,
            "seconds": args.seconds,
            "infer_per_s": results,
            "ratio_on_off": on / off,
            "paired_ratio_on_off": paired,
            "control_infer_per_s": control,
            "control_ratio": control_ratio,
        }
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
