"""Raw onnxruntime reference: the ceiling a server on the same cores is measured against.

Sessions get exactly the settings ge-serve's onnxruntime backend gives its slots (it imports
`session_options` from ge_serve.backends.ort_options): intra-op threads = cores // slots
unless the config sets `intra_op_thread_count`, sequential unless `execution_mode` is 1,
`allow_spinning` 0 unless configured, and the config's other onnxruntime parameters. With
slots > 1, that many sessions run at once in threads, as the server's slots do, and
samples/s is their sum.

    result = measure_raw(Path("bench/.cache/models/onnx/resnet18_like.onnx"))
    result["best"]["samples_per_s"], result["best"]["batch_size"]
    for row in result["rows"]: row["batch_size"], row["samples_per_s"], row["p50_ms"]
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnxruntime as ort

from bench.lib.inputs import InputSpec, make_array
from ge_serve.backends.ort_options import session_options
from ge_serve.protos import model_config_pb2

ORT_TYPES: dict[str, str] = {
    "tensor(float)": "FP32",
    "tensor(float16)": "FP16",
    "tensor(double)": "FP64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(bool)": "BOOL",
    "tensor(string)": "BYTES",
}

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)


def load_config(path: Path | None, slots: int) -> model_config_pb2.ModelConfig:
    """The model's config (for its thread parameters and instance count), or an empty one
    with `slots` CPU instances."""
    config = model_config_pb2.ModelConfig()
    if path is not None:
        from google.protobuf import text_format

        text_format.Parse(path.read_text(), config)
    if not config.instance_group:
        group = config.instance_group.add()
        group.count = slots
        group.kind = model_config_pb2.ModelInstanceGroup.KIND_CPU
    return config


def _resolve(model: Path) -> tuple[Path, Path | None]:
    """MODEL.onnx, or a model folder (config.pbtxt + 1/model.onnx)."""
    if model.is_dir():
        config = model / "config.pbtxt"
        versions = sorted(
            (p for p in model.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )
        if not versions:
            raise FileNotFoundError(f"{model} has no version folder")
        return versions[-1] / "model.onnx", config if config.exists() else None
    return model, None


class RawSessions(NamedTuple):
    onnx_path: Path
    intra_op_threads: int
    sessions: list[ort.InferenceSession]  # one per slot


def open_sessions(
    model: Path, slots: int | None = None, config_path: Path | None = None
) -> RawSessions:
    """One session per slot, with the settings ge-serve's onnxruntime backend gives its
    slots. `model`: an .onnx file or a model folder (then its config.pbtxt supplies the
    thread parameters and instance count); `slots` overrides the instance count."""
    onnx_path, found_config = _resolve(model)
    config = load_config(config_path or found_config, slots or 1)
    if slots is not None:
        del config.instance_group[:]
        group = config.instance_group.add()
        group.count = slots
    n_slots = sum(max(g.count, 1) for g in config.instance_group) or 1
    options = session_options(config, n_slots)
    intra = options.intra_op_num_threads
    sessions = [
        ort.InferenceSession(
            str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        for _ in range(n_slots)
    ]
    return RawSessions(onnx_path, intra, sessions)


def batched_feed(
    session: ort.InferenceSession, batch: int, seed: int, int_high: int = 16
) -> tuple[dict[str, Any], bool]:
    """One fixed valid batch for every input, and whether the model has a batch dim.
    Integers are drawn from [0, int_high): valid indices for every table at least that long
    (2 for a BERT's token type ids)."""
    rng = np.random.default_rng(seed)
    feed: dict[str, Any] = {}
    batched = True
    for item in session.get_inputs():
        dims = list(item.shape)
        first_dynamic = bool(dims) and not isinstance(dims[0], int)
        batched = batched and first_dynamic
        rest = tuple(d if isinstance(d, int) else 8 for d in dims[1:])
        spec = InputSpec(item.name, ORT_TYPES[item.type], rest)
        sample = make_array(spec, rng, int_high=int_high)
        if sample.dtype == np.object_:
            sample = np.vectorize(lambda v: bytes(v).decode())(sample).astype(object)
        lead = batch if first_dynamic else (dims[0] if dims else None)
        if lead is None:
            feed[item.name] = sample
        else:
            feed[item.name] = np.ascontiguousarray(np.broadcast_to(sample, (lead, *rest)))
    return feed, batched


def _run_for(
    session: ort.InferenceSession,
    feed: dict[str, Any],
    seconds: float,
    start: threading.Barrier,
    out: list[float],
) -> None:
    start.wait()
    deadline = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        session.run(None, feed)
        t1 = time.perf_counter()
        out.append(t1 - t0)
        if t1 >= deadline:
            return


def measure_raw(
    model: Path,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    seconds_per_size: float = 2.0,
    slots: int | None = None,
    config_path: Path | None = None,
    warmup_calls: int = 3,
    seed: int = 0,
) -> dict[str, Any]:
    """samples/s and per-call latency at each batch size, bounded to ~seconds_per_size each.

    `model`: an .onnx file or a model folder (then its config.pbtxt supplies the thread
    parameters and instance count). `slots` overrides the instance count.
    Returns {"model", "slots", "intra_op_threads", "rows": [...], "best": row}; each row has
    batch_size, calls, samples_per_s, calls_per_s, mean_ms, p50_ms, p99_ms."""
    onnx_path, intra, sessions = open_sessions(model, slots, config_path)
    n_slots = len(sessions)
    rows: list[dict[str, Any]] = []
    for batch in batch_sizes:
        feed, batched = batched_feed(sessions[0], batch, seed)
        if not batched and batch != batch_sizes[0]:
            break  # no batch dimension: one size is all there is
        for session in sessions:
            for _ in range(warmup_calls):
                session.run(None, feed)
        latencies: list[list[float]] = [[] for _ in sessions]
        barrier = threading.Barrier(len(sessions) + 1)
        threads = [
            threading.Thread(target=_run_for, args=(s, feed, seconds_per_size, barrier, lat))
            for s, lat in zip(sessions, latencies, strict=True)
        ]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        flat = np.array([x for lat in latencies for x in lat])
        effective_batch = batch if batched else 1
        calls = int(flat.size)
        rows.append(
            {
                "batch_size": effective_batch,
                "calls": calls,
                "samples_per_s": calls * effective_batch / elapsed,
                "calls_per_s": calls / elapsed,
                "mean_ms": float(flat.mean() * 1e3),
                "p50_ms": float(np.percentile(flat, 50) * 1e3),
                "p99_ms": float(np.percentile(flat, 99) * 1e3),
            }
        )
        if not batched:
            break
    best = max(rows, key=lambda r: float(r["samples_per_s"]))
    return {
        "model": str(onnx_path),
        "slots": n_slots,
        "intra_op_threads": intra,
        "rows": rows,
        "best": best,
    }
