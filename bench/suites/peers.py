"""ge-serve beside real Triton (and KServe) on the same box: ../shared/peers, run as a suite.

Each run is one `run_peers.sh peer ...` with ge-serve and Triton, the start order
alternating between runs (Triton first, then ge-serve first, ...), ge-serve being this
checkout (a wrapper that puts its `ge_serve` first on the path). Then:
- `compare.py` over the runs: ge-serve ÷ Triton, infer/s and p50, medians over runs;
- ge-serve ÷ raw onnxruntime and Triton ÷ raw onnxruntime, medians over runs (each run
  measures onnxruntime just before each peer);
- memory and start-up: ge-serve, Triton and KServe, one after another, each started with
  `run_peers.sh serve` on the four peer models: the RSS of its process group once every
  model is ready, and the time from its launch to ready; and ge-serve's start-up on
  examples/models, from the command to ready.
The table, with every command that made it, goes to OUT.md and the figures to OUT.json
(`bench/results/peers` by default: the latest run only).

    python -m bench run peers --runs 3                                   # ~25 min per run
    python -m bench run peers --runs 3 --models simple --concurrency "1 4 16"
    python -m bench run peers --runs 3 --models simple --sweep "resnet18_like/grpc/16"
    python -m bench run peers --runs 1 --models simple --protocols grpc --concurrency 1 \\
        --skip-memory                                                    # a sanity check
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.lib import peers as lib
from bench.lib.server import REPO_ROOT, serve

# ../shared/peers beside the checkout (or beside the folder of worktrees).
PEERS_DIRS = (REPO_ROOT.parent / "shared" / "peers", REPO_ROOT.parent.parent / "shared" / "peers")
DEFAULT_PEERS_DIR = next((p for p in PEERS_DIRS if p.is_dir()), PEERS_DIRS[0])
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "peers"
MEMORY_PEERS = ("ge", "triton", "kserve")
START_TRIES = 3
# Attempts at one run before it is left out.
RUN_TRIES = 3


def ge_wrapper(lab: Path, root: str) -> Path:
    """A `ge-serve` command that runs this checkout's code (`root`: its tools/pyroot.sh)."""
    path = lab / "ge-serve-this-checkout"
    path.write_text(
        "#!/bin/sh\n"
        f"PYTHONPATH={shlex.quote(root)}${{PYTHONPATH:+:$PYTHONPATH}} "
        f'exec {shlex.quote(sys.executable)} -m ge_serve.server.cli "$@"\n'
    )
    path.chmod(0o755)
    return path


