"""The simulated NPU's calibrated cost model (`--sim-cost`), opt-in.

Without it the simulated NPU takes as long as onnxruntime on the host CPU, whose cost
barely falls per sample as a batch grows, so a batcher tuned on it is tuned on the wrong
curve. With it, one execution takes

    launch_us + per_sample_us * rows

where `rows` is the executed batch (the gear, padding included), counted for a model whose
other dims vary in proportion to a row's elements against its largest gear or range
maximum (a sequence of 16 costs a quarter of one of 64). onnxruntime still
computes every result; the stream then holds the execution until its modelled end, and
each device runs one execution at a time on its own timeline, as an NPU's AI cores do,
so slots on one device overlap copies and queueing but not compute. Only the timing is
modelled: metrics and logs say so. When onnxruntime itself takes longer than the model
allows, the execution ends when onnxruntime does, and the device counts an overrun (the
simulated timing is then a lower bound; use a cheaper stand-in model).

The default profile, `npu_ge_resnet50`, is derived from the two figures CANN's npu_ge
Triton backend tuning guide publishes for ResNet-50 (docs/npu.md has the arithmetic):
191 infer/s at concurrency 1, and 1329 infer/s with request merging at concurrency 64.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StepCost:
    """A generation step graph's time (docs/npu.md, "Generation steps"): a roofline over
    the bytes it moves and the arithmetic it does.

        launch_us + max(bytes / bandwidth, flops / peak)

    bytes: the weights once (as `value_bytes` per value on the device; the ONNX holds fp32),
    plus each row's past keys and values read and its new ones written; flops: two per
    parameter per new token. Decode is memory bound: its time grows with the context it
    reads, and barely with the batch, which is why continuous batching pays on an NPU.
    """

    name: str
    launch_us: float
    bandwidth_gbps: float
    tflops: float
    value_bytes: float

    def duration_ns(
        self, weight_bytes: int, layers: int, slot_values: int, tokens: int, past_slots: int
    ) -> int:
        """`slot_values`: one token's key (or value) values in one layer; `tokens`: new
        tokens in the step (rows x chunk); `past_slots`: cache slots read (rows x past)."""
        kv = 2 * layers * slot_values * self.value_bytes * (past_slots + tokens)
        moved = weight_bytes / 4 * self.value_bytes + kv
        flops = 2 * (weight_bytes / 4) * tokens
        busy_s = max(moved / (self.bandwidth_gbps * 1e9), flops / (self.tflops * 1e12))
        return int((self.launch_us + busy_s * 1e6) * 1000)


# Atlas 300I Pro (Ascend 310P3) as Huawei publishes it: 204.8 GB/s LPDDR4X, 140 TFLOPS
# FP16; atc compiles fp32 to fp16 (2 bytes a value). The launch, 500 us for a step graph
# of a few dozen layers, is an assumption, not a published figure.
STEP_PROFILE = StepCost("npu_310p_llm_step", 500.0, 204.8, 140.0, 2.0)


@dataclass(frozen=True, slots=True)
class SimCost:
    name: str
    launch_us: float
    per_sample_us: float
    # How a generation step graph (backends/llm) is priced instead.
    step: StepCost = STEP_PROFILE

    def duration_ns(self, rows: float) -> int:
        return int((self.launch_us + self.per_sample_us * max(rows, 0.0)) * 1000)

    def describe(self) -> str:
        return (
            f"simulated timing '{self.name}': launch {self.launch_us:g} us + "
            f"{self.per_sample_us:g} us per sample"
        )


# 1e6 / 191 = 5235.6 us for one execution of batch 1 (launch + per sample); merged batches
# of 32 at 1329 infer/s take 32e6 / 1329 = 24078.3 us (launch + 32 per sample). So
# per_sample = (24078.3 - 5235.6) / 31 = 607.8 us and launch = 5235.6 - 607.8 = 4627.8 us.
PROFILES: dict[str, SimCost] = {
    "npu_ge_resnet50": SimCost("npu_ge_resnet50", 4627.8, 607.8),
}
DEFAULT_PROFILE = "npu_ge_resnet50"
_KEYS = ("launch_us", "per_sample_us")


def parse_sim_cost(text: str) -> SimCost | None:
    """`--sim-cost`: "" or "off" (no model), a profile name ("default" is
    npu_ge_resnet50), or `launch_us=...,per_sample_us=...`, optionally after a profile
    whose figures it overrides (`npu_ge_resnet50,launch_us=2000`)."""
    text = text.strip()
    if text in ("", "off", "none"):
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    base: SimCost | None = None
    if parts and "=" not in parts[0]:
        name = DEFAULT_PROFILE if parts[0] == "default" else parts[0]
        base = PROFILES.get(name)
        if base is None:
            raise ValueError(
                f"--sim-cost: unknown profile '{parts[0]}' (profiles: default, "
                f"{', '.join(PROFILES)}, or launch_us=...,per_sample_us=...)"
            )
        parts = parts[1:]
    values: dict[str, float] = {}
    for part in parts:
        key, sep, number = part.partition("=")
        key = key.strip()
        if not sep or key not in _KEYS:
            raise ValueError(f"--sim-cost: '{part}' is not launch_us=<us> or per_sample_us=<us>")
        try:
            values[key] = float(number)
        except ValueError:
            raise ValueError(f"--sim-cost: {key} must be a number, got '{number}'") from None
        if values[key] < 0:
            raise ValueError(f"--sim-cost: {key} must not be negative")
    if base is None:
        missing = [k for k in _KEYS if k not in values]
        if missing:
            raise ValueError(f"--sim-cost: give {' and '.join(missing)} (or a profile name)")
        return SimCost("custom", values["launch_us"], values["per_sample_us"])
    if not values:
        return base
    return SimCost(
        f"{base.name} (adjusted)",
        values.get("launch_us", base.launch_us),
        values.get("per_sample_us", base.per_sample_us),
    )


def priced_ns(
    cost: SimCost,
    names: list[str],
    shapes: list[tuple[int, ...]],
    rows_equiv: float,
    weight_bytes: int,
) -> int:
    """An execution's modelled time: a generation step graph's (its inputs `input_ids`,
    `block_table` and `key_cache_{i}`) by the step profile, any other by rows."""
    by_name = dict(zip(names, shapes, strict=True))
    ids, table, cache = (by_name.get(n) for n in ("input_ids", "block_table", "key_cache_0"))
    if ids is None or table is None or cache is None or len(cache) != 4:
        return cost.duration_ns(rows_equiv)
    layers = sum(1 for name in names if name.startswith("key_cache_"))
    return cost.step.duration_ns(
        weight_bytes, layers, cache[2] * cache[3], ids[0] * ids[1], table[0] * table[1] * cache[1]
    )


class DeviceTimeline:
    """One device's modelled compute: executions run one after another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free_at = 0
        self.executions = 0
        self.overruns = 0
        self.modelled_ns = 0

    def reserve(self, duration_ns: int) -> int:
        """Book the next `duration_ns` of the device; returns when it ends (monotonic ns)."""
        with self._lock:
            start = max(time.monotonic_ns(), self._free_at)
            self._free_at = start + duration_ns
            self.executions += 1
            self.modelled_ns += duration_ns
            return self._free_at

    def hold_until(self, end_ns: int) -> None:
        """Wait for the modelled end; counts an overrun when the real work ran past it."""
        left = end_ns - time.monotonic_ns()
        if left > 0:
            time.sleep(left / 1e9)
        else:
            with self._lock:
                self.overruns += 1
                first = self.overruns == 1
            if first:
                log.warning(
                    "simulated NPU: onnxruntime took %.1f ms longer than the modelled time "
                    "(--sim-cost); such executions end when onnxruntime does, so the "
                    "simulated timing is a lower bound (a cheaper stand-in model avoids it)",
                    -left / 1e6,
                )
