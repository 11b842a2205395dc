"""A simulated Ascend NPU: the ACL shim without hardware.

- N devices, each with a memory capacity; every allocation (I/O buffers, model weights)
  counts against it and an allocation past it fails with an out-of-memory error
  (sim_device.py holds the devices and streams).
- Device memory is real host memory behind fake device addresses, so host-to-device and
  device-to-host copies really move the bytes through the executor's pooled buffers.
- A stream is a worker thread; `execute_async` queues the model run on it and
  `synchronize_stream` waits for it, reporting a failed run like ACL does.
- A loaded model is an onnxruntime session over the ONNX file, described the way `atc`
  would describe the OM (sim_desc.py: batch gears, ND and image-size gears, shape ranges),
  and it refuses what the NPU refuses: a batch or shape that is not one of its gears, a
  shape outside its ranges, an execution whose gear or shapes were not set first.
- Busy time per device is measured (any stream executing means the device is busy).
- With a cost model (`--sim-cost`, sim_cost.py) the stream holds each execution for its
  modelled time; results still come from onnxruntime.

Contexts are emulated too: device calls from a thread that has not bound the device fail.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from .acl import (
    ACL_ERROR_INVALID_PARAM,
    ACL_ERROR_RT_CONTEXT_NULL,
    AclError,
    AclModel,
    Array,
    Dataset,
    DeviceBuffer,
    DeviceStats,
    ModelDesc,
    ModelSource,
    PreparedModel,
    TensorDesc,
)
from .shapes import DESCRIBED, DIMS, HW, describe_gears, format_range, gear_values, in_range
from .sim_cost import DeviceTimeline, SimCost, priced_ns
from .sim_desc import check_declared, planned_desc, query_size, row_share
from .sim_device import Allocation, SimDevice, SimStream, format_bytes

log = logging.getLogger(__name__)

# A hook the simulated stream calls just before it runs a model (device id, model id).
ExecuteHook = Callable[[int, int], None]


@dataclass(slots=True)
class _SimModel:
    session: ort.InferenceSession
    memory: list[Allocation]
    batching: bool
    busy: threading.Lock = field(default_factory=threading.Lock)
    weight: int = 0


@dataclass(slots=True)
class _SimDataset:
    buffers: list[DeviceBuffer]
    # The batch gear, or the index of the ND / image-size gear, set before execution.
    gear: int | None = None
    # Data input shapes (set by tensor descs), or the output shapes of the last execution.
    shapes: list[tuple[int, ...]] | None = None


class SimRuntime:
    """The ACL shim on simulated NPUs."""

    def __init__(
        self,
        devices: int = 1,
        memory_per_device: int = 16 * 1024**3,
        on_execute: ExecuteHook | None = None,
        cost: SimCost | None = None,
        perturb: float = 0.0,
    ) -> None:
        if devices < 1:
            raise ValueError("--sim-devices must be at least 1")
        if memory_per_device < 1:
            raise ValueError("--sim-device-memory must be positive")
        self.devices = [SimDevice(i, memory_per_device) for i in range(devices)]
        self.on_execute = on_execute
        self.cost = cost
        # A test mode (--sim-perturb): float outputs come back as x * (1 + p) + p, as a
        # conversion that lost accuracy would, so the load-time accuracy check can fail.
        self.perturb = perturb
        self.timelines = [DeviceTimeline() for _ in range(devices)]
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._open: dict[int, int] = {}
        self._models: dict[int, _SimModel] = {}
        self._ids = itertools.count(1)
        self._streams = itertools.count(0)

    @property
    def kind(self) -> str:
        return "sim"

    def describe(self) -> str:
        memory = format_bytes(self.devices[0].capacity)
        timing = self.cost.describe() if self.cost else "onnxruntime's own timing"
        perturbed = (
            f", outputs perturbed by {self.perturb:g} (--sim-perturb)" if self.perturb else ""
        )
        return (
            f"simulated NPU ({len(self.devices)} device(s), {memory} each, onnxruntime, "
            f"{timing}{perturbed})"
        )

    def device_count(self) -> int:
        return len(self.devices)

    def soc_name(self) -> str:
        return "SimulatedAscend"

    # --- devices and contexts -----------------------------------------------------------

    def _device(self, device_id: int, call: str) -> SimDevice:
        if not 0 <= device_id < len(self.devices):
            raise AclError(
                call,
                107001,
                f"NPU {device_id} does not exist: the simulated device has "
                f"{len(self.devices)} device(s), ids 0-{len(self.devices) - 1} (--sim-devices)",
            )
        return self.devices[device_id]

    def _bound(self, device_id: int, call: str) -> SimDevice:
        device = self._device(device_id, call)
        if getattr(self._tls, "device", None) != device_id or device_id not in self._open:
            raise AclError(
                call,
                ACL_ERROR_RT_CONTEXT_NULL,
                f"no context of NPU {device_id} is current on this thread",
            )
        return device

    def open_device(self, device_id: int) -> None:
        self._device(device_id, "aclrtSetDevice (simulated)")
        with self._lock:
            self._open[device_id] = self._open.get(device_id, 0) + 1
        self._tls.device = device_id

    def close_device(self, device_id: int) -> None:
        with self._lock:
            refs = self._open.get(device_id, 0) - 1
            if refs > 0:
                self._open[device_id] = refs
            else:
                self._open.pop(device_id, None)

    def bind_thread(self, device_id: int) -> None:
        self._device(device_id, "aclrtSetContext (simulated)")
        if device_id not in self._open:
            raise AclError(
                "aclrtSetContext (simulated)",
                ACL_ERROR_RT_CONTEXT_NULL,
                f"NPU {device_id} is not open",
            )
        self._tls.device = device_id

    # --- streams ------------------------------------------------------------------------

    def create_stream(self, device_id: int) -> Any:
        device = self._bound(device_id, "aclrtCreateStream (simulated)")
        return SimStream(device, next(self._streams))

    def destroy_stream(self, device_id: int, stream: Any) -> None:
        self._bound(device_id, "aclrtDestroyStream (simulated)")
        stream.close()

    def synchronize_stream(self, device_id: int, stream: Any) -> None:
        self._bound(device_id, "aclrtSynchronizeStream (simulated)")
        stream.synchronize()

    # --- memory -------------------------------------------------------------------------

    def malloc(self, device_id: int, size: int) -> DeviceBuffer:
        call = "aclrtMalloc (simulated)"
        device = self._bound(device_id, call)
        allocation = device.allocate(size, "an I/O buffer", call)
        return DeviceBuffer(device_id, allocation.ptr, size)

    def free(self, buffer: DeviceBuffer) -> None:
        call = "aclrtFree (simulated)"
        self._bound(buffer.device_id, call).release(buffer.ptr, call)

    def memcpy_h2d(self, dst: DeviceBuffer, src: Array) -> None:
        call = "aclrtMemcpy host to device (simulated)"
        device = self._bound(dst.device_id, call)
        target = device.lookup(dst.ptr, call)
        data = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        if data.size > min(dst.size, target.size):
            raise AclError(
                call,
                ACL_ERROR_INVALID_PARAM,
                f"{data.size} bytes do not fit a {dst.size}-byte buffer",
            )
        target.memory[: data.size] = data
        device.bytes_h2d += data.size

    def memcpy_d2h(self, dst: Array, src: DeviceBuffer) -> None:
        call = "aclrtMemcpy device to host (simulated)"
        device = self._bound(src.device_id, call)
        source = device.lookup(src.ptr, call)
        if dst.nbytes > source.size:
            raise AclError(
                call,
                ACL_ERROR_INVALID_PARAM,
                f"{dst.nbytes} bytes exceed a {source.size}-byte buffer",
            )
        dst.reshape(-1).view(np.uint8)[:] = source.memory[: dst.nbytes]
        device.bytes_d2h += dst.nbytes

    # --- models -------------------------------------------------------------------------

    def prepare_model(self, source: ModelSource) -> PreparedModel:
        suffix = source.path.suffix.lower()
        if suffix == ".om":
            raise ValueError(
                f"'{source.path.name}' is an offline model (OM) that only an Ascend NPU can "
                "run; the simulated device (--device sim) executes ONNX models. Serve the "
                "ONNX source instead, or run on an NPU with --device npu"
            )
        if suffix == ".pb":
            raise ValueError(
                f"'{source.path.name}' is a TensorFlow model, which ge-serve compiles with "
                "CANN's atc on an Ascend NPU; the simulated device (--device sim) executes "
                "ONNX models only"
            )
        if not source.path.is_file():
            raise FileNotFoundError(f"model file '{source.path}' does not exist")
        desc = planned_desc(source)
        return PreparedModel(source.path, source, "simulated (onnxruntime)", desc)

    def load_model(self, device_id: int, prepared: PreparedModel) -> AclModel:
        call = "aclmdlLoadFromFile (simulated)"
        device = self._bound(device_id, call)
        desc = prepared.desc or planned_desc(prepared.source)
        work, weight = query_size(prepared.path, desc)
        what = f"model '{prepared.path.name}'"
        memory = [device.allocate(weight, f"the weights of {what}", call)]
        try:
            if work:
                memory.append(device.allocate(work, f"the work space of {what}", call))
            options = ort.SessionOptions()
            options.intra_op_num_threads = max(prepared.source.intra_threads, 1)
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session = ort.InferenceSession(
                str(prepared.path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception:
            for allocation in memory:
                device.release(allocation.ptr, call)
            raise
        model_id = next(self._ids)
        self._models[model_id] = _SimModel(session, memory, prepared.source.batching, weight=weight)
        return AclModel(model_id, device_id, desc, work + weight, model_id)

    def unload_model(self, model: AclModel) -> None:
        call = "aclmdlUnload (simulated)"
        device = self._bound(model.device_id, call)
        loaded = self._models.pop(model.model_id, None)
        if loaded is None:
            raise AclError(call, ACL_ERROR_INVALID_PARAM, f"model {model.model_id} is not loaded")
        for allocation in loaded.memory:
            device.release(allocation.ptr, call)

    def create_dataset(self, device_id: int, buffers: list[DeviceBuffer]) -> Dataset:
        self._bound(device_id, "aclmdlCreateDataset (simulated)")
        return Dataset(_SimDataset(list(buffers)), list(buffers))

    def destroy_dataset(self, device_id: int, dataset: Dataset) -> None:
        self._bound(device_id, "aclmdlDestroyDataset (simulated)")
        dataset.buffers.clear()

    def set_dynamic_batch(self, model: AclModel, inputs: Dataset, batch: int) -> None:
        call = "aclmdlSetDynamicBatchSize (simulated)"
        self._bound(model.device_id, call)
        if batch not in model.desc.gears:
            raise AclError(
                call,
                ACL_ERROR_INVALID_PARAM,
                f"batch size {batch} is not one of the model's gears {list(model.desc.gears)}",
            )
        inputs.handle.gear = batch

    def set_dynamic_dims(self, model: AclModel, inputs: Dataset, dims: tuple[int, ...]) -> None:
        call = "aclmdlSetInputDynamicDims (simulated)"
        self._bound(model.device_id, call)
        desc = model.desc
        if desc.shape_kind != DIMS:
            raise AclError(call, ACL_ERROR_INVALID_PARAM, "the model has no ND gears")
        for index in range(len(desc.shape_gears)):
            if gear_values(desc, index) == tuple(dims):
                inputs.handle.gear = index
                return
        raise AclError(
            call,
            ACL_ERROR_INVALID_PARAM,
            f"dims {list(dims)} are not one of the model's gears: {describe_gears(desc)}",
        )

    def set_dynamic_hw(self, model: AclModel, inputs: Dataset, height: int, width: int) -> None:
        call = "aclmdlSetDynamicHWSize (simulated)"
        self._bound(model.device_id, call)
        desc = model.desc
        if desc.shape_kind != HW:
            raise AclError(call, ACL_ERROR_INVALID_PARAM, "the model has no image-size gears")
        for index in range(len(desc.shape_gears)):
            if gear_values(desc, index) == (height, width):
                inputs.handle.gear = index
                return
        raise AclError(
            call,
            ACL_ERROR_INVALID_PARAM,
            f"image size {height}x{width} is not one of the model's gears: {describe_gears(desc)}",
        )

    def set_input_shapes(
        self, model: AclModel, inputs: Dataset, shapes: list[tuple[int, ...]]
    ) -> None:
        call = "aclmdlSetDatasetTensorDesc (simulated)"
        self._bound(model.device_id, call)
        desc = model.desc
        if desc.shape_kind not in DESCRIBED:
            raise AclError(call, ACL_ERROR_INVALID_PARAM, "the model has no dynamic shapes")
        data = desc.data_inputs()
        if len(shapes) != len(data):
            raise AclError(call, ACL_ERROR_INVALID_PARAM, f"{len(data)} input shapes are needed")
        for tensor, shape, ranges in zip(data, shapes, desc.ranges, strict=True):
            if not in_range(tuple(shape), ranges):
                raise AclError(
                    call,
                    ACL_ERROR_INVALID_PARAM,
                    f"input '{tensor.name}' shape {list(shape)} is outside the model's range "
                    f"{format_range(ranges)}",
                )
        inputs.handle.shapes = [tuple(s) for s in shapes]

    def output_shapes(self, model: AclModel, outputs: Dataset) -> list[tuple[int, ...]]:
        self._bound(model.device_id, "aclmdlGetDatasetTensorDesc (simulated)")
        shapes = outputs.handle.shapes
        if shapes is None:
            raise AclError(
                "aclmdlGetDatasetTensorDesc (simulated)",
                ACL_ERROR_INVALID_PARAM,
                "no execution has produced outputs on this dataset",
            )
        return list(shapes)

    def execute_async(
        self, model: AclModel, inputs: Dataset, outputs: Dataset, stream: Any
    ) -> None:
        call = "aclmdlExecuteAsync (simulated)"
        device = self._bound(model.device_id, call)
        loaded = self._models.get(model.model_id)
        if loaded is None:
            raise AclError(call, ACL_ERROR_INVALID_PARAM, f"model {model.model_id} is not loaded")
        if stream.device is not device:
            raise AclError(call, ACL_ERROR_INVALID_PARAM, "the stream belongs to another NPU")
        desc = model.desc
        in_shapes = self._input_shapes(desc, inputs.handle, loaded.batching, call)
        if len(inputs.handle.buffers) != len(desc.inputs) or len(outputs.handle.buffers) != len(
            desc.outputs
        ):
            raise AclError(call, ACL_ERROR_INVALID_PARAM, "dataset sizes do not match the model")
        if not loaded.busy.acquire(blocking=False):
            raise AclError(
                call,
                ACL_ERROR_INVALID_PARAM,
                f"model {model.model_id} is already executing; a loaded model runs on one "
                "stream at a time",
            )
        in_buffers = list(inputs.handle.buffers)
        out_buffers = list(outputs.handle.buffers)
        out_state: _SimDataset = outputs.handle
        out_state.shapes = None
        hook, perturb = self.on_execute, self.perturb
        cost, timeline = self.cost, self.timelines[model.device_id]
        rows = in_shapes[0][0] if loaded.batching and in_shapes and in_shapes[0] else 1
        rows_equiv = rows * row_share(desc, in_shapes, loaded.batching)
        input_names = [t.name for t in desc.data_inputs()]

        def run() -> None:
            device.clock.start()
            try:
                end = 0
                if cost is not None:
                    weight = loaded.weight
                    end = timeline.reserve(
                        priced_ns(cost, input_names, in_shapes, rows_equiv, weight)
                    )
                if hook is not None:
                    hook(model.device_id, model.model_id)
                feeds = {
                    t.name: _view(device, in_buffers[t.index], t, shape)
                    for t, shape in zip(desc.data_inputs(), in_shapes, strict=True)
                }
                names = [t.name for t in desc.outputs]
                results = loaded.session.run(names, feeds)
                produced = []
                for tensor, result in zip(desc.outputs, results, strict=True):
                    array = np.asarray(result)
                    if perturb and array.dtype.kind == "f":
                        array = (array * (1 + perturb) + perturb).astype(array.dtype)
                    check_declared(tensor, array.shape)
                    target = _view(device, out_buffers[tensor.index], tensor, array.shape)
                    target[...] = array
                    produced.append(tuple(int(d) for d in array.shape))
                out_state.shapes = produced
                if cost is not None:
                    timeline.hold_until(end)
            finally:
                device.clock.stop()
                loaded.busy.release()

        stream.submit(run)

    @staticmethod
    def _input_shapes(
        desc: ModelDesc, state: _SimDataset, batching: bool, call: str
    ) -> list[tuple[int, ...]]:
        """Every data input's shape for this execution, from what was set on the dataset."""
        data = desc.data_inputs()
        if desc.shape_kind in (DIMS, HW):
            if state.gear is None:
                raise AclError(
                    call,
                    ACL_ERROR_INVALID_PARAM,
                    "the model has shape gears and none was set (set_input_dynamic_dims / "
                    "set_dynamic_hw_size)",
                )
            return list(desc.shape_gears[state.gear])
        if desc.shape_kind in DESCRIBED:
            if state.shapes is None:
                raise AclError(
                    call,
                    ACL_ERROR_INVALID_PARAM,
                    "the model has shape ranges and no input tensor descs were set "
                    "(set_dataset_tensor_desc)",
                )
            return list(state.shapes)
        if desc.gears:
            if state.gear is None:
                raise AclError(
                    call,
                    ACL_ERROR_INVALID_PARAM,
                    "the model has batch gears and none was set (set_dynamic_batch_size)",
                )
            return [(state.gear, *t.dims[1:]) for t in data]
        return [tuple(t.dims) for t in data]

    # --- observation --------------------------------------------------------------------

    def active_devices(self) -> list[int]:
        return list(range(len(self.devices)))

    def device_stats(self, device_id: int) -> DeviceStats:
        device = self._device(device_id, "device_stats")
        return DeviceStats(
            device_id=device_id,
            memory_total=device.capacity,
            memory_used=device.used,
            busy_ns=device.clock.busy_ns(),
            utilization=device.clock.utilization(),
        )

    def shutdown(self) -> None:
        return None


def _view(
    device: SimDevice, buffer: DeviceBuffer, tensor: TensorDesc, shape: tuple[int, ...]
) -> Array:
    """`shape` of the tensor's type over the start of a device buffer."""
    count = math.prod(shape)
    allocation = device.lookup(buffer.ptr, "aclmdlExecute (simulated)")
    need = count * tensor.dtype.itemsize
    if need > allocation.size:
        raise AclError(
            "aclmdlExecute (simulated)",
            ACL_ERROR_INVALID_PARAM,
            f"tensor '{tensor.name}' needs {need} bytes, its buffer holds {allocation.size}",
        )
    view: Array = allocation.memory[:need].view(tensor.dtype).reshape(shape)
    return view
