"""The suites `python -m bench run` knows, by name. Each is a module with
`main(argv) -> int`, imported only when it runs."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Suite:
    name: str
    module: str
    summary: str


SUITES: tuple[Suite, ...] = (
    Suite(
        "batching",
        "bench.suites.batching",
        "adaptive batching against the static settings and raw onnxruntime, time-shared",
    ),
    Suite(
        "protocols",
        "bench.suites.protocols",
        "HTTP, gRPC and gRPC streaming on `simple`, and raw onnxruntime, time-shared",
    ),
    Suite(
        "slots",
        "bench.suites.slots",
        "GE executor slots on the simulated NPU: 2 slots against 1, time-shared",
    ),
    Suite(
        "npu-sim",
        "bench.suites.npu_sim",
        "batching on the simulated NPU with the calibrated --sim-cost (simulated timing)",
    ),
    Suite(
        "metrics-overhead",
        "bench.suites.metrics_overhead",
        "what metrics cost: metrics on against --allow-metrics=false, time-shared",
    ),
    Suite(
        "scheduler-overhead",
        "bench.suites.scheduler_overhead",
        "the scheduler's event-loop CPU per request, in process, no transport",
    ),
    Suite(
        "peers",
        "bench.suites.peers",
        "ge-serve beside real Triton and KServe (../shared/peers): ratios, memory, start-up",
    ),
    Suite(
        "ceiling",
        "bench.suites.ceiling",
        "ge-serve against a bare uvicorn/grpc.aio server on `simple`: the frameworks' share",
    ),
    Suite(
        "cpu-per-request",
        "bench.suites.cpu_per_request",
        "server CPU per request, ge-serve against Triton and the bare frameworks, each alone",
    ),
    Suite(
        "cpu-threads",
        "bench.cpu_per_request",
        "ge-serve's CPU per request per thread, one Python client, py-spy; or two checkouts",
    ),
    Suite(
        "priority",
        "bench.suites.priority",
        "each priority level's p50/p99 while low priority saturates the server",
    ),
    Suite(
        "latency",
        "bench.suites.latency",
        "perf_analyzer profile: infer/s, p50, p99 against concurrency, raw ORT alongside",
    ),
    Suite(
        "smoke",
        "bench.suites.smoke",
        "under a minute: proves server, perf_analyzer and raw onnxruntime work together",
    ),
    Suite(
        "buckets",
        "bench.suites.buckets",
        "shape-bucketed against exact-shape batching, BERT-sized, mixed lengths, sim NPU",
    ),
    Suite(
        "embeddings",
        "bench.suites.embeddings",
        "the minilm pipeline: sentences/s at c=1 and 16, batching on and off, time-shared",
    ),
    Suite(
        "python-backend",
        "bench.suites.python_backend",
        "Python-backend add_sub against the same ONNX computation, c=1 and 16, time-shared",
    ),
    Suite(
        "generation",
        "bench.suites.generation",
        "SmolLM2 over /v1: in-flight vs request-level vs none, ge vs llama-server, per step",
    ),
    Suite("soak", "bench.soak", "a long run under steady load (bench/soak/)"),
    Suite(
        "shutdown",
        "bench.shutdown_under_load",
        "stopping the server under load (bench/shutdown_under_load.py)",
    ),
    Suite(
        "ocr",
        "bench.suites.ocr",
        "OCR images/s (examples/ocr) at concurrency 1 and 16, batching on and off",
    ),
    Suite(
        "efficientnet",
        "bench.suites.efficientnet",
        "EfficientNet-Lite0 images/s and p50 at c=1 and 32: batching off, Triton's, adaptive",
    ),
    Suite(
        "ensemble-overhead",
        "bench.ensemble_overhead",
        "server time per ensemble step against one model (bench/ensemble_overhead.py)",
    ),
)


class SuiteMissing(LookupError):
    """A known suite whose module is not in this checkout."""


def find(name: str) -> Suite:
    for suite in SUITES:
        if suite.name == name:
            return suite
    known = ", ".join(s.name for s in SUITES)
    raise KeyError(f"no suite {name!r}; the suites are: {known}")


def entry(suite: Suite) -> Callable[[Sequence[str]], int]:
    """The suite's `main`, imported now. SuiteMissing when its module is absent."""
    try:
        module = importlib.import_module(suite.module)
    except ModuleNotFoundError as exc:
        if exc.name != suite.module:
            raise  # the module is there; something it imports is not
        path = suite.module.replace(".", "/") + ".py"
        raise SuiteMissing(f"suite {suite.name!r}: {path} is not in this checkout") from exc
    main: Callable[[Sequence[str]], int] = module.main
    return main
