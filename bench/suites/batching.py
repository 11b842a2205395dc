"""Adaptive batching against the static settings and raw onnxruntime, time-shared.

Per model and protocol, every contender is up at once and they take turns in short slices,
frozen in between (bench/lib/timeshare.py), so that all of them sample the machine's speed
swings alike:

* concurrency 32, one server each: the static settings (`static0`, `static`, `static3ms`
  on `simple`; bench/lib/variants.py) and `adaptive`, or the settings `--configs` names;
* concurrency 1, one server each: `off` (unbatched) and `adaptive`;
* raw onnxruntime at 8 and 16 by default (`--raw-sizes`), as `--raw-slots` sessions.

Reported per contender: infer/s over the time it ran; ÷ raw onnxruntime's best size in the
same run; and against adaptive: at c=32 adaptive's throughput ÷ this setting's, at c=1
adaptive's mean latency ÷ unbatched (at one client, mean latency = 1 ÷ throughput). Each
ratio comes with a 90 % bootstrap interval over runs of consecutive cycles. perf_analyzer
drives the load but never reports (it is killed after the run): counts come from the
server's statistics, so no percentiles; the latency suite profiles p50 and p99.

    python -m bench run batching --out bench/results/batching_simple_http --models simple \\
        --protocol http
    python -m bench run batching --out bench/results/batching_c1_simple --models simple \\
        --concurrency 1 --raw-sizes --cycles 100 --slice-s 1
    python -m bench run batching --out /tmp/t --models simple --cycles 3      # smoke

At most 5 contenders at the default 0.6 s slices (none may stay frozen 5 s over HTTP: see
bench/lib/timeshare.py), hence the c=32 and c=1 servers in separate runs, and two raw
sizes by default: raw onnxruntime's samples/s hardly changes from batch 4 up.

A model whose executions outlast a slice (the CNN at c=32: a batch of ~30 takes most of a
0.6 s slice) is frozen inside nearly every execution, and the controller, which prices each
batch by its slot time, then cuts its batches far below those of a steady run. Such a model
needs slices of a few batches, so gRPC alone (its connections survive long freezes) and
`--max-frozen-s`:

    python -m bench run batching --out bench/results/batching_cnn_x2_run1 \\
        --models resnet18_like --protocol grpc --slice-s 3 --cycles 60 --max-frozen-s 25 \\
        --warmup-s 12 --shared-memory --configs static0x2 staticx2 adaptivex2 \\
        --raw-sizes 8 16 --raw-slots 2

`--configs`: the c=32 servers' settings; the `x2` ones run two one-thread slots and are
compared with `adaptivex2`. `--twin CONFIG` adds an identical second server of a setting
(an A/A control). Writes OUT.json, OUT.md, OUT.png and OUT_slices.json (every slice;
`--from-slices F [F ...]` summarises again, pooling the runs of one label found in several
files). Ctrl-C or SIGTERM stop the run and every process it started.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.lib.inputs import input_json_for
from bench.lib.models import CACHE, ensure_model, make_repo
from bench.lib.timeshare import (
    MAX_FROZEN_S,
    Measured,
    ServerContender,
    Slice,
    load_runs,
    run_contenders,
    save_runs,
)
from bench.lib.timeshare_suite import (
    ResultsLayout,
    command_line,
    log_for,
    raw_contenders,
    slices_path,
    suite_parser,
)
from bench.lib.timeshare_summary import Pooled, stop_on_sigterm
from bench.lib.variants import TWO_SLOTS, batching_variants, setting

PROG = "python -m bench run batching"
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
    """(contender name, batching setting, concurrency) for `model`'s servers. Each of
    `twins` gets a second, identical server (named with a prime, "static0' c32"): the pair
    shows how far apart two servers of the same setting measure (an A/A control).
    `configs` replaces the c=32 servers' settings (any of the model's batching variants)."""
    known = {setting(v) for v in batching_variants(model)}
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
    by_setting = {setting(v): v for v in batching_variants(model)}
    data = CACHE / "inputs" / f"{model}.json"
    servers = []
    for name, config, concurrency in contender_names(model, concurrencies, twins, configs):
        variant = replace(by_setting[config], shared_memory="system" if shared_memory else "none")
        repo = make_repo(CACHE / "repos" / f"h2h_{variant.name}", model, options=variant.options)
        input_json_for(repo / model, data)
        servers.append(ServerContender(name, repo, variant.flags, model, protocol, concurrency,
                                       data, variant.shared_memory))  # fmt: skip
    onnx_path = ensure_model(model).onnx_path
    raws = raw_contenders(RAW, onnx_path, raw_sizes, raw_slots)
    log = log_for(f"{model} {protocol}")
    return run_contenders(servers, raws, cycles, slice_s, warmup_s, max_frozen_s, log)


def adaptive_for(contender: str) -> str:
    """The adaptive server a server contender is compared with: the one at the same
    concurrency with as many slots ("static0x2 c32" -> "adaptivex2 c32"; a twin, with a
    prime, as its original)."""
    config, clients = contender.rsplit(" c", 1)
    slots = TWO_SLOTS if config.rstrip("'").endswith(TWO_SLOTS) else ""
    return f"adaptive{slots} c{clients}"


def summarize(
    model: str,
    protocol: str,
    slices: Mapping[str, Sequence[Slice]],
    mean_batch: Mapping[str, float | None] | None = None,
    threads_lost: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """The table's rows for one model and protocol, from one run."""
    run = Measured(
        {name: list(found) for name, found in slices.items()},
        dict(mean_batch or {}),
        dict(threads_lost or {}),
    )
    return summarize_runs(model, protocol, [run])


