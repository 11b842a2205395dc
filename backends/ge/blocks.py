"""npu_ge's `instance_exec_blocks`: one executor slot of several graphs that splits each
batch across them.

In npu_ge an execute call takes up to `instance_exec_blocks` idle graphs and splits its
merged batch across them, each graph a model copy on its own stream. `GeBlocks` does the
same with `GeExecutor`s (one per graph): a batch of B rows becomes N parts of B/N rows
(the first ones a row longer when N does not divide B), each padded up to a gear of its
graph, started on every graph before any is waited for, so the executions overlap on
their streams; the parts' outputs are trimmed and joined in order. Every graph counts one
execution per batch in its pool statistics (`ge_serve_device_executions_total`).

Splitting needs a batch that any graph takes in part: batch gears, fixed shapes, shape
ranges and GE dynamic shape do; ND and image-size gears fix the batch inside each gear,
so the backend refuses blocks for them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ge_serve.backends.base import Array, BackendError, SlotInfo, gear_for, pad_batch

from .executor import GeExecutor


def split_rows(batch: int, parts: int) -> list[int]:
    """Row counts of each part, largest first, none empty."""
    base, extra = divmod(batch, parts)
    counts = [base + (1 if i < extra else 0) for i in range(parts)]
    return [count for count in counts if count > 0]


class GeBlocks:
    """One executor slot holding several graphs (see the module docstring)."""

    def __init__(self, slot: SlotInfo, graphs: list[GeExecutor]) -> None:
        if not graphs:
            raise ValueError("a block slot needs at least one graph")
        self.slot = slot
        self.graphs = graphs

    @property
    def memory_bytes(self) -> int:
        return sum(graph.memory_bytes for graph in self.graphs)

    def pool_stats(self) -> list[dict[str, Any]]:
        return [graph.pool_stats() for graph in self.graphs]

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        sizes = {int(array.shape[0]) for array in inputs.values()}
        if len(sizes) != 1:
            raise BackendError(f"inputs disagree on the batch size: {sorted(sizes)}")
        rows = split_rows(sizes.pop(), len(self.graphs))
        waits: list[tuple[int, Callable[[], dict[str, Array]]]] = []
        start = 0
        try:
            for graph, count in zip(self.graphs, rows, strict=False):
                part = {name: array[start : start + count] for name, array in inputs.items()}
                start += count
                gear = gear_for(count, graph.gears) if graph.gears else count
                if gear != count:
                    part = {name: pad_batch(array, gear) for name, array in part.items()}
                waits.append((count, graph.launch(part)))
        except BaseException:
            for _, wait in waits:
                with contextlib.suppress(Exception):  # the launch failure is reported
                    wait()
            raise
        outputs: list[tuple[int, dict[str, Array]]] = []
        failure: BaseException | None = None
        for count, wait in waits:
            try:
                outputs.append((count, wait()))
            except BaseException as exc:  # wait for every graph before reporting
                failure = failure or exc
        if failure is not None:
            raise failure
        return {
            name: np.concatenate([result[name][:count] for count, result in outputs])
            for name in outputs[0][1]
        }

    def close(self) -> None:
        errors: list[BaseException] = []
        for graph in self.graphs:
            try:
                graph.close()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
