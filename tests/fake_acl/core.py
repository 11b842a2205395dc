"""A strict fake of pyACL (`import acl`) that enforces the contract ge-serve relies on.

- Calls return what pyACL returns: `(value, ret)` tuples, a bare `ret`, or a bare handle.
- `acl.init` comes first; a context must be current on the calling thread before stream,
  memory and model calls, and it must belong to the device of the resource used.
- Device memory is real memory (ctypes buffers), so memcpy moves real bytes; a copy must
  name a device pointer on the right side and fit the allocation.
- A loaded model runs on one stream at a time; reading outputs of an execution before its
  stream is synchronized is an error.
- Dynamic-batch models need `set_dynamic_batch_size` with one of their gears, on the
  `ascend_mbatch_shape_data` input index, before they execute.
- Resources are released in order (data buffers before their memory, streams synchronized
  before they are destroyed, everything before the context); `leaks()` lists what is still
  held and `acl.finalize` fails while anything is.

Every rule broken is also recorded in `violations`, so a test can assert which one fired.
Failures can be injected: `fail_next("acl.rt.malloc", 207001)`.
"""

from __future__ import annotations

import base64
import ctypes
import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import onnxruntime as ort

from . import om as om_format
from .dynamic import DynamicShapes

SUCCESS = 0
INVALID_PARAM = 100000
UNINITIALIZE = 100001
REPEAT_INITIALIZE = 100002
INVALID_FILE = 100003
INVALID_MODEL_ID = 100010
REPEAT_FINALIZE = 100037
RT_PARAM_INVALID = 107000
RT_INVALID_DEVICEID = 107001
RT_CONTEXT_NULL = 107002
RT_MEMORY_ALLOCATION = 207001
RT_INTERNAL = 507899

DYNAMIC_INPUT = "ascend_mbatch_shape_data"
ACL_DTYPES = {
    0: np.float32,
    1: np.float16,
    2: np.int8,
    3: np.int32,
    4: np.uint8,
    6: np.int16,
    7: np.uint16,
    8: np.uint32,
    9: np.int64,
    10: np.uint64,
    11: np.float64,
    12: np.bool_,
}


@dataclass
class _Alloc:
    device: int
    buffer: Any
    size: int


@dataclass
class _Stream:
    device: int
    context: int
    inflight: list[int] = field(default_factory=list)  # model ids
    pending_ptrs: set[int] = field(default_factory=set)


@dataclass
class _Dataset:
    buffers: list[int] = field(default_factory=list)
    # The batch gear, or the index of the ND / image-size gear set on it.
    gear: int | None = None
    # input index -> tensor desc set on it (shape-range models)
    tensor_descs: dict[int, int] = field(default_factory=dict)
    # Output shapes of the last execution, and the descs describing them.
    out_shapes: list[list[int]] | None = None
    out_descs: list[int] = field(default_factory=list)


@dataclass
class _Tensor:
    name: str
    dtype: int
    dims: list[int]
    size: int


@dataclass
class _Model:
    device: int
    session: ort.InferenceSession | None
    inputs: list[_Tensor]
    outputs: list[_Tensor]
    gears: list[int]
    dynamic_index: int | None
    running_on: int | None = None
    # The OM's shape mode (dynamic.py): {"mode": "dims"|"hw"|"range", ...}; {} otherwise.
    shape: dict[str, Any] = field(default_factory=dict)
    last_outputs: list[list[int]] | None = None