def summarize_runs(model: str, protocol: str, runs: Sequence[Measured]) -> list[dict[str, Any]]:
    """The table's rows for one model and protocol, pooled over `runs` of the same
    contenders (timeshare.Pooled)."""
    pooled = Pooled(runs)
    rates = pooled.rates
    raw_best = pooled.best(RAW)
    rows: list[dict[str, Any]] = []
    for name in pooled.names:
        value = rates[name]
        row: dict[str, Any] = {"model": model, "protocol": protocol, "contender": name,
                               "infer/s": value, "slices": pooled.slices(name)}  # fmt: skip
        if raw_best is not None and not name.startswith(RAW):
            row["÷ raw best"] = value / rates[raw_best]
            row["÷ raw 90%"] = pooled.interval(name, raw_best)
        versus = None if name.startswith(RAW) else adaptive_for(name)
        if versus in rates and versus != name:
            clients = int(name.rsplit(" c", 1)[1])
            if clients == THROUGHPUT_AT:
                row["adaptive ÷ it"] = rates[versus] / value  # throughput
                row["adaptive 90%"] = pooled.interval(versus, name)
            else:
                row["adaptive ÷ it"] = value / rates[versus]  # mean latency = 1 / throughput
                row["adaptive 90%"] = pooled.interval(name, versus)
        row["mean batch"] = pooled.mean_batch(name)
        row["threads lost"] = pooled.threads_lost(name)
        row["raw best"] = raw_best
        rows.append(row)
    return rows


COLUMNS = ("model", "protocol", "contender", "infer/s", "÷ raw best", "÷ raw 90%",
           "adaptive ÷ it", "adaptive 90%", "mean batch", "threads lost", "slices",
           "raw best")  # fmt: skip


NOTE = (
    "Time-shared (bench/lib/timeshare.py): all contenders up, one running at a time in "
    "slices, in random order. `adaptive ÷ it`: at c=32 adaptive's throughput ÷ this "
    "setting's (≥ 1: adaptive as fast or faster); at c=1 adaptive's mean latency ÷ unbatched "
    "(≤ 1: as fast or faster). Intervals: 90 % bootstrap over runs of consecutive cycles "
    "(timeshare.ratio_interval)."
)


LAYOUT = ResultsLayout(
    COLUMNS,
    [
        ("÷ raw best", "÷ raw 90%", "÷ raw onnxruntime's best"),
        ("adaptive ÷ it", "adaptive 90%", "adaptive ÷ this setting"),
    ],
    plot_if=("÷ raw best", "adaptive ÷ it"),
    title=lambda rows: f"{rows[0]['model']}: time-shared, 90 % intervals",
    label=lambda row: f"{row['protocol']} {row['contender']}",
)


def resummarize(
    paths: Sequence[Path], models: Sequence[str], protocols: Sequence[str]
) -> list[dict[str, Any]]:
    """The rows of saved runs (OUT_slices.json files), those of one label pooled."""
    rows: list[dict[str, Any]] = []
    for label, runs in load_runs(paths).items():
        model, protocol = label.split(" ", 1)
        if model in models and protocol.split(" ", 1)[0] in protocols:
            rows += summarize_runs(model, protocol, runs)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = suite_parser(PROG, __doc__)
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
    parser.add_argument(
        "--from-slices", type=Path, nargs="+", metavar="SLICES_JSON",
        help="measure nothing: summarise saved runs again (one label in several files: pooled)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.max_frozen_s > MAX_FROZEN_S and "http" in args.protocol:
        parser.error(f"--max-frozen-s over {MAX_FROZEN_S} needs --protocol grpc (see timeshare)")
    command = command_line(PROG, argv)
    if args.from_slices is not None:
        again = resummarize(args.from_slices, args.models, args.protocol)
        if not again:
            parser.error("no saved run matches --models and --protocol")
        sources = ", ".join(str(p) for p in args.from_slices)
        pooled = " (runs of one label pooled)" if len(args.from_slices) > 1 else ""
        LAYOUT.write(again, args.out, f"`{command}`: {sources}, summarised{pooled}. {NOTE}")
        return 0
    stop_on_sigterm()
    started = time.monotonic()
    measured: dict[str, Measured] = {}
    rows: list[dict[str, Any]] = []
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
            measured[f"{model} {label}"] = found
            save_runs(measured, slices_path(args.out))  # kept as each run ends
            rows += summarize(model, label, found.slices, found.mean_batch, found.threads_lost)
    note = f"`{command}`, {time.monotonic() - started:.0f} s. {NOTE}"
    LAYOUT.write(rows, args.out, note)
    return 0
