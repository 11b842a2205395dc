"""The backend interface.

Everything here is synchronous and imports no asyncio, so a backend can be unit-tested
without an event loop. The scheduler owns the threads: it calls each `Executor` from one
dedicated thread, the slot's, and never from two threads at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ge_serve.protos import model_config_pb2

Array = npt.NDArray[Any]


class BackendError(RuntimeError):
    """A model failed while executing one batch (a device or runtime error).

    Only that batch's requests fail; the slot keeps serving. Metrics count these under
    the BACKEND failure reason.
    """


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """Where one executor runs: a device and a stream on it ("cpu" devices have one)."""

    name: str
    device: str
    device_id: int = 0
    stream: int = 0


@dataclass(slots=True)
class ModelSpec:
    """Everything a backend needs to load one version of a model."""

    name: str
    version: int
    config: model_config_pb2.ModelConfig
    model_dir: Path
    # The model file (or folder) inside the version folder; may not exist for some backends.
    model_path: Path


class Executor(Protocol):
    slot: SlotInfo

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        """Run one batch; returns every model output by name. Called from the slot thread."""
        ...

    def close(self) -> None:
        """Release the session and buffers. Called once, from the slot thread or at unload."""
        ...


@dataclass(slots=True)
class LoadedModel:
    """A loaded model version: one executor per slot, plus what the scheduler must honour."""

    executors: list[Executor]
    # Batch sizes the executors accept (e.g. OM dynamic-batch gears), ascending. Empty means
    # any size from 1 to max_batch_size.
    gears: tuple[int, ...] = ()
    # Device bytes held by this model (for statistics and metrics).
    memory_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        for executor in self.executors:
            executor.close()


class Backend(Protocol):
    name: str

    def default_model_filename(self) -> str: ...

    def autocomplete(self, config: model_config_pb2.ModelConfig, model_path: Path) -> None:
        """Fill in what the config leaves out, from the model file. Must not overwrite."""
        ...

    def load(self, spec: ModelSpec) -> LoadedModel:
        """Load a model version. Blocking; the caller runs it off the event loop."""
        ...


def gear_for(size: int, gears: Sequence[int]) -> int:
    """The smallest supported batch size that holds `size` (the size itself if unrestricted)."""
    for gear in gears:
        if gear >= size:
            return gear
    return size


def pad_batch(array: Array, size: int) -> Array:
    """Pad the leading dimension up to `size` by repeating the last row (valid data)."""
    short = size - array.shape[0]
    if short <= 0:
        return array
    filler = np.repeat(array[-1:], short, axis=0)
    return np.concatenate([array, filler], axis=0)
