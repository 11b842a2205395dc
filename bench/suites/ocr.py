"""OCR images/s through the `ocr` pipeline (examples/ocr), at concurrency 1 and 16, with
batching on and off.

Two ge-serve processes are up at once, each serving the repository that
examples/ocr/build.py writes: `on` with `dynamic_batching` on the detector, the direction
classifier and the recogniser, `off` without it (and `--disable-auto-complete-config`, so
that none is added). In both, `ocr` has the same number of Python instances (`--instances`),
so the same number of images can be in the pipeline at once; with batching on, their BLS
calls to a model are merged into one execution when their shapes agree. Every request
carries the same PNG: lines of text rendered with Pillow (tests/ocrrepo.py). The ONNX
models run where the build puts them by default, on the GE backend (the simulated NPU
where there is no NPU, at onnxruntime's own timing); `--backend onnxruntime` puts them on
the host CPU.

At each concurrency, `concurrency` client threads (one tritonclient each) send the image
back to back to one server; after `--warmup-s` (the pipeline full, every session past its
first run of each shape) the requests that end in the next `--seconds` are counted, then
the load stops. Windows alternate between the two servers in ABBA order over rounds, so
drift on a shared machine falls on both. Reported per concurrency and server: images/s
and mean latency of the counted requests (medians over rounds), the mean batch the
detector and the recogniser ran (the server's statistics: inferences ÷ executions), and
on ÷ off (the median of each round's ratio, with the rounds' range).

    python -m bench run ocr --out bench/results/ocr                          # ~10 min
    python -m bench run ocr --out /tmp/ocr --rounds 1 --seconds 3 --warmup-s 2   # sanity

Writes OUT.json and OUT.md. Needs the `examples` extra (the rapidocr-onnxruntime wheel).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.lib.report import write_table
from bench.lib.server import ServerProcess, serve

import ocrrepo  # tests/ocrrepo.py: bench.lib.server put tests/ on the path  # isort: skip

PROG = "python -m bench run ocr"
MODEL = "ocr"
BATCHED = ("ocr_det", "ocr_cls", "ocr_rec")
SERVERS = ("on", "off")
BENCH_LINES = (
    "Invoice 2024-117, due within 30 days",
    "Item 4: replacement filter",
    "Total 1,280.00 EUR",
    "Thank you for your order",
    "Questions? Call +49 30 1234 567",
    "Page 1 of 2",
)
COLUMNS = ("concurrency", "batching", "images/s", "latency ms", "det batch", "rec batch",
           "on ÷ off", "on ÷ off range", "rounds", "images")  # fmt: skip


class Client:
    """One tritonclient for one load thread, and the image as an input tensor."""

    def __init__(self, protocol: str, srv: ServerProcess, png: bytes) -> None:
        module: Any = httpclient if protocol == "http" else grpcclient
        url = srv.http_url if protocol == "http" else srv.grpc_url
        self.client = module.InferenceServerClient(url)
        tensor = module.InferInput("image", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([png], dtype=np.object_))
        self.inputs = [tensor]

    def infer(self) -> None:
        self.client.infer(MODEL, self.inputs)

    def close(self) -> None:
        self.client.close()


def stats(srv: ServerProcess) -> dict[str, tuple[int, int]]:
    """(inference_count, execution_count) of each batched model."""
    client = httpclient.InferenceServerClient(srv.http_url)
    try:
        found = {}
        for model in BATCHED:
            entry = client.get_inference_statistics(model)["model_stats"][0]
            found[model] = (int(entry["inference_count"]), int(entry["execution_count"]))
        return found
    finally:
        client.close()


def window(
    srv: ServerProcess, clients: Sequence[Client], warmup_s: float, seconds: float
) -> dict[str, float]:
    """Every client sends back to back; after `warmup_s` (the pipeline full), the requests
    that end in the next `seconds` are counted: images/s, their mean latency, and the mean
    batch of the detector and the recogniser over that time."""
    done: list[tuple[float, float]] = []  # (end, latency) of every answered request
    errors: list[BaseException] = []
    stop = threading.Event()

    def load(client: Client) -> None:
        try:
            while not stop.is_set():
                sent = time.monotonic()
                client.infer()
                ended = time.monotonic()
                done.append((ended, ended - sent))
        except BaseException as exc:  # reported below, after every thread has ended
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=load, args=(c,)) for c in clients]
    for thread in threads:
        thread.start()
    try:
        stop.wait(warmup_s)
        start, before = time.monotonic(), stats(srv)
        stop.wait(seconds)
        end, after = time.monotonic(), stats(srv)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    if errors:
        raise RuntimeError(f"a request failed: {errors[0]}") from errors[0]
    counted = [latency for ended, latency in done if start <= ended < end]
    row = {"images": float(len(counted)), "images/s": len(counted) / (end - start),
           "latency ms": 1e3 * statistics.fmean(counted) if counted else float("nan")}  # fmt: skip
    for model, key in (("ocr_det", "det batch"), ("ocr_rec", "rec batch")):
        inferences = after[model][0] - before[model][0]
        executions = after[model][1] - before[model][1]
        row[key] = inferences / executions if executions else float("nan")
    return row


def summarise(concurrency: int, rounds: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    ratios = [
        on["images/s"] / off["images/s"]
        for on, off in zip(rounds["on"], rounds["off"], strict=True)
        if off["images/s"] > 0
    ]
    rows = []
    for name in SERVERS:
        found = rounds[name]

        def median(key: str, found: list[dict[str, float]] = found) -> float:
            return statistics.median(r[key] for r in found)

        row: dict[str, Any] = {
            "concurrency": concurrency, "batching": name, "rounds": len(found),
            "images/s": median("images/s"), "latency ms": median("latency ms"),
            "det batch": median("det batch"), "rec batch": median("rec batch"),
            "images": int(sum(r["images"] for r in found)),
        }  # fmt: skip
        if name == "on" and ratios:
            row["on ÷ off"] = statistics.median(ratios)
            row["on ÷ off range"] = f"{min(ratios):.2f}-{max(ratios):.2f}"
        rows.append(row)
    return rows


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    png = ocrrepo.render(BENCH_LINES, size=28, width=720).png
    build = ocrrepo.build_script()
    with tempfile.TemporaryDirectory(prefix="ge-serve-ocr-bench-") as tmp:
        repos = {name: Path(tmp) / name for name in SERVERS}
        for name, repo in repos.items():
            options = build.Options(
                batching=name == "on", instances=args.instances, backend=args.backend
            )
            build.build(repo, options)
        flags = {"on": ["--log-verbose", "0"],
                 "off": ["--log-verbose", "0", "--disable-auto-complete-config"]}  # fmt: skip
        with serve(repos["on"], flags["on"]) as on, serve(repos["off"], flags["off"]) as off:
            servers = {"on": on, "off": off}
            rows: list[dict[str, Any]] = []
            for concurrency in args.concurrency:
                clients = {n: [Client(args.protocol, s, png) for _ in range(concurrency)]
                           for n, s in servers.items()}  # fmt: skip
                try:
                    rounds: dict[str, list[dict[str, float]]] = {n: [] for n in SERVERS}
                    for index in range(args.rounds):
                        order = SERVERS if index % 2 == 0 else SERVERS[::-1]
                        for name in order:
                            srv, group = servers[name], clients[name]
                            found = window(srv, group, args.warmup_s, args.seconds)
                            rounds[name].append(found)
                            print(f"c{concurrency} {name} round {index + 1}: "
                                  f"{found['images/s']:.2f} images/s", file=sys.stderr)  # fmt: skip
                finally:
                    for group in clients.values():
                        for client in group:
                            client.close()
                rows += summarise(concurrency, rounds)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="path prefix for the results")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="counted, per window")
    parser.add_argument(
        "--warmup-s", type=float, default=12.0, help="load before counting, per window"
    )
    parser.add_argument("--instances", type=int, default=4, help="`ocr` Python instances")
    parser.add_argument(
        "--backend",
        choices=("npu_ge", "onnxruntime"),
        default="npu_ge",
        help="the ONNX models' backend (examples/ocr/build.py --backend)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        rows = run(args)
    except ocrrepo.build_script().WheelMissing as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    command = " ".join([PROG, *(sys.argv[1:] if argv is None else argv)])
    note = (
        f"`{command}`, {time.monotonic() - started:.0f} s. Windows alternated between the "
        "two servers (ABBA over rounds); figures are medians over rounds; on ÷ off is the "
        "median of each round's ratio. det/rec batch: inferences ÷ executions."
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_table(rows, args.out, COLUMNS, note)
    return 0
