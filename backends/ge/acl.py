"""The ACL shim: the one small interface the GE executors use to drive a device.

Two implementations: `acl_real.AclReal` over pyACL (`import acl`) on an Ascend NPU, and
`acl_sim.SimRuntime`, a simulated NPU that runs ONNX through onnxruntime. The interface
follows pyACL's shape (devices, per-thread contexts, streams, device memory, datasets,
models, dynamic-batch gears) so the executor code is the same on both.

Threading: a device's context must be current on the calling thread before any stream,
memory, dataset or model call. `bind_thread(device_id)` makes it so; every other call
that takes a device-side handle expects it to have been made on that thread.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]

# The extra model input that carries the batch gear of a dynamic-batch OM.
DYNAMIC_BATCH_INPUT = "ascend_mbatch_shape_data"

# aclError values that ge-serve names in its messages (CANN's acl_base.h / rt_error_codes.h).
ACL_ERROR_NAMES: dict[int, str] = {
    100000: "ACL_ERROR_INVALID_PARAM",
    100001: "ACL_ERROR_UNINITIALIZE",
    100002: "ACL_ERROR_REPEAT_INITIALIZE",
    100003: "ACL_ERROR_INVALID_FILE",
    100037: "ACL_ERROR_REPEAT_FINALIZE",
    107000: "ACL_ERROR_RT_PARAM_INVALID",
    107001: "ACL_ERROR_RT_INVALID_DEVICEID",
    107002: "ACL_ERROR_RT_CONTEXT_NULL",
    200000: "ACL_ERROR_BAD_ALLOC",
    207001: "ACL_ERROR_RT_MEMORY_ALLOCATION",
    507899: "ACL_ERROR_RT_INTERNAL_ERROR",
}
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_CONTEXT_NULL = 107002
ACL_ERROR_RT_INTERNAL_ERROR = 507899

# aclDataType -> numpy (ACL_FLOAT=0, ACL_FLOAT16=1, ...; acl_base.h).
ACL_DTYPES: dict[int, np.dtype[Any]] = {
    0: np.dtype(np.float32),
    1: np.dtype(np.float16),
    2: np.dtype(np.int8),
    3: np.dtype(np.int32),
    4: np.dtype(np.uint8),
    6: np.dtype(np.int16),
    7: np.dtype(np.uint16),
    8: np.dtype(np.uint32),
    9: np.dtype(np.int64),
    10: np.dtype(np.uint64),
    11: np.dtype(np.float64),
    12: np.dtype(np.bool_),
}
NUMPY_TO_ACL: dict[np.dtype[Any], int] = {dtype: code for code, dtype in ACL_DTYPES.items()}


class AclError(RuntimeError):
    """A device call failed: names the call, the aclError code and what it means."""

    def __init__(self, call: str, code: int, detail: str = "") -> None:
        name = ACL_ERROR_NAMES.get(code, "")
        text = f"{call} failed with ACL error {code}"
        if name:
            text += f" ({name})"
        if detail:
            text += f": {detail}"
        super().__init__(text)
        self.call = call
        self.code = code


class DeviceOutOfMemory(AclError):
    """Device memory is exhausted (the simulated device's capacity, or the NPU's HBM)."""

    def __init__(self, call: str, detail: str) -> None:
        super().__init__(call, ACL_ERROR_RT_MEMORY_ALLOCATION, f"out of memory: {detail}")


@dataclass(frozen=True, slots=True)
class TensorDesc:
    """One model input or output as the device model describes it."""

    index: int
    name: str
    dtype: np.dtype[Any]
    # Dims as the model reports them; a dynamic batch dimension is -1 (or the largest gear).
    dims: tuple[int, ...]
    # Bytes of the buffer the model needs, at its largest gear.
    size: int


@dataclass(frozen=True, slots=True)
class ModelDesc:
    inputs: tuple[TensorDesc, ...]
    outputs: tuple[TensorDesc, ...]
    # Dynamic-batch gears, ascending; empty for a static model.
    gears: tuple[int, ...] = ()
    # Index of the `ascend_mbatch_shape_data` input in `inputs`: it selects the gear of a
    # dynamic-batch, ND-gear or image-size model.
    dynamic_index: int | None = None
    # How non-batch dims vary (shapes.DIMS, shapes.HW, shapes.RANGE), "" when they do not.
    shape_kind: str = ""
    # ND or image-size gears: each gear's full shape of every data input, in input order.
    shape_gears: tuple[tuple[tuple[int, ...], ...], ...] = ()
    # Shape ranges: (low, high) per dim of every data input, in input order.
    ranges: tuple[tuple[tuple[int, int], ...], ...] = ()

    def data_inputs(self) -> tuple[TensorDesc, ...]:
        return tuple(t for t in self.inputs if t.index != self.dynamic_index)


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """A tensor as the model config declares it (the model's own dims, batch excluded)."""

    name: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelSource:
    """What the backend asks a runtime to turn into something loadable."""

    path: Path
    # True when the model batches (max_batch_size > 0): the first dim is the batch.
    batching: bool
    gears: tuple[int, ...]
    inputs: tuple[TensorPlan, ...]
    outputs: tuple[TensorPlan, ...]
    # atc's --input_shape ("name:-1,3,224,224;..."); "" lets atc read the model's own shapes.
    input_shape: str = ""
    # `atc` flags derived from the ge.* options (flag without dashes -> value).
    atc_options: tuple[tuple[str, str], ...] = ()
    # onnxruntime intra-op threads per stream (simulated device only).
    intra_threads: int = 1
    # How non-batch dims vary (shapes.ShapePlan); None: only the batch dim may.
    shapes: Any = None
    # Shape ranges: each output's shape at the ranges' maxima, to size its device buffer
    # (a range OM reports no output size).
    output_max: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def shapes_vary(self) -> bool:
        """Dims other than the batch vary (ND gears, image-size gears or ranges)."""
        return self.shapes is not None and self.shapes.kind not in ("static", "batch")


@dataclass(frozen=True, slots=True)
class PreparedModel:
    """A model ready to load on any device of one runtime (an OM file, or a checked ONNX)."""

    path: Path
    source: ModelSource
    # What happened while preparing, for the log ("compiled by atc", "atc cache hit", ...).
    note: str = ""
    # The description every loaded copy will have, when the runtime knows it up front.
    desc: ModelDesc | None = None


@dataclass(slots=True)
class AclModel:
    """A model loaded on one device: its id, its description and runtime-private state."""

    model_id: int
    device_id: int
    desc: ModelDesc
    # Device bytes the loaded model holds (weights and workspace), when known.
    memory_bytes: int = 0
    handle: Any = None


@dataclass(slots=True)
class DeviceBuffer:
    device_id: int
    ptr: int
    size: int


@dataclass(slots=True)
class Dataset:
    """An aclmdlDataset and the aclDataBuffers it holds."""

    handle: Any
    buffers: list[Any] = field(default_factory=list)
    # Tensor descriptions set on it for the current execution (shape-range models).
    tensor_descs: list[Any] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DeviceStats:
    device_id: int
    memory_total: int
    memory_used: int
    # Nanoseconds during which at least one execution was in flight on the device.
    busy_ns: int
    # Percent busy since the previous call (simulated) or as the NPU reports it (real);
    # -1 when unknown.
    utilization: float


class AclRuntime(Protocol):
    """One process-wide device runtime."""

    @property
    def kind(self) -> str:
        """ "npu" for pyACL on Ascend hardware, "sim" for the simulated device."""
        ...

    def describe(self) -> str: ...

    def device_count(self) -> int: ...

    def soc_name(self) -> str: ...

    # --- devices and contexts -----------------------------------------------------------
    def open_device(self, device_id: int) -> None:
        """Set the device and create its context (reference counted), bound to this thread."""
        ...

    def close_device(self, device_id: int) -> None: ...

    def bind_thread(self, device_id: int) -> None:
        """Make the device's context current on the calling thread."""
        ...

    # --- streams ------------------------------------------------------------------------
    def create_stream(self, device_id: int) -> Any: ...

    def destroy_stream(self, device_id: int, stream: Any) -> None: ...

    def synchronize_stream(self, device_id: int, stream: Any) -> None: ...

    # --- memory -------------------------------------------------------------------------
    def malloc(self, device_id: int, size: int) -> DeviceBuffer: ...

    def free(self, buffer: DeviceBuffer) -> None: ...

    def memcpy_h2d(self, dst: DeviceBuffer, src: Array) -> None: ...

    def memcpy_d2h(self, dst: Array, src: DeviceBuffer) -> None: ...

    # --- models -------------------------------------------------------------------------
    def prepare_model(self, source: ModelSource) -> PreparedModel:
        """Turn a model file into something loadable (compile ONNX/.pb to OM on an NPU)."""
        ...

    def load_model(self, device_id: int, prepared: PreparedModel) -> AclModel: ...

    def unload_model(self, model: AclModel) -> None: ...

    def create_dataset(self, device_id: int, buffers: list[DeviceBuffer]) -> Dataset: ...

    def destroy_dataset(self, device_id: int, dataset: Dataset) -> None: ...

    def set_dynamic_batch(self, model: AclModel, inputs: Dataset, batch: int) -> None: ...

    def set_dynamic_dims(self, model: AclModel, inputs: Dataset, dims: tuple[int, ...]) -> None:
        """Select an ND gear: every data input's full dims, in input order, in a row."""
        ...

    def set_dynamic_hw(self, model: AclModel, inputs: Dataset, height: int, width: int) -> None:
        """Select an image-size gear."""
        ...

    def set_input_shapes(
        self, model: AclModel, inputs: Dataset, shapes: list[tuple[int, ...]]
    ) -> None:
        """Describe this execution's data input shapes (shape-range models)."""
        ...

    def output_shapes(self, model: AclModel, outputs: Dataset) -> list[tuple[int, ...]]:
        """The shape of every output of the execution just synchronized (gear or range
        models, whose output shapes follow the input shapes)."""
        ...

    def execute_async(
        self, model: AclModel, inputs: Dataset, outputs: Dataset, stream: Any
    ) -> None: ...

    # --- observation --------------------------------------------------------------------
    def active_devices(self) -> list[int]:
        """Devices worth reporting: every simulated one, or the NPUs in use."""
        ...

    def device_stats(self, device_id: int) -> DeviceStats: ...

    def shutdown(self) -> None:
        """Release the runtime (acl.finalize); called once at server exit."""
        ...


class BusyClock:
    """Busy time of one device: time during which at least one execution is in flight.

    Concurrent executions on two streams of the same device count once, as a device is
    either busy or idle.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0
        self._busy_ns = 0
        self._window_start = time.monotonic_ns()
        self._window_busy = 0

    def start(self) -> None:
        with self._lock:
            if self._active == 0:
                self._since = time.monotonic_ns()
            self._active += 1

    def stop(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._busy_ns += time.monotonic_ns() - self._since

    def busy_ns(self) -> int:
        with self._lock:
            return self._busy_now(time.monotonic_ns())

    def utilization(self) -> float:
        """Percent of wall time busy since the previous call."""
        with self._lock:
            now = time.monotonic_ns()
            busy = self._busy_now(now)
            elapsed = now - self._window_start
            share = (busy - self._window_busy) / elapsed if elapsed > 0 else 0.0
            self._window_start = now
            self._window_busy = busy
            return round(min(max(share, 0.0), 1.0) * 100.0, 2)

    def _busy_now(self, now: int) -> int:
        return self._busy_ns + (now - self._since if self._active else 0)
