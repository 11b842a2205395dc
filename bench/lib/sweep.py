"""One perf_analyzer sweep: for each variant (a repo config plus server flags), start the
server, run perf_analyzer over each protocol and concurrency, and put raw onnxruntime's best
from the same run next to every row (measured before and after the servers run, to show
drift). Writes rows JSON, a markdown table and a PNG.

This is the latency profile (p50, p99 and throughput against concurrency): variants run one
after another, so their throughputs compare the machine's phases as much as the variants.
Compare configurations with the time-shared runner (timeshare.run_contenders) instead.

    variants = [
        Variant("off", "resnet18_like", RepoOptions(max_batch_size=32),
                flags=["--disable-auto-complete-config"]),
        Variant("dyn", "resnet18_like",
                RepoOptions(max_batch_size=32, batching=Batching(2000, [8, 16, 32]))),
        Variant("2slots", "resnet18_like", RepoOptions(instances=2)),
    ]
    rows = sweep(variants, protocols=("http", "grpc"), concurrencies=(1, 8, 32),
                 out=Path("bench/results/latency"))

`parse_variant` reads a variant from words (the latency suite's `--variant`):
  name key=value ...; keys: model, batching (on|off), delay_us, preferred, instances,
  max_batch_size, kind, backend, param.KEY=VALUE, flags="...", extra="raw pbtxt",
  shm=system (perf_analyzer sends tensors through system shared memory)
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.inputs import input_json_for
from bench.lib.models import CACHE, Batching, ensure_model, make_repo
from bench.lib.perfa import (
    SHARED_MEMORY_KINDS,
    PerfAnalyzerError,
    find_perf_analyzer,
    run_perf_analyzer,
    server_flags,
)
from bench.lib.raw_ort import DEFAULT_BATCH_SIZES, measure_raw
from bench.lib.report import add_ratio, markdown_table, plot, save_rows
from bench.lib.server import grpc_ready, serve
from bench.lib.variants import Variant


@dataclass
class Windows:
    interval_ms: int = 3000
    max_trials: int = 6
    stability: float = 20.0


def _raw_best(model: str, max_batch: int, seconds: float) -> dict[str, Any]:
    sizes = tuple(b for b in DEFAULT_BATCH_SIZES if b <= max(max_batch, 1))
    return measure_raw(ensure_model(model).onnx_path, sizes, seconds)


def sweep(
    variants: Sequence[Variant],
    protocols: Sequence[str] = ("http",),
    concurrencies: Sequence[int] = (1, 8, 32),
    out: Path | None = None,
    windows: Windows | None = None,
    raw_seconds: float = 2.0,
    use_async: bool = False,
    note: str = "",
) -> list[dict[str, Any]]:
    """Run every variant x protocol x concurrency; returns rows with model, config,
    protocol, concurrency, throughput, p50_us..p99_us, stable, raw_best, ratio_raw, command.
    A protocol whose port does not answer is skipped with a message; a perf_analyzer failure
    becomes a row with `error`. `note` ends OUT.md (e.g. the command)."""
    win = windows or Windows()
    pa = find_perf_analyzer()
    rows: list[dict[str, Any]] = []
    models = sorted({v.model for v in variants})
    max_batch = {
        m: max(
            (
                v.options.max_batch_size or ensure_model(m).default_max_batch_size
                for v in variants
                if v.model == m
            ),
            default=1,
        )
        for m in models
    }
    raw_before = {m: _raw_best(m, max_batch[m], raw_seconds) for m in models}
    for variant in variants:
        repo = make_repo(
            CACHE / "repos" / f"sweep_{variant.name}", variant.model, options=variant.options
        )
        data = input_json_for(repo / variant.model, CACHE / "inputs" / f"{variant.model}.json")
        with serve(repo, [*variant.flags, *server_flags(variant.shared_memory)]) as srv:
            urls = {"http": srv.http_url, "grpc": srv.grpc_url}
            for protocol in protocols:
                if protocol == "grpc" and not grpc_ready(srv, 3.0):
                    print(f"[{variant.name}] SKIPPED grpc: port does not answer", file=sys.stderr)
                    continue
                for concurrency in concurrencies:
                    base = {
                        "model": variant.model,
                        "config": variant.name,
                        "protocol": protocol,
                        "concurrency": concurrency,
                        "shared_memory": variant.shared_memory,
                    }
                    try:
                        row = run_perf_analyzer(
                            variant.model, urls[protocol], protocol, concurrency, data,
                            measurement_interval_ms=win.interval_ms, max_trials=win.max_trials,
                            stability_percentage=win.stability, use_async=use_async,
                            shared_memory=variant.shared_memory, perf_analyzer=pa,
                        )  # fmt: skip
                    except PerfAnalyzerError as exc:
                        print(
                            f"[{variant.name}] {protocol} c={concurrency}: {exc}", file=sys.stderr
                        )
                        rows.append({**base, "error": str(exc).splitlines()[-1][:300]})
                        continue
                    row.update(base)
                    rows.append(row)
                    print(
                        f"[{variant.name}] {protocol} c={concurrency}: "
                        f"{float(row['throughput']):.1f} infer/s p50 {row.get('p50_us')} µs "
                        f"p99 {row.get('p99_us')} µs{'' if row['stable'] else ' (unstable)'}",
                        file=sys.stderr,
                    )
    raw_after = {m: _raw_best(m, max_batch[m], raw_seconds) for m in models}
    for model in models:
        before = float(raw_before[model]["best"]["samples_per_s"])
        after = float(raw_after[model]["best"]["samples_per_s"])
        reference = (before + after) / 2
        model_rows = [r for r in rows if r["model"] == model]
        for r in model_rows:
            r["raw_best"] = reference
            r["raw_best_batch"] = raw_before[model]["best"]["batch_size"]
            r["raw_drift"] = after / before if before else None
        add_ratio(model_rows, reference)
    if out is not None:
        save_rows(rows, out.with_suffix(".json"))
        raw = {"before": raw_before, "after": raw_after}
        save_rows([raw], out.with_name(out.name + "_raw.json"))
        table = markdown_table(rows)
        lines = [table]
        for model in models:
            b, a = raw_before[model]["best"], raw_after[model]["best"]
            lines.append(
                f"\nraw onnxruntime {model} (intra_op_threads="
                f"{raw_before[model]['intra_op_threads']}): best batch {b['batch_size']} "
                f"{b['samples_per_s']:.1f} samples/s before, batch {a['batch_size']} "
                f"{a['samples_per_s']:.1f} after\n"
            )
        if note:
            lines.append(f"\n{note}\n")
        out.with_suffix(".md").write_text("".join(lines))
        ok = [r for r in rows if "throughput" in r]
        if ok:
            plot(ok, out.with_suffix(".png"), title=out.name)
    return rows


def parse_variant(words: Sequence[str]) -> Variant:
    """["name", "key=value", ...] (see the module doc for keys)."""
    name, *pairs = words
    variant = Variant(name)
    opts = variant.options
    params: dict[str, str] = {}
    batching_on: bool | None = None
    delay = 0
    preferred: list[int] = []
    flags: list[str] = []
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key == "model":
            variant.model = value
        elif key == "batching":
            batching_on = value in ("on", "true", "1")
        elif key == "delay_us":
            delay, batching_on = int(value), True if batching_on is None else batching_on
        elif key == "preferred":
            preferred = [int(p) for p in value.split(",") if p]
            batching_on = True if batching_on is None else batching_on
        elif key in ("instances", "max_batch_size"):
            setattr(opts, key, int(value))
        elif key in ("kind", "backend", "extra"):
            setattr(opts, key, value)
        elif key.startswith("param."):
            params[key.removeprefix("param.")] = value
        elif key == "flags":
            flags += shlex.split(value)
        elif key == "shm":
            if value not in SHARED_MEMORY_KINDS:
                raise ValueError(f"shm must be one of {SHARED_MEMORY_KINDS}, not {value!r}")
            variant.shared_memory = value
        else:
            raise ValueError(f"unknown variant key {key!r} in {' '.join(words)}")
    opts.params = params
    if batching_on:
        opts.batching = Batching(max_queue_delay_us=delay, preferred=preferred)
    elif batching_on is False and "--disable-auto-complete-config" not in flags:
        flags.append("--disable-auto-complete-config")
    variant.flags = flags
    return variant
