"""A small asyncio load generator for what perf_analyzer cannot do: several request classes
at once, each with its own Triton `priority` and `timeout`, closed-loop (concurrency) or
open-loop (a fixed request rate). For plain throughput/latency sweeps use perfa (C++,
lighter on the shared cores); use this for mixed-priority runs.

    high = LoadClass("high", rate=20, priority=1)          # 20 req/s, open loop
    low = LoadClass("low", concurrency=32, priority=2)      # saturating, closed loop
    rows = run_load("127.0.0.1:8001", "grpc", "resnet18_like", sample, [high, low],
                    duration_s=10)
    rows[0]["p99_us"], rows[1]["throughput"], rows[1]["errors"]

`sample` maps input names to arrays WITH the batch dimension (e.g. inputs.make_sample(...)
with a leading axis added: `batched(sample)`). Latency is measured around each call, in µs.
"""

from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.lib.inputs import Array

DATATYPES: dict[str, str] = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "object": "BYTES",
}


@dataclass
class LoadClass:
    """One stream of requests. Set `rate` (req/s, open loop: requests leave on schedule
    whatever the answers do, at most `max_outstanding` in flight) or `concurrency` (closed
    loop: that many workers, each sends when its last answer came)."""

    name: str
    concurrency: int = 1
    rate: float | None = None
    priority: int = 0
    timeout_us: int | None = None
    max_outstanding: int = 256


@dataclass
class _Stats:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sent: int = 0
    dropped: int = 0  # open loop: not sent because max_outstanding were in flight


def batched(sample: Mapping[str, Array], batch: int = 1) -> dict[str, Array]:
    """Add a leading batch axis (repeat the one sample `batch` times)."""
    return {k: np.repeat(v[np.newaxis, ...], batch, axis=0) for k, v in sample.items()}


def _make_inputs(module: Any, sample: Mapping[str, Array]) -> list[Any]:
    result = []
    for name, array in sample.items():
        item = module.InferInput(name, list(array.shape), DATATYPES[str(array.dtype)])
        item.set_data_from_numpy(array)
        result.append(item)
    return result


class _Client:
    """tritonclient's aio client for either protocol, one call signature."""

    def __init__(self, url: str, protocol: str, model: str, sample: Mapping[str, Array]):
        if protocol not in ("http", "grpc"):
            raise ValueError(f"protocol must be 'http' or 'grpc', not {protocol!r}")
        # import_module rather than an `import ... as module` in each branch: those redefine
        # one name, an error as soon as tritonclient ships types. Imported on use, as before.
        module = importlib.import_module(f"tritonclient.{protocol}.aio")
        self.client = module.InferenceServerClient(url)
        self.model = model
        self.inputs = _make_inputs(module, sample)

    async def infer(self, cls: LoadClass) -> None:
        await self.client.infer(
            self.model, self.inputs, priority=cls.priority, timeout=cls.timeout_us
        )

    async def close(self) -> None:
        await self.client.close()


async def _timed(client: _Client, cls: LoadClass, stats: _Stats, record: bool) -> None:
    t0 = time.perf_counter()
    try:
        await client.infer(cls)
    except Exception as exc:  # any failed request is counted, with its message
        if record:
            stats.errors.append(str(exc)[:200])
        return
    if record:
        stats.latencies.append(time.perf_counter() - t0)


async def _closed_loop(
    client: _Client, cls: LoadClass, stats: _Stats, start: float, warmup: float, end: float
) -> None:
    async def worker() -> None:
        while (now := time.perf_counter()) < end:
            stats.sent += 1
            await _timed(client, cls, stats, record=now >= start + warmup)

    await asyncio.gather(*(worker() for _ in range(cls.concurrency)))


async def _open_loop(
    client: _Client, cls: LoadClass, stats: _Stats, start: float, warmup: float, end: float
) -> None:
    assert cls.rate is not None and cls.rate > 0
    period = 1.0 / cls.rate
    pending: set[asyncio.Task[None]] = set()
    index = 0
    while True:
        due = start + index * period
        if due >= end:
            break
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        index += 1
        if len(pending) >= cls.max_outstanding:
            stats.dropped += 1
            continue
        stats.sent += 1
        task = asyncio.create_task(_timed(client, cls, stats, record=due >= start + warmup))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)


def _summary(cls: LoadClass, stats: _Stats, measured_s: float) -> dict[str, Any]:
    lat = np.array(stats.latencies) * 1e6
    row: dict[str, Any] = {
        "class": cls.name,
        "priority": cls.priority,
        "concurrency": None if cls.rate else cls.concurrency,
        "request_rate": cls.rate,
        "sent": stats.sent,
        "ok": int(lat.size),
        "errors": len(stats.errors),
        "dropped": stats.dropped,
        "throughput": lat.size / measured_s if measured_s > 0 else 0.0,
    }
    if lat.size:
        for p in (50, 90, 95, 99):
            row[f"p{p}_us"] = float(np.percentile(lat, p))
        row["avg_us"] = float(lat.mean())
    if stats.errors:
        row["first_error"] = stats.errors[0]
    return row


async def run_load_async(
    url: str,
    protocol: str,
    model: str,
    sample: Mapping[str, Array],
    classes: Sequence[LoadClass],
    duration_s: float = 10.0,
    warmup_s: float = 1.0,
) -> list[dict[str, Any]]:
    """All classes at once for warmup_s + duration_s; only answers to requests sent after
    the warm-up count. One client (connection pool) per class."""
    clients = [_Client(url, protocol, model, sample) for _ in classes]
    stats = [_Stats() for _ in classes]
    start = time.perf_counter()
    end = start + warmup_s + duration_s
    try:
        await asyncio.gather(
            *(
                (_open_loop if cls.rate else _closed_loop)(c, cls, s, start, warmup_s, end)
                for c, cls, s in zip(clients, classes, stats, strict=True)
            )
        )
    finally:
        for c in clients:
            await c.close()
    return [_summary(cls, s, duration_s) for cls, s in zip(classes, stats, strict=True)]


def run_load(
    url: str,
    protocol: str,
    model: str,
    sample: Mapping[str, Array],
    classes: Sequence[LoadClass],
    duration_s: float = 10.0,
    warmup_s: float = 1.0,
) -> list[dict[str, Any]]:
    """Synchronous wrapper of run_load_async (runs its own event loop)."""
    return asyncio.run(run_load_async(url, protocol, model, sample, classes, duration_s, warmup_s))


def parse_class(text: str) -> LoadClass:
    """ "name:key=value:..." with keys concurrency, rate, priority, timeout_us."""
    name, *pairs = text.split(":")
    cls = LoadClass(name)
    for pair in pairs:
        key, value = pair.split("=", 1)
        if key == "rate":
            cls.rate = float(value)
        elif key in ("concurrency", "priority", "timeout_us", "max_outstanding"):
            setattr(cls, key, int(value))
        else:
            raise ValueError(f"unknown load class key {key!r} in {text!r}")
    return cls
