"""Triton's `model_warmup`: sample requests a backend runs before a model is READY.

Each `ModelWarmup` names a batch size, a count, and per input its type, dims and data:
`zero_data`, `random_data`, or `input_data_file` (raw bytes in the model's `warmup/` folder;
BYTES as 4-byte little-endian lengths followed by the bytes, as Triton reads them).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ge_serve.protos import model_config_pb2

from .base import Array, DataRejected, Executor, ModelSpec, gear_for, pad_batch
from .onnx_io import CONFIG_NUMPY
from .paths import resolve_inside
from .scheduled_io import fed_inputs

log = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"
# CONFIG_NUMPY leaves BF16 out for the NPU's sake; warmup runs on whichever backend holds
# the model (BF16 models are onnxruntime's), which takes ml_dtypes' bfloat16 as requests do.
WARMUP_NUMPY: dict[int, np.dtype[Any]] = {
    **CONFIG_NUMPY,
    model_config_pb2.TYPE_BF16: np.dtype(ml_dtypes.bfloat16),
}


@dataclass(frozen=True, slots=True)
class WarmupSample:
    name: str
    # The sample's batch size (1 for a model that does not batch).
    batch_size: int
    count: int
    inputs: dict[str, Array]


def data_file(model_dir: Path, label: str, name: str, filename: str) -> Path:
    """Where an `input_data_file` is (under `warmup/`); OutsideFolder (a ValueError) when
    it leaves the model folder."""
    what = f"input_data_file {filename!r} of warmup {label!r} input {name!r}"
    return resolve_inside(model_dir, filename, what, under=WARMUP_FOLDER)


def warmup_label(warmup: model_config_pb2.ModelWarmup, index: int) -> str:
    return warmup.name or f"#{index}"


def warmup_samples(config: model_config_pb2.ModelConfig, model_dir: Path) -> list[WarmupSample]:
    """Build every warmup sample of a config, or raise ValueError saying what is wrong."""
    samples = []
    inputs_by_name = {entry.name: entry for entry in config.input}
    # A sample may give the tensors the scheduler feeds a request (a sequence's START,
    # READY..., its state), as Triton's warmup hands a sample straight to the backend.
    fed = fed_inputs(config)
    batching = config.max_batch_size > 0
    for index, warmup in enumerate(config.model_warmup):
        label = warmup_label(warmup, index)
        batch = max(int(warmup.batch_size), 1) if batching else 1
        if batching and batch > config.max_batch_size:
            raise ValueError(
                f"warmup '{label}': batch_size {batch} exceeds max_batch_size "
                f"{config.max_batch_size}"
            )
        rng = np.random.default_rng(index)
        arrays: dict[str, Array] = {}
        for name, spec in warmup.inputs.items():
            entry = inputs_by_name.get(name)
            if entry is None and name not in fed:
                raise ValueError(f"warmup '{label}' names input '{name}', which the model lacks")
            dtype = WARMUP_NUMPY.get(spec.data_type)
            if dtype is None:
                raise ValueError(f"warmup '{label}': input '{name}' has no usable data_type")
            lead = (batch,) if batching else ()
            shape = lead + tuple(int(d) for d in spec.dims)
            if any(d < 0 for d in shape):
                raise ValueError(f"warmup '{label}': input '{name}' dims must be fixed")
            array = _data(label, name, spec, dtype, shape, rng, model_dir)
            if entry is not None and entry.HasField("reshape"):
                array = array.reshape(lead + tuple(entry.reshape.shape))
            arrays[name] = array
        missing = [
            e.name
            for e in config.input
            if e.name not in arrays and not getattr(e, "optional", False)
        ]
        if missing:
            raise ValueError(f"warmup '{label}' gives no data for input(s) {missing}")
        samples.append(WarmupSample(label, batch, max(int(warmup.count), 1), arrays))
    return samples


def _data(
    label: str,
    name: str,
    spec: model_config_pb2.ModelWarmup.Input,
    dtype: np.dtype[Any],
    shape: tuple[int, ...],
    rng: np.random.Generator,
    model_dir: Path,
) -> Array:
    choice = spec.WhichOneof("input_data_type")
    count = int(np.prod(shape, dtype=np.int64))
    if choice == "input_data_file":
        path = data_file(model_dir, label, name, spec.input_data_file)
        if not path.is_file():
            raise ValueError(f"warmup '{label}': input data file '{path}' does not exist")
        raw = path.read_bytes()
        if dtype == np.object_:
            return _strings(label, name, raw, count).reshape(shape)
        need = count * dtype.itemsize
        if len(raw) < need:
            raise ValueError(
                f"warmup '{label}': '{path.name}' has {len(raw)} bytes, input '{name}' of shape "
                f"{list(shape)} needs {need}"
            )
        return np.frombuffer(raw[:need], dtype=dtype).reshape(shape).copy()
    if dtype == np.object_:
        values = [
            b"" if choice != "random_data" else str(int(v)).encode()
            for v in rng.integers(0, 100, size=count)
        ]
        array = np.empty(count, dtype=object)
        array[:] = values
        return array.reshape(shape)
    if choice == "random_data":
        # bfloat16 is a numpy kind "V" (void) type, yet takes floats.
        if dtype.kind == "f" or dtype == ml_dtypes.bfloat16:
            return rng.random(shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, size=shape).astype(dtype)
        return rng.integers(0, 100, size=shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


def _strings(label: str, name: str, raw: bytes, count: int) -> Array:
    values: list[bytes] = []
    offset = 0
    while len(values) < count:
        if offset + 4 > len(raw):
            raise ValueError(f"warmup '{label}': data file for '{name}' holds too few strings")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        values.append(raw[offset : offset + length])
        offset += length
    array = np.empty(count, dtype=object)
    array[:] = values
    return array


def run_warmup(
    spec: ModelSpec, executors: Sequence[Executor], gears: Sequence[int] = ()
) -> list[tuple[dict[str, Array], dict[str, Array]]]:
    """Run every warmup sample `count` times on every executor, padded to a gear when the
    executors only take gears. Raises RuntimeError naming the sample and slot that failed.
    Returns each sample's inputs (unpadded) and the first executor's first outputs for it
    (the GE backend checks them against onnxruntime without running them again)."""
    samples = warmup_samples(spec.config, spec.model_dir)
    results: list[tuple[dict[str, Array], dict[str, Array]]] = []
    for sample in samples:
        inputs = sample.inputs
        if gears:
            # Samples never exceed max_batch_size, which the largest gear holds (checked
            # at load), so a gear always fits.
            gear = gear_for(sample.batch_size, gears)
            inputs = {name: pad_batch(array, gear) for name, array in inputs.items()}
        for executor in executors:
            for run in range(sample.count):
                try:
                    outputs = executor.execute(inputs)
                except Exception as exc:
                    # A sample's own data refused is the config's to mend, not a request's.
                    why = str(exc)
                    if isinstance(exc, DataRejected):
                        why = f"the model could not run on the sample's data: {exc.refusal}"
                    raise RuntimeError(
                        f"warmup '{sample.name}' failed on {executor.slot.name}: {why}"
                    ) from exc
                if run == 0 and executor is executors[0]:
                    results.append((dict(sample.inputs), outputs))
    if samples:
        log.info(
            "model '%s' version %d: %d warmup sample(s) ran on %d slot(s)",
            spec.name,
            spec.version,
            len(samples),
            len(executors),
        )
    return results
