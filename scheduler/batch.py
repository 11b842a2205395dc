"""Concatenate requests into one batch, pad it to a supported size, split the outputs;
and what each request of a failed execution is told.

The execution functions run on a slot's thread, never on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ge_serve.backends.base import (
    Executor,
    ModelRequest,
    RequestContext,
    gear_for,
    takes_requests,
)
from ge_serve.server.errors import FailureReason, ServerError, execution_failure

from .work import Array, WorkItem


def merge_inputs(items: Sequence[WorkItem], total: int, padded: int) -> dict[str, Array]:
    """One array per input holding every item's rows, then padding rows up to `padded`.

    Each input is copied once, straight into its final buffer; a lone item that needs no
    padding is passed through without a copy.
    """
    merged: dict[str, Array] = {}
    for name, first in items[0].inputs.items():
        if len(items) == 1 and padded == first.shape[0]:
            merged[name] = first
            continue
        out = np.empty((padded, *first.shape[1:]), dtype=first.dtype)
        if len(items) == 1:
            out[:total] = first
        else:
            np.concatenate([item.inputs[name] for item in items], axis=0, out=out[:total])
        if padded > total:
            # Repeat the last row: valid data, so padding can never trip the model.
            out[total:] = out[total - 1]
        merged[name] = out
    return merged


class Shaper(Protocol):
    """How a model's requests go into one batch and come back out, when not by plain
    concatenation along the batch dim: shape buckets (buckets.py), ragged batching
    (ragged.py). `bucket` is the batch's bucket (0: none)."""

    def assign(self, item: WorkItem) -> int: ...

    @property
    def closes_on_shape_change(self) -> bool:
        """Whether a queued request of another key closes the batch forming ahead of it
        (Triton's rule), rather than being looked past."""
        ...

    def max_batch(self, bucket: int) -> int: ...

    def key(self, item: WorkItem, bucket: int) -> tuple[object, ...]: ...

    def merge(
        self, items: Sequence[WorkItem], bucket: int, total: int, padded: int
    ) -> dict[str, Array]: ...

    def split(
        self, items: Sequence[WorkItem], bucket: int, outputs: dict[str, Array]
    ) -> list[dict[str, Array]]: ...


def execute_batch(
    executor: Executor,
    items: Sequence[WorkItem],
    gears: Sequence[int],
    batching: bool,
    shaper: Shaper | None = None,
    bucket: int = 0,
) -> list[dict[str, Array]]:
    """Run `items` as one execution and return each item's own outputs, in order.

    With a `shaper`, it merges the items and splits the outputs. An executor that takes
    requests (a RequestExecutor, such as a Python model's) gets each item as its own
    request, in order, with nothing merged (each still shaped on its own, if a shaper
    says so).
    """
    start = time.monotonic_ns()
    total = sum(item.batch_size for item in items)
    if takes_requests(executor):
        requests = [
            ModelRequest(
                i.inputs
                if shaper is None
                else shaper.merge([i], bucket, i.batch_size, i.batch_size),
                i.context or RequestContext(),
            )
            for i in items
        ]
        ready = time.monotonic_ns()
        results = executor.execute_requests(requests)
        done = time.monotonic_ns()
        if len(results) != len(items):
            raise RuntimeError(f"the executor answered {len(results)} of {len(items)} requests")
        if shaper is not None:
            results = [
                shaper.split([i], bucket, r)[0] if r else r
                for i, r in zip(items, results, strict=True)
            ]
        _record(items, start, ready, done, time.monotonic_ns(), total)
        return results
    if shaper is not None:
        inputs = shaper.merge(items, bucket, total, gear_for(total, gears))
    elif batching:
        inputs = merge_inputs(items, total, gear_for(total, gears))
    else:
        inputs = items[0].inputs
    ready = time.monotonic_ns()
    outputs = executor.execute(inputs)
    done = time.monotonic_ns()
    if shaper is not None:
        results = shaper.split(items, bucket, outputs)
    elif batching:
        results = []
        offset = 0
        for item in items:
            end = offset + item.batch_size
            results.append({name: value[offset:end] for name, value in outputs.items()})
            offset = end
    else:
        results = [outputs]
    _record(items, start, ready, done, time.monotonic_ns(), total)
    return results


@dataclass(frozen=True, slots=True)
class RunAlone:
    """The outcomes of a batch that failed as one and was run again request by request:
    each request's outputs, or what failed it, in order."""

    outcomes: list[dict[str, Array] | Exception]


def execute_isolated(
    executor: Executor,
    items: Sequence[WorkItem],
    gears: Sequence[int],
    batching: bool,
    shaper: Shaper | None = None,
    bucket: int = 0,
) -> list[dict[str, Array]] | RunAlone:
    """`execute_batch`, except that a failed execution of tensors merged from several
    requests is run again one request at a time, so that only the requests that fail on
    their own are failed.

    A model that cannot take one request's data (a string its graph cannot parse, a value
    an op refuses) would otherwise fail every request batched with it, which depends on
    nothing the other clients did. Triton fails the whole batch. A failure costs one more
    execution per request in the batch; the executions are stateless (the sequence
    batcher, whose models keep state, does not use this), so running one again changes
    nothing. A RequestExecutor already answers each request on its own, and one that
    raised for the whole batch failed as a whole, so it is not run again.
    """
    try:
        return execute_batch(executor, items, gears, batching, shaper, bucket)
    except Exception:
        if len(items) < 2 or takes_requests(executor):
            raise
    outcomes: list[dict[str, Array] | Exception] = []
    for item in items:
        try:
            outcomes.append(execute_batch(executor, [item], gears, batching, shaper, bucket)[0])
        except Exception as exc:
            # Without its traceback, whose frames hold this list: a cycle would keep
            # the batch's inputs until the collector ran.
            outcomes.append(exc.with_traceback(None))
    return RunAlone(outcomes)


def _record(
    items: Sequence[WorkItem], start: int, ready: int, done: int, finished: int, total: int
) -> None:
    for item in items:
        timings = item.timings
        timings.compute_start_ns = start
        timings.compute_input_ns = ready - start
        timings.compute_infer_ns = done - ready
        timings.compute_output_ns = finished - done
        timings.batch_size = total
    items[0].timings.first_in_batch = True


def client_error(exc: BaseException) -> ServerError:
    """What each request of a failed execution is told: a fresh error per request (no two
    requests share one traceback), tagged as the model's execution failing."""
    if isinstance(exc, ServerError):
        return ServerError(exc.code, exc.message, exc.reason or FailureReason.BACKEND)
    return execution_failure(exc, FailureReason.BACKEND)