def run_sweeps(args: argparse.Namespace, env: dict[str, str], log: list[str]) -> list[Path]:
    """Each run does every sweep (`--models`/`--protocols`/`--concurrency`, then each
    `--sweep`), the start order alternating between runs."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    sweeps = [(args.models, args.protocols, args.concurrency), *map(_sweep, args.sweep)]
    runs = []
    for index in range(args.runs):
        order = ["triton", "ge"] if index % 2 == 0 else ["ge", "triton"]
        for number, (models, protocols, concurrency) in enumerate(sweeps):
            sweep_env = {**env, "SWEEP_MODELS": models, "PROTOCOLS": protocols,
                         "CONCURRENCY": concurrency}  # fmt: skip
            name = f"peers-{stamp}-r{index + 1}" + (f"s{number + 1}" if number else "")
            for attempt in range(RUN_TRIES):
                run_id = name + ("" if not attempt else "abcdefgh"[attempt])
                run_env = {**sweep_env, "RUN_ID": run_id}
                command = ["bash", str(args.peers_dir / "run_peers.sh"), "peer", *order]
                log.append(_shown(run_env, command, env_keys=("RUN_ID", *_SWEEP_KEYS)))
                if subprocess.run(command, env={**os.environ, **run_env}).returncode == 0:
                    runs.append(args.lab / "results" / run_id)
                    break
                # run_peers.sh gives up on a server whose process group it checks
                # before the launch has made it (a busy host): try again.
                print(f"peers: run {run_id} failed; trying it again", file=sys.stderr)
    return runs


def _sweep(text: str) -> tuple[str, str, str]:
    """`MODELS/PROTOCOLS/CONCURRENCY`, each space-separated: "resnet18_like/grpc/16"."""
    parts = text.split("/")
    if len(parts) != 3 or not all(p.strip() for p in parts):
        raise SystemExit(f"peers: --sweep wants MODELS/PROTOCOLS/CONCURRENCY, got '{text}'")
    models, protocols, concurrency = (p.strip() for p in parts)
    return models, protocols, concurrency


_SWEEP_KEYS = ("GE_SERVE", "GE_EXTRA_FLAGS", "SWEEP_MODELS", "PROTOCOLS", "CONCURRENCY")


def _shown(env: dict[str, str], command: Sequence[str], env_keys: Sequence[str]) -> str:
    assignments = [f"{k}={shlex.quote(env[k])}" for k in env_keys if env.get(k)]
    return " ".join([*assignments, *map(shlex.quote, command)])


def memory_and_start(
    args: argparse.Namespace, env: dict[str, str], log: list[str]
) -> dict[str, dict[str, float]]:
    """Each peer alone, on the four peer models: RSS once ready, and launch to ready."""
    figures: dict[str, dict[str, float]] = {}
    models = " ".join(lib.PEER_MODELS)
    for peer in MEMORY_PEERS:
        serve_env = {**env, "SWEEP_MODELS": models}
        command = ["bash", str(args.peers_dir / "run_peers.sh"), "serve", peer]
        log.append(
            _shown(serve_env, command, env_keys=("GE_SERVE", "GE_EXTRA_FLAGS", "SWEEP_MODELS"))
        )
        pgid_file = args.lab / "run" / "server.pgid"
        before = pgid_file.stat().st_mtime if pgid_file.exists() else 0.0
        runner = subprocess.Popen(command, env={**os.environ, **serve_env}, start_new_session=True)
        try:
            ready_at = lib.wait_ready(lib.HTTP_PORT[peer], lib.PEER_MODELS, 600)
            if ready_at is None or not pgid_file.exists() or pgid_file.stat().st_mtime == before:
                print(f"peers: {peer} did not become ready", file=sys.stderr)
                continue
            # The launch wrote the pgid file: from then to ready is the start-up.
            started = time.time() - (time.monotonic() - ready_at)
            pgid = int(pgid_file.read_text().strip())
            time.sleep(1.0)  # what it allocates as its first requests come is not counted
            figures[peer] = {
                "rss_mib": lib.group_rss_bytes(pgid) / 2**20,
                "start_s": started - pgid_file.stat().st_mtime,
            }
        finally:
            os.killpg(runner.pid, signal.SIGTERM)  # run_peers.sh stops its server on exit
            runner.wait(60)
    return figures


def ge_start_on_examples(root: str, flags: Sequence[str]) -> list[float]:
    """ge-serve on examples/models: seconds from the command to ready, START_TRIES times."""
    times = []
    for _ in range(START_TRIES):
        started = time.monotonic()
        with serve(REPO_ROOT / "examples" / "models", list(flags), env={"PYTHONPATH": root}):
            times.append(time.monotonic() - started)
    return times


def table(
    compare_text: str,
    ort: dict[str, dict[Any, tuple[float, int]]],
    memory: dict[str, dict[str, float]],
    starts: list[float],
    commands: list[str],
) -> str:
    lines = ["# ge-serve beside Triton and KServe (../shared/peers)", "", compare_text, ""]
    if ort:
        lines += ["infer/s ÷ raw onnxruntime (measured just before each peer), median over runs",
                  "", "| model | proto | conc | ge ÷ ORT | triton ÷ ORT | n |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for point, (ratio, count) in ort.get("ge", {}).items():
            other = ort.get("triton", {}).get(point)
            shown = f"{other[0]:.3g}" if other else "-"
            lines.append(
                f"| {point[0]} | {point[1]} | {point[2]} | {ratio:.3g} | {shown} | {count} |"
            )
        lines.append("")
    if memory:
        lines += ["Each server alone with the four peer models loaded", "",
                  "| server | RSS MiB (process group) | launch to ready s |",
                  "|---|---|---|"]  # fmt: skip
        for peer, figures in memory.items():
            lines.append(f"| {peer} | {figures['rss_mib']:.0f} | {figures['start_s']:.1f} |")
        lines.append("")
    if starts:
        shown = ", ".join(f"{s:.2f}" for s in starts)
        lines += [f"ge-serve on examples/models, command to ready: median "
                  f"{statistics.median(starts):.2f} s ({shown}); goal < 3 s", ""]  # fmt: skip
    lines += ["Commands:", "", *(f"    {c}" for c in commands), ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench run peers")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default="simple resnet18_like")
    parser.add_argument("--protocols", default="http grpc json")
    parser.add_argument("--concurrency", default="1 4 16")
    parser.add_argument(
        "--sweep",
        action="append",
        default=[],
        help="another sweep in each run, MODELS/PROTOCOLS/CONCURRENCY ('resnet18_like/grpc/16')",
    )
    parser.add_argument("--flags", default="", help="extra ge-serve flags (GE_EXTRA_FLAGS)")
    parser.add_argument("--peers-dir", type=Path, default=DEFAULT_PEERS_DIR)
    parser.add_argument(
        "--lab", type=Path, default=Path(os.environ.get("LAB", Path.home() / "lab"))
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="OUT.md and OUT.json")
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args(argv)
    if not (args.peers_dir / "run_peers.sh").is_file():
        print(f"peers: no run_peers.sh in {args.peers_dir} (--peers-dir)", file=sys.stderr)
        return 2
    args.lab.mkdir(parents=True, exist_ok=True)
    root = subprocess.run(
        ["bash", str(REPO_ROOT / "tools" / "pyroot.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    wrapper = ge_wrapper(args.lab, root)
    env = {"LAB": str(args.lab), "GE_SERVE": str(wrapper), "GE_EXTRA_FLAGS": args.flags,
           "SWEEP_MODELS": args.models, "PROTOCOLS": args.protocols,
           "CONCURRENCY": args.concurrency}  # fmt: skip
    commands = [f"python -m bench run peers {shlex.join(argv or sys.argv[1:])}".rstrip()]
    compare_text, ort, runs = "", {}, []
    if not args.skip_sweep:
        runs = run_sweeps(args, env, commands)
        compare = lib.load_compare(args.peers_dir)
        with tempfile.NamedTemporaryFile("r", suffix=".md") as md:
            result = subprocess.run(
                [sys.executable, str(args.peers_dir / "compare.py"), *map(str, runs),
                 "--a", "ge", "--b", "triton", "--md", md.name, "--goal-ips", "1.0",
                 "--goal-p50", "1.1"],
                capture_output=True, text=True,
            )  # fmt: skip
            compare_text = result.stdout.strip()
        commands.append(f"python3 {args.peers_dir / 'compare.py'} {' '.join(map(str, runs))} "
                        "--a ge --b triton --goal-ips 1.0 --goal-p50 1.1")  # fmt: skip
        ort = {peer: lib.ort_ratios(compare.points, runs, peer) for peer in ("ge", "triton")}
    memory: dict[str, dict[str, float]] = {}
    starts: list[float] = []
    if not args.skip_memory:
        memory = memory_and_start(args, env, commands)
        starts = ge_start_on_examples(root, shlex.split(args.flags))
    text = table(compare_text, ort, memory, starts, commands)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.md").write_text(text)
    figures = {
        "runs": [str(r) for r in runs],
        "ort_ratios": {
            p: {"/".join(map(str, k)): v[0] for k, v in r.items()} for p, r in ort.items()
        },
        "memory": memory,
        "ge_start_examples_s": starts,
    }
    lib.write_json(Path(f"{args.out}.json"), figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
