"""Adaptive batching against the static settings and raw onnxruntime, time-shared (issue 5).

The same comparison as bench/adaptive_vs_static.py, measured with bench/timeshare.py: per
model and protocol, every contender is up at once and they take turns in short slices,
frozen in between, so that all of them sample this machine's 2x speed swings alike:

* concurrency 32, one server each: the static settings of bench/batching.py (`static0`,
  `static`, `static3ms` on `simple`) and `adaptive`;
* concurrency 1, one server each: `off` (unbatched) and `adaptive`;
* raw onnxruntime at every batch size up to the model's maximum (bench/raw_worker.py).

Reported per contender: infer/s over the time it ran; ÷ raw onnxruntime's best size in the
same run; and against adaptive: at c=32 adaptive's throughput ÷ this setting's, at c=1
adaptive's mean latency ÷ unbatched (at one client, mean latency = 1 ÷ throughput). Each
ratio comes with a 90 % bootstrap interval over cycles. perf_analyzer drives the load but
never reports (it is killed after the run): counts come from the server's statistics.
p50s are not measured here; bench/adaptive_vs_static.py measures them.

    export PYTHONPATH=$(tools/pyroot.sh)
    python3 bench/adaptive_timeshare.py --out bench/results/adaptive_timeshare_simple \\
        --models simple
    python3 bench/adaptive_timeshare.py --out bench/results/adaptive_timeshare_c1 \\
        --models simple --concurrency 1 --raw-sizes --cycles 100 --slice-s 1
    python3 bench/adaptive_timeshare.py --out bench/results/adaptive_timeshare_cnn_grpc \\
        --models resnet18_like --protocol grpc --slice-s 3 --cycles 40 --max-frozen-s 25 \\
        --warmup-s 12
    python3 bench/adaptive_timeshare.py --out /tmp/t --models simple --cycles 3   # smoke

The CNN at c=32 needs slices of a few batches, hence gRPC and `--max-frozen-s`: its
executions (~0.7 s) outlast a 0.6 s slice, so nearly every one is frozen part-way, and the
controller, which prices each by its slot time, cut its batches to a mean of 2.9 against
~30 in steady runs (bench/results/adaptive_timeshare_cnn_http.md).

At most 5 contenders at the default 0.6 s slices (none may stay frozen 5 s over HTTP: see
bench/timeshare.py), hence the c=32 and c=1 servers in separate runs, and raw onnxruntime
at 8 and 16 only by default: at 1-32 its medians here were within 2 % of each other from 4
up (40.2, 40.7, 40.2, 39.9 samples/s at 4, 8, 16, 32), 1 and 2 lower. gRPC connections
survived 12 s freezes, so with `--protocol grpc` alone `--max-frozen-s` may raise the
limit, for slices long enough to hold several CNN batches.

Writes OUT.json, OUT.md and OUT_slices.json (every slice; `--from-slices` summarises one
again). Ctrl-C or SIGTERM stop the run and every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NamedTuple

from batching import SHORT, TWO_SLOTS, variants
from inputs import input_json_for
from models import CACHE, ensure_model, make_repo
from perfa import find_perf_analyzer
from report import write_table
from timeshare import (
    MAX_FROZEN_S,
    RawLoad,
    ServerLoad,
    Slice,
    rate,
    ratio_interval,
    slice_work,
    slices_from_json,
    slices_to_json,
    take_turns,
    warm,
)

from server import grpc_ready, serve

THROUGHPUT_AT = 32
LATENCY_AT = 1
THROUGHPUT_CONFIGS = ("static0", "static", "static3ms", "adaptive")
LATENCY_CONFIGS = ("off", "adaptive")
RAW = "raw b"  # prefix of the raw contenders' names, then the batch size
RAW_SIZES = (8, 16)


def contender_names(
    model: str,
    concurrencies: Sequence[int],
    twins: Sequence[str] = (),
    configs: Sequence[str] | None = None,
) -> list[tuple[str, str, int]]:
    """(contender name, batching variant, concurrency) for `model`'s servers. Each of
    `twins` gets a second, identical server (named with a prime, "static0' c32"): the pair
    shows how far apart two servers of the same setting measure (an A/A control).
    `configs` replaces the c=32 servers' settings (any of bench/batching.py's variants)."""
    short = SHORT.get(model, model)
    known = {v.name.removesuffix(f"-{short}") for v in variants(model)}
    unknown = set(configs or ()) - known
    if unknown:
        raise ValueError(f"{model} has no variant {sorted(unknown)}; it has {sorted(known)}")
    groups = {THROUGHPUT_AT: configs or THROUGHPUT_CONFIGS, LATENCY_AT: LATENCY_CONFIGS}
    found = []
    for clients in concurrencies:
        for config in (c for c in groups[clients] if c in known):
            found.append((f"{config} c{clients}", config, clients))
            if config in twins:
                found.append((f"{config}' c{clients}", config, clients))
    return found


class Measured(NamedTuple):
    slices: dict[str, list[Slice]]
    mean_batch: dict[str, float | None]
    threads_lost: dict[str, int]  # perf_analyzer's load threads that died during the run


def run(
    model: str,
    protocol: str,
    cycles: int,
    slice_s: float,
    warmup_s: float,
    shared_memory: bool,
    concurrencies: Sequence[int],
    raw_sizes: Sequence[int],
    twins: Sequence[str] = (),
    max_frozen_s: float = MAX_FROZEN_S,
    configs: Sequence[str] | None = None,
    raw_slots: Sequence[int] = (1,),
) -> Measured:
    """Every contender's slices for one model and protocol, and each server's mean batch."""
    short = SHORT.get(model, model)
    by_variant = {v.name.removesuffix(f"-{short}"): v for v in variants(model)}
    data = CACHE / "inputs" / f"{model}.json"
    tool = find_perf_analyzer()
    onnx_path = ensure_model(model).onnx_path

    def log(line: str) -> None:
        print(f"[{model} {protocol}] {line}", file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="timeshare-")))
        # Servers first (idle), then raw workers (each paused once it counts), then the
        # loads, which start frozen: nothing waits frozen while another starts.
        servers = []
        for name, config, concurrency in contender_names(model, concurrencies, twins, configs):
            variant = by_variant[config]
            repo = make_repo(CACHE / "repos" / f"h2h_{variant.name}", model,
                             options=variant.options)  # fmt: skip
            input_json_for(repo / model, data)
            server = stack.enter_context(serve(repo, list(variant.flags)))
            if protocol == "grpc" and not grpc_ready(server, 10.0):
                raise RuntimeError(f"{name}: gRPC did not come up")
            servers.append((name, server, concurrency))
        raws: list[RawLoad] = []
        for size in raw_sizes:
            for slots in raw_slots:
                name = f"{RAW}{size}" + (f" x{slots}" if slots > 1 else "")
                raw = stack.enter_context(RawLoad(name, onnx_path, size, workdir, slots))
                warm(raw, 0.5)
                raws.append(raw)
        loads = [
            stack.enter_context(
                ServerLoad(name, server, model, protocol, concurrency, data, tool, workdir,
                           shared_memory="system" if shared_memory else "none")
            )
            for name, server, concurrency in servers
        ]  # fmt: skip
        contenders: list[ServerLoad | RawLoad] = [*loads, *raws]
        warmup = max(1, round(warmup_s / slice_s))
        log(f"{len(contenders)} contenders: {warmup} cycles of warm-up, then {cycles} cycles "
            f"of {slice_s} s slices")  # fmt: skip
        take_turns(contenders, warmup, slice_s, max_frozen_s=max_frozen_s)
        for load in loads:
            load.mark_threads()
            load.restart_batches()
        slices = take_turns(contenders, cycles, slice_s, log=log, max_frozen_s=max_frozen_s)
        for contender in contenders:
            contender.check()  # a load that died would read as slow
        lost = {load.name: load.threads_lost() for load in loads}
        if any(lost.values()):
            log(f"perf_analyzer threads lost (the load ran on at a lower concurrency): {lost}")
        return Measured(slices, {load.name: load.mean_batch() for load in loads}, lost)


def adaptive_for(contender: str) -> str:
    """The adaptive server a server contender is compared with: the one at the same
    concurrency with as many slots ("static0x2 c32" -> "adaptivex2 c32"; a twin, with a
    prime, as its original)."""
    config, clients = contender.rsplit(" c", 1)
    slots = TWO_SLOTS if config.rstrip("'").endswith(TWO_SLOTS) else ""
    return f"adaptive{slots} c{clients}"


def _interval(low_high: tuple[float, float]) -> str:
    return f"{low_high[0]:.3f}-{low_high[1]:.3f}"


def summarize(
    model: str,
    protocol: str,
    slices: Mapping[str, Sequence[Slice]],
    mean_batch: Mapping[str, float | None] | None = None,
    threads_lost: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """The table's rows for one model and protocol."""
    work = {name: slice_work(found) for name, found in slices.items()}
    rates = {name: rate(w) for name, w in work.items()}
    raws = {name: r for name, r in rates.items() if name.startswith(RAW)}
    raw_best = max(raws, key=lambda n: raws[n]) if raws else None
    rows: list[dict[str, Any]] = []
    for name, value in rates.items():
        row: dict[str, Any] = {"model": model, "protocol": protocol, "contender": name,
                               "infer/s": value, "slices": len(work[name])}  # fmt: skip
        if raw_best is not None and not name.startswith(RAW):
            row["÷ raw best"] = value / raws[raw_best]
            row["÷ raw 90%"] = _interval(ratio_interval(work[name], work[raw_best]))
        versus = None if name.startswith(RAW) else adaptive_for(name)
        if versus in work and versus != name:
            clients = int(name.rsplit(" c", 1)[1])
            if clients == THROUGHPUT_AT:
                row["adaptive ÷ it"] = rates[versus] / value  # throughput
                row["adaptive 90%"] = _interval(ratio_interval(work[versus], work[name]))
            else:
                row["adaptive ÷ it"] = value / rates[versus]  # mean latency = 1 / throughput
                row["adaptive 90%"] = _interval(ratio_interval(work[name], work[versus]))
        row["mean batch"] = (mean_batch or {}).get(name)
        row["threads lost"] = (threads_lost or {}).get(name)
        row["raw best"] = raw_best
        rows.append(row)
    return rows


