"""What the core reports about itself: server and model metadata, statistics and the
repository index, as frozen records.

The core returns these and never a wire shape; each front end encodes them (HTTP JSON in
server/http/encode.py, protobuf in server/grpc/encode.py), so field order, number formats
and empty-field rules live at the edge, once per protocol. The records mirror Triton's
protocol extensions field for field, with the core's own types: versions are integers,
datatypes and states enums.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .types import DataType


class ModelState(enum.Enum):
    """A model version's state, by the name the repository index reports."""

    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


# --- metadata ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """An input or output as a client sends it: `shape` starts with -1 for the batch
    dimension when the model batches."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    # The versions that are loaded, ascending.
    versions: tuple[int, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


# --- statistics -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatisticDuration:
    """How many times something happened, and its cumulative duration."""

    count: int = 0
    ns: int = 0


_NEVER = StatisticDuration()


@dataclass(frozen=True, slots=True)
class InferStatistics:
    """Per request: `success` and `fail` span the whole request; the phases are summed
    over successful requests, each counting the time of the batch it ran in."""

    success: StatisticDuration
    fail: StatisticDuration
    queue: StatisticDuration
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration
    # Response cache hits (lookup time) and misses (lookup and insert time).
    cache_hit: StatisticDuration = _NEVER
    cache_miss: StatisticDuration = _NEVER


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """Executions of one batch size and their compute durations."""

    batch_size: int
    compute_input: StatisticDuration
    compute_infer: StatisticDuration
    compute_output: StatisticDuration


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """Memory a model version holds, as Triton reports it (`type` is CPU, CPU_PINNED or
    GPU; `id` the device)."""

    type: str
    id: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """One loaded model version's statistics since it loaded.

    Triton's per-response statistics (`response_stats`) are for models that answer a
    request more than once; every model here answers once, so there are none.
    """

    name: str
    version: int
    # Milliseconds since the epoch; 0 before the first execution.
    last_inference: int
    # Inferences of successful requests (a request of batch 4 counts 4), and model
    # executions (a dynamic batch of several requests counts once).
    inference_count: int
    execution_count: int
    inference_stats: InferStatistics
    # Ascending by batch size.
    batch_stats: tuple[BatchStatistics, ...] = ()
    memory_usage: tuple[MemoryUsage, ...] = ()


# --- repository -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RepositoryEntry:
    """One row of the repository index: a model version, or a model with no version to
    report (`version` None), either never loaded (`state` None) or failed (UNAVAILABLE
    with its `reason`)."""

    name: str
    version: int | None = None
    state: ModelState | None = None
    reason: str = ""
