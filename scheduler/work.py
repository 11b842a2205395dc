"""What the core hands to a scheduler: one request's tensors plus its scheduling facts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy.typing as npt

from ge_serve.backends.base import ParamValue, RequestContext

from .correlation import SequenceFlags

Array = npt.NDArray[Any]


@dataclass(slots=True)
class Timings:
    """Nanosecond durations measured for one request, for statistics and metrics."""

    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    # When the execution began (monotonic ns); 0 where none measured it (an ensemble's
    # are its steps'). A trace's compute points start here: the slot's thread may begin
    # well after the queue let the request go, and a BLS call made inside the execution
    # must fall inside the traced compute.
    compute_start_ns: int = 0
    # Size of the batch this request ran in (after merging, before gear padding).
    batch_size: int = 0
    # True on exactly one request of each execution, so that observers, which see requests
    # one at a time, count each execution (and its batch statistics) once.
    first_in_batch: bool = False

    def add_compute(self, other: Timings) -> None:
        """Add another request's compute times (an ensemble's are its steps' sums)."""
        self.compute_input_ns += other.compute_input_ns
        self.compute_infer_ns += other.compute_infer_ns
        self.compute_output_ns += other.compute_output_ns


@dataclass(slots=True)
class WorkItem:
    """One request inside the scheduler.

    `inputs` carry the request's own batch dimension when the model batches
    (`batch_size` >= 1); for a model without batching `batch_size` is 1 and the arrays
    are passed as they are.
    """

    inputs: dict[str, Array]
    batch_size: int
    priority: int = 0
    timeout_us: int = 0
    enqueue_ns: int = 0
    timings: Timings = field(default_factory=Timings)
    # Set for models whose executors take requests one by one (LoadedModel.per_request).
    context: RequestContext | None = None
    # The request's correlation ID and START / END flags, when it names a sequence.
    sequence: SequenceFlags | None = None
    # Response parameters the scheduler itself answers with (an ensemble echoes the
    # sequence parameters, as Triton's does); the response carries them.
    response_parameters: dict[str, ParamValue] | None = None

    def shape_key(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Items merge into one batch only when all non-batch dims and dtypes agree."""
        return tuple(
            (name, (hash(array.dtype.str), *array.shape[1:]))
            for name, array in sorted(self.inputs.items())
        )