COLUMNS = ("model", "protocol", "contender", "infer/s", "÷ raw best", "÷ raw 90%",
           "adaptive ÷ it", "adaptive 90%", "mean batch", "threads lost", "slices",
           "raw best")  # fmt: skip


NOTE = (
    "Time-shared (bench/timeshare.py): all contenders up, one running at a time in slices, "
    "in random order. `adaptive ÷ it`: at c=32 adaptive's throughput ÷ this setting's (≥ 1: "
    "adaptive as fast or faster); at c=1 adaptive's mean latency ÷ unbatched (≤ 1: as fast "
    "or faster). Intervals: 90 % bootstrap over runs of consecutive cycles "
    "(timeshare.ratio_interval)."
)


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds the `with` blocks: every process we started ends


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="path prefix for the results")
    parser.add_argument("--models", nargs="+", default=["simple", "resnet18_like"])
    parser.add_argument("--protocol", nargs="+", default=["http", "grpc"])
    parser.add_argument("--cycles", type=int, default=150)
    parser.add_argument(
        "--slice-s", type=float, default=0.6, help="2 x (contenders - 1) x slice: under 4.9 s"
    )
    parser.add_argument(
        "--concurrency", type=int, nargs="+", choices=(THROUGHPUT_AT, LATENCY_AT),
        default=[THROUGHPUT_AT], help="which servers: the c=32 ones, the c=1 ones",
    )  # fmt: skip
    parser.add_argument(
        "--warmup-s", type=float, default=6.0, help="per contender: turns taken, not counted"
    )
    parser.add_argument("--shared-memory", action="store_true")
    parser.add_argument(
        "--raw-sizes", type=int, nargs="*", help="default: 8 and 16, up to the model's maximum"
    )
    parser.add_argument(
        "--twin", nargs="*", default=[], metavar="CONFIG",
        help="a second, identical server for each (an A/A control), e.g. --twin static0",
    )  # fmt: skip
    parser.add_argument(
        "--raw-slots", type=int, nargs="+", default=[1], metavar="N",
        help="raw onnxruntime as N sessions in parallel, the threads split as for N slots",
    )  # fmt: skip
    parser.add_argument(
        "--configs", nargs="+", metavar="CONFIG",
        help="the c=32 servers' settings instead of the default ones, e.g. static0x2 adaptivex2",
    )  # fmt: skip
    parser.add_argument(
        "--max-frozen-s", type=float, default=MAX_FROZEN_S,
        help="gRPC only: longer freezes, for longer slices (HTTP's keep-alive closes at 5 s)",
    )  # fmt: skip
    parser.add_argument("--from-slices", type=Path, help="measure nothing: summarise again")
    args = parser.parse_args(argv)
    if args.max_frozen_s > MAX_FROZEN_S and "http" in args.protocol:
        parser.error(f"--max-frozen-s over {MAX_FROZEN_S} needs --protocol grpc (see timeshare.py)")
    command = " ".join(["python3 bench/adaptive_timeshare.py", *(argv or sys.argv[1:])])
    if args.from_slices is not None:
        saved = json.loads(args.from_slices.read_text())
        again: list[dict[str, Any]] = []
        for label, found in saved.items():
            model, protocol = label.split(" ", 1)
            again += summarize(model, protocol, slices_from_json(found["slices"]),
                               found["mean batch"], found["threads lost"])  # fmt: skip
        note = f"`{command}`: {args.from_slices}, summarised. {NOTE}"
        write_table(again, args.out, COLUMNS, note)
        return 0
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    started = time.monotonic()
    measured: dict[str, dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    slices_path = args.out.with_name(args.out.name + "_slices.json")
    for model in args.models:
        max_batch = ensure_model(model).default_max_batch_size
        sizes = [b for b in RAW_SIZES if b <= max_batch]
        if args.raw_sizes is not None:  # `--raw-sizes` alone: none
            sizes = args.raw_sizes
        for protocol in args.protocol:
            label = protocol + (" +shm" if args.shared_memory else "")
            found = run(model, protocol, args.cycles, args.slice_s, args.warmup_s,
                        args.shared_memory, args.concurrency, sizes, args.twin,
                        args.max_frozen_s, args.configs, args.raw_slots)  # fmt: skip
            measured[f"{model} {label}"] = {"slices": slices_to_json(found.slices),
                                            "mean batch": found.mean_batch,
                                            "threads lost": found.threads_lost}  # fmt: skip
            slices_path.write_text(json.dumps(measured) + "\n")  # kept as each run ends
            rows += summarize(model, label, found.slices, found.mean_batch, found.threads_lost)
    note = f"`{command}`, {time.monotonic() - started:.0f} s. {NOTE}"
    write_table(rows, args.out, COLUMNS, note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
