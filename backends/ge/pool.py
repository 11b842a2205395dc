"""What one GE executor slot's I/O pool holds and how it was used, and the small helpers
the executor uses to pair the config's tensors with the model's and size grown buffers."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .acl import AclRuntime, Dataset, DeviceBuffer, ModelDesc, TensorDesc, TensorPlan

log = logging.getLogger(__name__)


@dataclass(slots=True)
class PoolStats:
    """What one slot's I/O pool holds and how it was used (for metrics)."""

    slot: str
    device_id: int
    stream: int
    # Device buffers in the pool and their total bytes.
    buffers: int = 0
    bytes: int = 0
    # Device allocations this slot ever made for I/O (constant after load: no per-request
    # allocation).
    allocations: int = 0
    # Executions served from the pool, in total and per gear.
    executions: int = 0
    # Per batch gear, or per shape ("1x128") for models whose other dims vary.
    by_gear: dict[int | str, int] = field(default_factory=dict)
    bytes_in: int = 0
    bytes_out: int = 0
    failures: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "device_id": self.device_id,
            "stream": self.stream,
            "buffers": self.buffers,
            "bytes": self.bytes,
            "allocations": self.allocations,
            "executions": self.executions,
            "by_gear": dict(self.by_gear),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "failures": self.failures,
        }


def match(
    plans: tuple[TensorPlan, ...], found: tuple[TensorDesc, ...], what: str
) -> list[tuple[TensorPlan, TensorDesc]]:
    """Pair the config's tensors with the model's, by name (by position if names differ)."""
    by_name = {t.name: t for t in found}
    if all(p.name in by_name for p in plans):
        return [(p, by_name[p.name]) for p in plans]
    if len(plans) == len(found):
        log.warning(
            "the compiled model's %s names %s differ from the config's %s; pairing by position",
            what,
            [t.name for t in found],
            [p.name for p in plans],
        )
        return list(zip(plans, found, strict=True))
    missing = [p.name for p in plans if p.name not in by_name]
    raise ValueError(
        f"config {what}s {missing} are not {what}s of the compiled model "
        f"(it has {[t.name for t in found]})"
    )


def rounded(size: int) -> int:
    """A grown buffer's bytes: the next power of two (at least 4 KiB)."""
    return max(4096, 1 << max(size - 1, 0).bit_length())


def quietly(call: Any, *args: Any) -> None:
    try:
        call(*args)
    except Exception:
        log.exception("cleanup call %s failed", getattr(call, "__name__", call))


def regrow(
    runtime: AclRuntime,
    device: int,
    buffers: list[DeviceBuffer],
    dataset: Dataset | None,
    need: Mapping[int, int],
    stats: PoolStats,
) -> Dataset | None:
    """Replace the buffers smaller than `need` (bytes by tensor index) with larger ones
    (`rounded`), and the dataset over them; the same dataset when none is too small."""
    grown = [index for index, size in need.items() if size > buffers[index].size]
    if not grown:
        return dataset
    # Allocate and build the new dataset before touching the old one: when the device is
    # out of memory or pyACL refuses the dataset, the pool stays as it was (its dataset
    # still live) and only this request fails.
    fresh: dict[int, DeviceBuffer] = {}
    try:
        for index in grown:
            fresh[index] = runtime.malloc(device, rounded(need[index]))
        replaced = [fresh.get(index, buffer) for index, buffer in enumerate(buffers)]
        rebuilt = runtime.create_dataset(device, replaced)
    except BaseException:
        for buffer in fresh.values():
            quietly(runtime.free, buffer)
        raise
    if dataset is not None:
        runtime.destroy_dataset(device, dataset)
    for index, buffer in fresh.items():
        previous, buffers[index] = buffers[index], buffer
        runtime.free(previous)
        stats.allocations += 1
        stats.bytes += buffer.size - previous.size
    return rebuilt


def range_bound(tensor: TensorDesc, desc: ModelDesc, batching: bool) -> tuple[int, ...]:
    """An output shape no execution of a shape-range OM exceeds, read from the ranges
    alone, for a prebuilt OM (no ONNX to infer its outputs from; it reports their size as
    0): a batching output's first dim is the batch range's maximum, and every other -1
    dim the largest maximum of any input's varying dim. Outputs that grow past every
    input dim (upsampling) need `output_max_shape`; the true shapes are read after each
    run, and one past its buffer fails that execution, naming the output."""
    highs = [high for ranges in desc.ranges for low, high in ranges if low != high]
    widest = max(highs, default=1)
    batch = max((ranges[0][1] for ranges in desc.ranges if ranges), default=1)
    return tuple(
        (batch if batching and i == 0 else widest) if d < 0 else d
        for i, d in enumerate(tensor.dims)
    )