class FakeAcl(DynamicShapes):
    def __init__(
        self, devices: int = 1, soc: str = "Ascend310P3", memory: int = 8 * 1024**3
    ) -> None:
        self.device_total = devices
        self.soc = soc
        self.memory = memory
        self.initialized = False
        self.finalized = False
        self.violations: list[str] = []
        self.calls: list[str] = []
        self._failures: dict[str, int] = {}
        self._ids = itertools.count(0x7F00_0000_1000, 0x10)
        self._model_ids = itertools.count(1)
        self._lock = threading.RLock()
        self._tls = threading.local()
        self.set_devices: dict[int, int] = {}
        self.contexts: dict[int, int] = {}  # context -> device
        self.streams: dict[int, _Stream] = {}
        self.allocs: dict[int, _Alloc] = {}
        self.data_buffers: dict[int, tuple[int, int]] = {}
        self.datasets: dict[int, _Dataset] = {}
        self.descs: dict[int, int | None] = {}
        self.tensor_descs: dict[int, tuple[int, list[int], int]] = {}
        self.models: dict[int, _Model] = {}
        self.executions = 0

    # --- helpers ------------------------------------------------------------------------

    def fail_next(self, call: str, code: int) -> None:
        """Make the next call named `call` (e.g. "acl.rt.malloc") return `code`."""
        self._failures[call] = code

    def _enter(self, call: str) -> int:
        self.calls.append(call)
        code = self._failures.pop(call, 0)
        if code:
            return code
        if not self.initialized and call not in ("acl.init", "acl.get_soc_name"):
            return self._violate(UNINITIALIZE, f"{call} before acl.init")
        return 0

    def _violate(self, code: int, message: str) -> int:
        self.violations.append(message)
        return code

    def _context(self, call: str) -> tuple[int, int] | int:
        """The thread's current (context, device), or an error code."""
        context = getattr(self._tls, "context", None)
        if context is None or context not in self.contexts:
            return self._violate(
                RT_CONTEXT_NULL, f"{call} without a current context on this thread"
            )
        return context, self.contexts[context]

    def _enter_in_context(self, call: str) -> tuple[int, int] | int:
        """`_enter`, then the thread's current (context, device): an error code if either
        fails, as pyACL checks both before doing anything."""
        code = self._enter(call)
        return code if code else self._context(call)

    def _new_id(self) -> int:
        return next(self._ids)

    def leaks(self) -> list[str]:
        found = []
        for ptr, alloc in self.allocs.items():
            found.append(f"device memory {ptr:#x} ({alloc.size} bytes) not freed")
        for handle in self.data_buffers:
            found.append(f"data buffer {handle:#x} not destroyed")
        for handle in self.datasets:
            found.append(f"dataset {handle:#x} not destroyed")
        for handle in self.descs:
            found.append(f"model description {handle:#x} not destroyed")
        owned = {h for entry in self.datasets.values() for h in entry.out_descs}
        for handle in self.tensor_descs:
            if handle not in owned:
                found.append(f"tensor description {handle:#x} not destroyed")
        for model_id in self.models:
            found.append(f"model {model_id} not unloaded")
        for stream in self.streams:
            found.append(f"stream {stream:#x} not destroyed")
        for context in self.contexts:
            found.append(f"context {context:#x} not destroyed")
        for device in self.set_devices:
            found.append(f"device {device} not reset")
        return found

    # --- acl ----------------------------------------------------------------------------

    def init(self, config_path: str | None = None) -> int:
        code = self._enter("acl.init")
        if code:
            return code
        if self.initialized:
            return REPEAT_INITIALIZE
        self.initialized = True
        return SUCCESS

    def finalize(self) -> int:
        code = self._enter("acl.finalize")
        if code:
            return code
        if self.finalized:
            return REPEAT_FINALIZE
        leaks = self.leaks()
        if leaks:
            return self._violate(
                INVALID_PARAM, "acl.finalize with resources held: " + "; ".join(leaks)
            )
        self.finalized = True
        self.initialized = False
        return SUCCESS

    def get_soc_name(self) -> str | None:
        self.calls.append("acl.get_soc_name")
        return self.soc if self.initialized else None

    def create_data_buffer(self, data: int, size: int) -> int:
        if self._enter("acl.create_data_buffer"):
            return 0
        alloc = self.allocs.get(data)
        if alloc is None or size > alloc.size:
            self._violate(
                INVALID_PARAM, f"acl.create_data_buffer over {data:#x}, not device memory"
            )
            return 0
        handle = self._new_id()
        self.data_buffers[handle] = (data, size)
        return handle

    def destroy_data_buffer(self, data_buffer: int) -> int:
        code = self._enter("acl.destroy_data_buffer")
        if code:
            return code
        # pyACL's order: destroy each data buffer, then the dataset that held them.
        if self.data_buffers.pop(data_buffer, None) is None:
            return self._violate(
                INVALID_PARAM, f"acl.destroy_data_buffer of unknown {data_buffer:#x}"
            )
        return SUCCESS

    def get_data_buffer_addr(self, data_buffer: int) -> int:
        return self.data_buffers.get(data_buffer, (0, 0))[0]

    def get_data_buffer_size_v2(self, data_buffer: int) -> int:
        return self.data_buffers.get(data_buffer, (0, 0))[1]

    # --- acl.rt -------------------------------------------------------------------------

    def rt_get_device_count(self) -> tuple[int, int]:
        code = self._enter("acl.rt.get_device_count")
        return (0, code) if code else (self.device_total, SUCCESS)

    def rt_set_device(self, device_id: int) -> int:
        code = self._enter("acl.rt.set_device")
        if code:
            return code
        if not 0 <= device_id < self.device_total:
            return self._violate(
                RT_INVALID_DEVICEID, f"acl.rt.set_device({device_id}): no such device"
            )
        self.set_devices[device_id] = self.set_devices.get(device_id, 0) + 1
        return SUCCESS

    def rt_reset_device(self, device_id: int) -> int:
        code = self._enter("acl.rt.reset_device")
        if code:
            return code
        if device_id not in self.set_devices:
            return self._violate(RT_INVALID_DEVICEID, f"acl.rt.reset_device({device_id}) not set")
        if any(d == device_id for d in self.contexts.values()):
            return self._violate(
                INVALID_PARAM, f"acl.rt.reset_device({device_id}) with a live context"
            )
        self.set_devices[device_id] -= 1
        if self.set_devices[device_id] == 0:
            del self.set_devices[device_id]
        return SUCCESS

    def rt_create_context(self, device_id: int) -> tuple[int, int]:
        code = self._enter("acl.rt.create_context")
        if code:
            return 0, code
        if device_id not in self.set_devices:
            return 0, self._violate(RT_INVALID_DEVICEID, "acl.rt.create_context before set_device")
        context = self._new_id()
        self.contexts[context] = device_id
        self._tls.context = context
        return context, SUCCESS

    def rt_destroy_context(self, context: int) -> int:
        code = self._enter("acl.rt.destroy_context")
        if code:
            return code
        device = self.contexts.get(context)
        if device is None:
            return self._violate(INVALID_PARAM, "acl.rt.destroy_context of an unknown context")
        held = [s for s in self.streams.values() if s.context == context]
        held_models = [m for m in self.models.values() if m.device == device]
        held_memory = [a for a in self.allocs.values() if a.device == device]
        if held or held_models or held_memory:
            return self._violate(
                INVALID_PARAM,
                "acl.rt.destroy_context while streams, models or memory of the device remain",
            )
        del self.contexts[context]
        if getattr(self._tls, "context", None) == context:
            self._tls.context = None
        return SUCCESS

    def rt_set_context(self, context: int) -> int:
        code = self._enter("acl.rt.set_context")
        if code:
            return code
        if context not in self.contexts:
            return self._violate(INVALID_PARAM, "acl.rt.set_context of an unknown context")
        self._tls.context = context
        return SUCCESS

    def rt_get_context(self) -> tuple[int, int]:
        context = getattr(self._tls, "context", None)
        return (context, SUCCESS) if context else (0, RT_CONTEXT_NULL)

    def rt_create_stream(self) -> tuple[int, int]:
        current = self._enter_in_context("acl.rt.create_stream")
        if isinstance(current, int):
            return 0, current
        context, device = current
        stream = self._new_id()
        self.streams[stream] = _Stream(device, context)
        return stream, SUCCESS

    def rt_destroy_stream(self, stream: int) -> int:
        current = self._enter_in_context("acl.rt.destroy_stream")
        if isinstance(current, int):
            return current
        entry = self.streams.get(stream)
        if entry is None:
            return self._violate(INVALID_PARAM, "acl.rt.destroy_stream of an unknown stream")
        if entry.inflight:
            return self._violate(INVALID_PARAM, "acl.rt.destroy_stream with unsynchronized work")
        del self.streams[stream]
        return SUCCESS

    def rt_synchronize_stream(self, stream: int) -> int:
        code = self._enter("acl.rt.synchronize_stream")
        current = self._context("acl.rt.synchronize_stream")
        entry = self.streams.get(stream)
        if entry is not None:
            for model_id in entry.inflight:
                model = self.models.get(model_id)
                if model is not None:
                    model.running_on = None
            entry.inflight.clear()
            entry.pending_ptrs.clear()
        if code:
            return code
        if isinstance(current, int):
            return current
        if entry is None:
            return self._violate(INVALID_PARAM, "acl.rt.synchronize_stream of an unknown stream")
        if entry.device != current[1]:
            return self._violate(
                INVALID_PARAM, "acl.rt.synchronize_stream from another device's context"
            )
        return SUCCESS

    def rt_malloc(self, size: int, policy: int) -> tuple[int, int]:
        current = self._enter_in_context("acl.rt.malloc")
        if isinstance(current, int):
            return 0, current
        if size <= 0 or policy not in (0, 1, 2):
            return 0, self._violate(INVALID_PARAM, f"acl.rt.malloc({size}, {policy})")
        device = current[1]
        used = sum(a.size for a in self.allocs.values() if a.device == device)
        if used + size > self.memory:
            return 0, RT_MEMORY_ALLOCATION
        buffer = ctypes.create_string_buffer(size)
        ptr = ctypes.addressof(buffer)
        self.allocs[ptr] = _Alloc(device, buffer, size)
        return ptr, SUCCESS

    def rt_free(self, ptr: int) -> int:
        current = self._enter_in_context("acl.rt.free")
        if isinstance(current, int):
            return current
        alloc = self.allocs.get(ptr)
        if alloc is None:
            return self._violate(INVALID_PARAM, f"acl.rt.free({ptr:#x}): not device memory")
        if alloc.device != current[1]:
            return self._violate(INVALID_PARAM, "acl.rt.free from another device's context")
        if any(data == ptr for data, _ in self.data_buffers.values()):
            return self._violate(
                INVALID_PARAM, "acl.rt.free of memory a data buffer still describes"
            )
        del self.allocs[ptr]
        return SUCCESS

    def rt_memcpy(self, dst: int, dest_max: int, src: int, count: int, kind: int) -> int:
        current = self._enter_in_context("acl.rt.memcpy")
        if isinstance(current, int):
            return current
        if kind == 1:  # host to device
            device_ptr, host_ptr = dst, src
        elif kind == 2:  # device to host
            device_ptr, host_ptr = src, dst
        else:
            return self._violate(INVALID_PARAM, f"acl.rt.memcpy kind {kind} is not H2D or D2H")
        alloc = self.allocs.get(device_ptr)
        if alloc is None:
            return self._violate(
                INVALID_PARAM, "acl.rt.memcpy: the device side is not device memory"
            )
        if host_ptr in self.allocs:
            return self._violate(INVALID_PARAM, "acl.rt.memcpy: the host side is device memory")
        if alloc.device != current[1]:
            return self._violate(INVALID_PARAM, "acl.rt.memcpy from another device's context")
        if count > dest_max or count > alloc.size:
            return self._violate(INVALID_PARAM, f"acl.rt.memcpy of {count} bytes overflows")
        if kind == 2 and any(device_ptr in s.pending_ptrs for s in self.streams.values()):
            return self._violate(
                INVALID_PARAM, "acl.rt.memcpy reads outputs before acl.rt.synchronize_stream"
            )
        ctypes.memmove(dst, src, count)
        return SUCCESS

    def rt_get_mem_info(self, attr: int) -> tuple[int, int, int]:
        current = self._enter_in_context("acl.rt.get_mem_info")
        if isinstance(current, int):
            return 0, 0, current
        used = sum(a.size for a in self.allocs.values() if a.device == current[1])
        return self.memory - used, self.memory, SUCCESS

    def rt_get_device_utilization_rate(self, device_id: int) -> tuple[dict[str, int], int]:
        code = self._enter("acl.rt.get_device_utilization_rate")
        if code:
            return {}, code
        rate = {
            "cube_utilization": 0,
            "vector_utilization": 0,
            "aicpu_utilization": 0,
            "memory_utilization": -1,
        }
        return rate, SUCCESS

    # --- acl.mdl: models ----------------------------------------------------------------

    def mdl_load_from_file(self, model_path: str) -> tuple[int, int]:
        current = self._enter_in_context("acl.mdl.load_from_file")
        if isinstance(current, int):
            return 0, current
        try:
            data = om_format.read(Path(model_path))
        except (OSError, ValueError):
            return 0, self._violate(
                INVALID_FILE, f"acl.mdl.load_from_file: '{model_path}' is not an OM"
            )
        if data["soc_version"] != self.soc:
            return 0, self._violate(
                INVALID_FILE, f"OM built for {data['soc_version']}, the device is {self.soc}"
            )
        if data["onnx_b64"] is None:
            return 0, self._violate(INVALID_FILE, "this fake OM cannot be executed")
        gears = [int(g) for g in data["gears"]]
        rows = max(gears) if gears else 1

        def tensor(entry: dict[str, Any]) -> _Tensor:
            dims = [int(d) for d in entry["dims"]]
            count = int(np.prod([rows if d < 0 else d for d in dims]))
            size = count * np.dtype(ACL_DTYPES[entry["dtype"]]).itemsize
            return _Tensor(entry["name"], int(entry["dtype"]), dims, size)

        inputs = [tensor(e) for e in data["inputs"]]
        outputs = [tensor(e) for e in data["outputs"]]
        dynamic_index = None
        if gears:
            dynamic_index = len(inputs)
            inputs.append(_Tensor(DYNAMIC_INPUT, 9, [1], 8))
        session = ort.InferenceSession(
            base64.b64decode(data["onnx_b64"]), providers=["CPUExecutionProvider"]
        )
        shape: dict[str, Any] = dict(data.get("shape") or {})
        if shape:
            sized = om_format.shaped_tensors(data, session)
            inputs = [_Tensor(t["name"], t["dtype"], t["dims"], t["size"]) for t in sized[0]]
            outputs = [_Tensor(t["name"], t["dtype"], t["dims"], t["size"]) for t in sized[1]]
            if shape["mode"] in ("dims", "hw"):
                dynamic_index = len(inputs)
                inputs.append(_Tensor(DYNAMIC_INPUT, 9, [1], 8))
        model_id = next(self._model_ids)
        self.models[model_id] = _Model(
            current[1], session, inputs, outputs, gears, dynamic_index, shape=shape
        )
        return model_id, SUCCESS

    def mdl_unload(self, model_id: int) -> int:
        current = self._enter_in_context("acl.mdl.unload")
        if isinstance(current, int):
            return current
        model = self.models.get(model_id)
        if model is None:
            return self._violate(INVALID_MODEL_ID, f"acl.mdl.unload({model_id}): not loaded")
        if model.running_on is not None:
            return self._violate(INVALID_PARAM, "acl.mdl.unload of a model that is still executing")
        del self.models[model_id]
        return SUCCESS

    def mdl_create_desc(self) -> int:
        if self._enter("acl.mdl.create_desc"):
            return 0
        handle = self._new_id()
        self.descs[handle] = None
        return handle

    def mdl_destroy_desc(self, model_desc: int) -> int:
        code = self._enter("acl.mdl.destroy_desc")
        if code:
            return code
        if self.descs.pop(model_desc, "missing") == "missing":
            return self._violate(INVALID_PARAM, "acl.mdl.destroy_desc of an unknown description")
        return SUCCESS

    def mdl_get_desc(self, model_desc: int, model_id: int) -> int:
        code = self._enter("acl.mdl.get_desc")
        if code:
            return code
        if model_desc not in self.descs or model_id not in self.models:
            return self._violate(INVALID_PARAM, "acl.mdl.get_desc with an unknown desc or model")
        self.descs[model_desc] = model_id
        return SUCCESS

    def _desc_model(self, model_desc: int) -> _Model | None:
        model_id = self.descs.get(model_desc)
        return self.models.get(model_id) if model_id is not None else None

    def mdl_get_num_inputs(self, model_desc: int) -> int:
        model = self._desc_model(model_desc)
        return len(model.inputs) if model else 0

    def mdl_get_num_outputs(self, model_desc: int) -> int:
        model = self._desc_model(model_desc)
        return len(model.outputs) if model else 0

    def _dims(
        self, tensors: list[_Tensor] | None, index: int, call: str
    ) -> tuple[dict[str, Any], int]:
        code = self._enter(call)
        if code:
            return {}, code
        if tensors is None or not 0 <= index < len(tensors):
            return {}, self._violate(INVALID_PARAM, f"{call}: index {index} out of range")
        tensor = tensors[index]
        return {
            "name": tensor.name,
            "dimCount": len(tensor.dims),
            "dims": list(tensor.dims),
        }, SUCCESS

    def mdl_get_input_dims(self, model_desc: int, index: int) -> tuple[dict[str, Any], int]:
        model = self._desc_model(model_desc)
        return self._dims(model.inputs if model else None, index, "acl.mdl.get_input_dims")

    def mdl_get_output_dims(self, model_desc: int, index: int) -> tuple[dict[str, Any], int]:
        model = self._desc_model(model_desc)
        found, code = self._dims(model.outputs if model else None, index, "acl.mdl.get_output_dims")
        if not code:
            found["name"] = f"Node_{index}:{index}:{found['name']}"
        return found, code

    def mdl_get_input_data_type(self, model_desc: int, index: int) -> int:
        model = self._desc_model(model_desc)
        return model.inputs[index].dtype if model else -1

    def mdl_get_output_data_type(self, model_desc: int, index: int) -> int:
        model = self._desc_model(model_desc)
        return model.outputs[index].dtype if model else -1

    def mdl_get_input_size_by_index(self, model_desc: int, index: int) -> int:
        model = self._desc_model(model_desc)
        return model.inputs[index].size if model else 0

    def mdl_get_output_size_by_index(self, model_desc: int, index: int) -> int:
        model = self._desc_model(model_desc)
        return model.outputs[index].size if model else 0

    def mdl_get_input_name_by_index(self, model_desc: int, index: int) -> str:
        model = self._desc_model(model_desc)
        return model.inputs[index].name if model else ""

    def mdl_get_dynamic_batch(self, model_desc: int) -> tuple[dict[str, Any], int]:
        code = self._enter("acl.mdl.get_dynamic_batch")
        if code:
            return {}, code
        model = self._desc_model(model_desc)
        if model is None:
            return {}, self._violate(INVALID_PARAM, "acl.mdl.get_dynamic_batch: unknown desc")
        return {"batchCount": len(model.gears), "batch": list(model.gears)}, SUCCESS

    def mdl_get_input_index_by_name(self, model_desc: int, name: str) -> tuple[int, int]:
        code = self._enter("acl.mdl.get_input_index_by_name")
        if code:
            return 0, code
        model = self._desc_model(model_desc)
        if model is None:
            return 0, self._violate(INVALID_PARAM, "acl.mdl.get_input_index_by_name: unknown desc")
        for index, tensor in enumerate(model.inputs):
            if tensor.name == name:
                return index, SUCCESS
        return 0, INVALID_PARAM

    # --- acl.mdl: datasets and execution ------------------------------------------------

    def mdl_create_dataset(self) -> int:
        if self._enter("acl.mdl.create_dataset"):
            return 0
        handle = self._new_id()
        self.datasets[handle] = _Dataset()
        return handle

    def mdl_destroy_dataset(self, dataset: int) -> int:
        code = self._enter("acl.mdl.destroy_dataset")
        if code:
            return code
        entry = self.datasets.pop(dataset, None)
        if entry is None:
            return self._violate(INVALID_PARAM, "acl.mdl.destroy_dataset of an unknown dataset")
        for handle in entry.out_descs:
            self.tensor_descs.pop(handle, None)
        return SUCCESS

    def mdl_add_dataset_buffer(self, dataset: int, data_buffer: int) -> tuple[int, int]:
        code = self._enter("acl.mdl.add_dataset_buffer")
        if code:
            return dataset, code
        entry = self.datasets.get(dataset)
        if entry is None or data_buffer not in self.data_buffers:
            return dataset, self._violate(
                INVALID_PARAM, "acl.mdl.add_dataset_buffer: unknown handle"
            )
        entry.buffers.append(data_buffer)
        return dataset, SUCCESS

    def mdl_get_dataset_num_buffers(self, dataset: int) -> int:
        entry = self.datasets.get(dataset)
        return len(entry.buffers) if entry else 0

    def mdl_get_dataset_buffer(self, dataset: int, index: int) -> int:
        entry = self.datasets.get(dataset)
        return entry.buffers[index] if entry and 0 <= index < len(entry.buffers) else 0

    def mdl_set_dynamic_batch_size(
        self, model_id: int, dataset: int, index: int, batch_size: int
    ) -> int:
        call = "acl.mdl.set_dynamic_batch_size"
        current = self._enter_in_context(call)
        if isinstance(current, int):
            return current
        model = self.models.get(model_id)
        entry = self.datasets.get(dataset)
        if model is None or entry is None:
            return self._violate(INVALID_PARAM, f"{call}: unknown model or dataset")
        if model.dynamic_index is None:
            return self._violate(INVALID_PARAM, f"{call} on a model without batch gears")
        if index != model.dynamic_index:
            return self._violate(
                INVALID_PARAM, f"{call}: index {index} is not the {DYNAMIC_INPUT} input"
            )
        if batch_size not in model.gears:
            return self._violate(
                INVALID_PARAM, f"{call}: {batch_size} is not a gear of the model {model.gears}"
            )
        if index >= len(entry.buffers):
            return self._violate(INVALID_PARAM, f"{call}: the dataset has no buffer {index}")
        ptr, size = self.data_buffers[entry.buffers[index]]
        ctypes.memmove(ptr, np.array([batch_size], dtype=np.int64).ctypes.data, min(size, 8))
        entry.gear = batch_size
        return SUCCESS

    def mdl_execute_async(self, model_id: int, input: int, output: int, stream: int) -> int:
        call = "acl.mdl.execute_async"
        current = self._enter_in_context(call)
        if isinstance(current, int):
            return current
        model = self.models.get(model_id)
        if model is None:
            return self._violate(INVALID_MODEL_ID, f"{call}: model {model_id} is not loaded")
        entry = self.streams.get(stream)
        if entry is None:
            return self._violate(INVALID_PARAM, f"{call}: unknown stream")
        if entry.device != model.device or current[1] != model.device:
            return self._violate(
                INVALID_PARAM, f"{call}: model, stream and context differ in device"
            )
        if model.running_on is not None:
            return self._violate(
                INVALID_PARAM,
                f"{call}: model {model_id} is already executing on a stream; one loaded model "
                "runs on one stream at a time",
            )
        inputs = self.datasets.get(input)
        outputs = self.datasets.get(output)
        if inputs is None or outputs is None:
            return self._violate(INVALID_PARAM, f"{call}: unknown dataset")
        if len(inputs.buffers) != len(model.inputs) or len(outputs.buffers) != len(model.outputs):
            return self._violate(
                INVALID_PARAM, f"{call}: dataset buffer counts do not match the model"
            )
        shapes: list[list[int]] | None = None
        if model.shape:
            found = self.shaped_inputs(model, inputs, call)
            if isinstance(found, int):
                return found
            shapes = found
        if model.gears:
            if inputs.gear is None:
                return self._violate(INVALID_PARAM, f"{call}: no gear set on a dynamic-batch model")
            batch = inputs.gear
        else:
            batch = 1
        feeds: dict[str, Any] = {}
        data_index = 0
        for index, tensor in enumerate(model.inputs):
            if index == model.dynamic_index:
                continue
            dims = shapes[data_index] if shapes is not None else None
            data_index += 1
            array = self._read(inputs.buffers[index], tensor, batch, call, dims)
            if array is None:
                return INVALID_PARAM
            feeds[tensor.name] = array
        assert model.session is not None
        try:
            results = model.session.run([t.name for t in model.outputs], feeds)
        except Exception as exc:
            self.violations.append(f"{call}: model failed: {exc}")
            return RT_INTERNAL
        for index, (tensor, result) in enumerate(zip(model.outputs, results, strict=True)):
            ptr, size = self.data_buffers[outputs.buffers[index]]
            data = np.ascontiguousarray(result, dtype=ACL_DTYPES[tensor.dtype])
            if data.nbytes > size:
                return self._violate(INVALID_PARAM, f"{call}: output buffer {index} too small")
            ctypes.memmove(ptr, data.ctypes.data, data.nbytes)
            entry.pending_ptrs.add(ptr)
        if model.shape:
            self.record_outputs(model, outputs, [list(np.shape(r)) for r in results])
        model.running_on = stream
        entry.inflight.append(model_id)
        self.executions += 1
        return SUCCESS

    def _read(
        self, data_buffer: int, tensor: _Tensor, batch: int, call: str, shape: Any = None
    ) -> Any:
        ptr, size = self.data_buffers[data_buffer]
        dims = list(shape) if shape is not None else [batch if d < 0 else d for d in tensor.dims]
        dtype = np.dtype(ACL_DTYPES[tensor.dtype])
        need = int(np.prod(dims)) * dtype.itemsize
        if need > size:
            self._violate(INVALID_PARAM, f"{call}: input '{tensor.name}' buffer too small")
            return None
        raw = ctypes.string_at(ptr, need)
        return np.frombuffer(raw, dtype=dtype).reshape(dims)


def build_module(fake: FakeAcl) -> ModuleType:
    """An `acl` module object whose functions drive `fake`."""
    module = ModuleType("acl")
    install(fake, module)
    return module


def install(fake: FakeAcl, module: ModuleType) -> None:
    rt = SimpleNamespace()
    mdl = SimpleNamespace()
    for name in dir(fake):
        if name.startswith("rt_"):
            setattr(rt, name[3:], getattr(fake, name))
        elif name.startswith("mdl_"):
            setattr(mdl, name[4:], getattr(fake, name))
    module.rt = rt  # type: ignore[attr-defined]
    module.mdl = mdl  # type: ignore[attr-defined]
    for name in (
        "init",
        "finalize",
        "get_soc_name",
        "create_data_buffer",
        "destroy_data_buffer",
        "get_data_buffer_addr",
        "get_data_buffer_size_v2",
        "create_tensor_desc",
        "destroy_tensor_desc",
        "get_tensor_desc_num_dims",
        "get_tensor_desc_dim_v2",
    ):
        setattr(module, name, getattr(fake, name))
    module.fake = fake  # type: ignore[attr-defined]
