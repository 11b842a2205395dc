"""The ACL shim over pyACL (`import acl`), for Ascend NPUs.

Calls do not set a context themselves: the caller binds the device to its thread first
(`bind_thread`), as pyACL requires, so a missing bind shows up as pyACL's own error.

pyACL calls return `(value, ret)` tuples or a bare `ret`; every nonzero `ret` becomes an
`AclError` that names the call and the code. Host memory is handed to pyACL as the numpy
array's address (`ndarray.ctypes.data`), so no pyACL helper is needed for it.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .acl import (
    ACL_DTYPES,
    ACL_ERROR_REPEAT_INITIALIZE,
    DYNAMIC_BATCH_INPUT,
    NUMPY_TO_ACL,
    AclError,
    AclModel,
    Array,
    BusyClock,
    Dataset,
    DeviceBuffer,
    DeviceStats,
    ModelDesc,
    ModelSource,
    PreparedModel,
    TensorDesc,
)
from .acl_real_shapes import read_shapes
from .compile import AtcCompiler, AtcJob
from .shapes import DESCRIBED

log = logging.getLogger(__name__)

ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_DDR_MEM = 0
ACL_HBM_MEM = 1
ACL_ERROR_REPEAT_FINALIZE = 100037
ACL_FORMAT_ND = 2


def check(ret: Any, call: str) -> None:
    code = int(ret)
    if code != 0:
        raise AclError(call, code)


def value(result: Any, call: str) -> Any:
    """Unpack a `(value, ret)` pair, raising on a nonzero `ret`."""
    if not isinstance(result, tuple) or len(result) != 2:
        raise AclError(call, -1, f"expected a (value, ret) pair, got {result!r}")
    got, ret = result
    check(ret, call)
    return got


@dataclass(slots=True)
class _Device:
    device_id: int
    context: Any
    refs: int
    clock: BusyClock


class AclReal:
    """pyACL on real hardware. One instance per process (it calls acl.init)."""

    def __init__(self, acl: ModuleType, compiler: AtcCompiler) -> None:
        self._acl = acl
        self.compiler = compiler
        self._lock = threading.Lock()
        self._devices: dict[int, _Device] = {}
        self._tls = threading.local()
        self._inflight: dict[Any, int] = {}  # stream handle -> executions not yet synced
        ret = int(acl.init())
        if ret not in (0, ACL_ERROR_REPEAT_INITIALIZE):
            raise AclError("acl.init", ret)
        self._finalized = False

    @property
    def kind(self) -> str:
        return "npu"

    def describe(self) -> str:
        return f"Ascend NPU via pyACL ({self.device_count()} device(s), SoC {self.soc_name()})"

    def device_count(self) -> int:
        return int(value(self._acl.rt.get_device_count(), "acl.rt.get_device_count"))

    def soc_name(self) -> str:
        name = self._acl.get_soc_name()
        if not name:
            raise AclError("acl.get_soc_name", -1, "returned no SoC name")
        return str(name)

    # --- devices and contexts -----------------------------------------------------------

    def open_device(self, device_id: int) -> None:
        with self._lock:
            device = self._devices.get(device_id)
            if device is not None:
                device.refs += 1
            else:
                check(self._acl.rt.set_device(device_id), "acl.rt.set_device")
                try:
                    context = value(self._acl.rt.create_context(device_id), "acl.rt.create_context")
                except Exception:
                    # The device is set but holds no context yet: release it, or it stays
                    # set until the process ends and acl.finalize reports it.
                    ret = int(self._acl.rt.reset_device(device_id))
                    if ret != 0:
                        log.warning("acl.rt.reset_device(%d) failed with %d", device_id, ret)
                    raise
                device = _Device(device_id, context, 1, BusyClock())
                self._devices[device_id] = device
                # create_context makes the new context current on this thread.
                self._tls.device = device
        self.bind_thread(device_id)

    def close_device(self, device_id: int) -> None:
        with self._lock:
            device = self._devices.get(device_id)
            if device is None:
                return
            device.refs -= 1
            if device.refs > 0:
                return
            del self._devices[device_id]
        check(self._acl.rt.destroy_context(device.context), "acl.rt.destroy_context")
        self._tls.device = None
        check(self._acl.rt.reset_device(device_id), "acl.rt.reset_device")

    def bind_thread(self, device_id: int) -> None:
        device = self._device(device_id)
        if getattr(self._tls, "device", None) is not device:
            check(self._acl.rt.set_context(device.context), "acl.rt.set_context")
            self._tls.device = device

    def _device(self, device_id: int) -> _Device:
        device = self._devices.get(device_id)
        if device is None:
            raise AclError("acl.rt.set_context", -1, f"NPU {device_id} is not open")
        return device

    # --- streams ------------------------------------------------------------------------

    def create_stream(self, device_id: int) -> Any:
        return value(self._acl.rt.create_stream(), "acl.rt.create_stream")

    def destroy_stream(self, device_id: int, stream: Any) -> None:
        check(self._acl.rt.destroy_stream(stream), "acl.rt.destroy_stream")

    def synchronize_stream(self, device_id: int, stream: Any) -> None:
        try:
            check(self._acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
        finally:
            pending = self._inflight.pop(stream, 0)
            clock = self._device(device_id).clock
            for _ in range(pending):
                clock.stop()

    # --- memory -------------------------------------------------------------------------

    def malloc(self, device_id: int, size: int) -> DeviceBuffer:
        ptr = value(self._acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST), "acl.rt.malloc")
        return DeviceBuffer(device_id, int(ptr), size)

    def free(self, buffer: DeviceBuffer) -> None:
        check(self._acl.rt.free(buffer.ptr), "acl.rt.free")

    def memcpy_h2d(self, dst: DeviceBuffer, src: Array) -> None:
        host = np.ascontiguousarray(src)
        check(
            self._acl.rt.memcpy(
                dst.ptr, dst.size, host.ctypes.data, host.nbytes, ACL_MEMCPY_HOST_TO_DEVICE
            ),
            "acl.rt.memcpy(host to device)",
        )

    def memcpy_d2h(self, dst: Array, src: DeviceBuffer) -> None:
        if not dst.flags.c_contiguous:
            raise AclError("acl.rt.memcpy(device to host)", -1, "host array is not contiguous")
        check(
            self._acl.rt.memcpy(
                dst.ctypes.data, dst.nbytes, src.ptr, dst.nbytes, ACL_MEMCPY_DEVICE_TO_HOST
            ),
            "acl.rt.memcpy(device to host)",
        )

    # --- models -------------------------------------------------------------------------

    def prepare_model(self, source: ModelSource) -> PreparedModel:
        suffix = source.path.suffix.lower()
        if suffix == ".om":
            return PreparedModel(source.path, source, "prebuilt OM")
        dynamic = source.gears if len(source.gears) > 1 and not source.shapes_vary else ()
        job = AtcJob(
            model=source.path,
            soc_version=self.soc_name(),
            input_shape=source.input_shape,
            dynamic_batch_size=dynamic,
            options=source.atc_options,
        )
        om, hit = self.compiler.compile(job)
        return PreparedModel(om, source, "atc cache hit" if hit else "compiled by atc")

    def load_model(self, device_id: int, prepared: PreparedModel) -> AclModel:
        acl = self._acl
        size = self._query_size(prepared.path)
        model_id = value(acl.mdl.load_from_file(str(prepared.path)), "acl.mdl.load_from_file")
        desc = acl.mdl.create_desc()
        try:
            if not desc:
                raise AclError("acl.mdl.create_desc", -1, "returned a null description")
            check(acl.mdl.get_desc(desc, model_id), "acl.mdl.get_desc")
            model_desc = self._read_desc(desc)
        except Exception:
            if desc:
                acl.mdl.destroy_desc(desc)
            acl.mdl.unload(model_id)
            raise
        return AclModel(int(model_id), device_id, model_desc, size, desc)

    def _query_size(self, path: Path) -> int:
        """The device bytes loading the OM takes: its work space plus its weights."""
        work, weight, ret = self._acl.mdl.query_size(str(path))
        if int(ret) != 0:
            log.warning(
                "acl.mdl.query_size('%s') failed with ACL error %s; counting the OM file's "
                "size as its device memory",
                path,
                ret,
            )
            return Path(path).stat().st_size
        return int(work) + int(weight)

    def _read_desc(self, desc: Any) -> ModelDesc:
        acl = self._acl
        inputs = []
        for index in range(int(acl.mdl.get_num_inputs(desc))):
            dims = value(acl.mdl.get_input_dims(desc, index), "acl.mdl.get_input_dims")
            dtype = int(acl.mdl.get_input_data_type(desc, index))
            size = int(acl.mdl.get_input_size_by_index(desc, index))
            inputs.append(_tensor(index, str(dims["name"]), dtype, dims, size))
        outputs = []
        for index in range(int(acl.mdl.get_num_outputs(desc))):
            dims = value(acl.mdl.get_output_dims(desc, index), "acl.mdl.get_output_dims")
            dtype = int(acl.mdl.get_output_data_type(desc, index))
            size = int(acl.mdl.get_output_size_by_index(desc, index))
            # OM output names read "<node>:<index>:<tensor>"; the tensor name is last.
            name = str(dims["name"]).split(":")[-1]
            outputs.append(_tensor(index, name, dtype, dims, size))
        batch = value(acl.mdl.get_dynamic_batch(desc), "acl.mdl.get_dynamic_batch")
        count = int(batch.get("batchCount", 0))
        gears = tuple(sorted(int(g) for g in list(batch.get("batch", []))[:count]))
        dynamic_index = None
        shaped = read_shapes(acl, desc, inputs, DYNAMIC_BATCH_INPUT, bool(gears))
        if gears or shaped.kind not in ("", *DESCRIBED):
            dynamic_index = int(
                value(
                    acl.mdl.get_input_index_by_name(desc, DYNAMIC_BATCH_INPUT),
                    "acl.mdl.get_input_index_by_name",
                )
            )
        return ModelDesc(
            tuple(inputs),
            tuple(outputs),
            gears,
            dynamic_index,
            shape_kind=shaped.kind,
            shape_gears=shaped.gears(inputs, dynamic_index),
            ranges=shaped.ranges,
        )

    def unload_model(self, model: AclModel) -> None:
        # Both are attempted: a failed unload must not leak the description too.
        unloaded = int(self._acl.mdl.unload(model.model_id))
        destroyed = int(self._acl.mdl.destroy_desc(model.handle))
        check(unloaded, "acl.mdl.unload")
        check(destroyed, "acl.mdl.destroy_desc")

    def create_dataset(self, device_id: int, buffers: list[DeviceBuffer]) -> Dataset:
        acl = self._acl
        handle = acl.mdl.create_dataset()
        if not handle:
            raise AclError("acl.mdl.create_dataset", -1, "returned a null dataset")
        dataset = Dataset(handle)
        try:
            for buffer in buffers:
                data = acl.create_data_buffer(buffer.ptr, buffer.size)
                if not data:
                    raise AclError("acl.create_data_buffer", -1, "returned a null buffer")
                dataset.buffers.append(data)
                value(acl.mdl.add_dataset_buffer(handle, data), "acl.mdl.add_dataset_buffer")
        except Exception:
            self.destroy_dataset(device_id, dataset)
            raise
        return dataset

    def destroy_dataset(self, device_id: int, dataset: Dataset) -> None:
        # aclmdlDestroyDataset does not free the data buffers it holds.
        for data in dataset.buffers:
            check(self._acl.destroy_data_buffer(data), "acl.destroy_data_buffer")
        dataset.buffers.clear()
        check(self._acl.mdl.destroy_dataset(dataset.handle), "acl.mdl.destroy_dataset")
        # The dataset held pointers to these; they go once it is gone.
        self._drop_tensor_descs(dataset.tensor_descs)

    def set_dynamic_batch(self, model: AclModel, inputs: Dataset, batch: int) -> None:
        index = model.desc.dynamic_index
        if index is None:
            raise AclError("acl.mdl.set_dynamic_batch_size", -1, "the model has no batch gears")
        check(
            self._acl.mdl.set_dynamic_batch_size(model.model_id, inputs.handle, index, batch),
            "acl.mdl.set_dynamic_batch_size",
        )

    def set_dynamic_dims(self, model: AclModel, inputs: Dataset, dims: tuple[int, ...]) -> None:
        index = model.desc.dynamic_index
        if index is None:
            raise AclError("acl.mdl.set_input_dynamic_dims", -1, "the model has no ND gears")
        io_dims = {"name": "", "dimCount": len(dims), "dims": [int(d) for d in dims]}
        check(
            self._acl.mdl.set_input_dynamic_dims(model.model_id, inputs.handle, index, io_dims),
            "acl.mdl.set_input_dynamic_dims",
        )

    def set_dynamic_hw(self, model: AclModel, inputs: Dataset, height: int, width: int) -> None:
        index = model.desc.dynamic_index
        if index is None:
            raise AclError("acl.mdl.set_dynamic_hw_size", -1, "the model has no image-size gears")
        check(
            self._acl.mdl.set_dynamic_hw_size(
                model.model_id, inputs.handle, index, int(height), int(width)
            ),
            "acl.mdl.set_dynamic_hw_size",
        )

    def set_input_shapes(
        self, model: AclModel, inputs: Dataset, shapes: list[tuple[int, ...]]
    ) -> None:
        acl = self._acl
        # The dataset keeps pointers to its tensor descs: the old ones go only once
        # every input points at a new one.
        old, inputs.tensor_descs = inputs.tensor_descs, []
        try:
            for tensor, shape in zip(model.desc.data_inputs(), shapes, strict=True):
                code = NUMPY_TO_ACL.get(tensor.dtype)
                if code is None:
                    raise AclError(
                        "acl.create_tensor_desc", -1, f"no aclDataType for {tensor.dtype}"
                    )
                handle = acl.create_tensor_desc(code, [int(d) for d in shape], ACL_FORMAT_ND)
                if not handle:
                    raise AclError("acl.create_tensor_desc", -1, "returned a null description")
                inputs.tensor_descs.append(handle)
                _, ret = acl.mdl.set_dataset_tensor_desc(inputs.handle, handle, tensor.index)
                check(ret, "acl.mdl.set_dataset_tensor_desc")
        except Exception:
            # Some inputs may still point at old descs: keep every desc with the dataset,
            # so the next successful call (or destroying the dataset) destroys them all.
            inputs.tensor_descs[:0] = old
            raise
        self._drop_tensor_descs(old)

    def _drop_tensor_descs(self, handles: list[Any]) -> None:
        for handle in handles:
            check(self._acl.destroy_tensor_desc(handle), "acl.destroy_tensor_desc")
        handles.clear()

    def output_shapes(self, model: AclModel, outputs: Dataset) -> list[tuple[int, ...]]:
        acl = self._acl
        shapes: list[tuple[int, ...]] = []
        for tensor in model.desc.outputs:
            if model.desc.shape_kind in DESCRIBED:
                handle = acl.mdl.get_dataset_tensor_desc(outputs.handle, tensor.index)
                if not handle:
                    raise AclError("acl.mdl.get_dataset_tensor_desc", -1, "returned no description")
                count = int(acl.get_tensor_desc_num_dims(handle))
                dims = [
                    int(value(acl.get_tensor_desc_dim_v2(handle, i), "acl.get_tensor_desc_dim_v2"))
                    for i in range(count)
                ]
            else:
                found = value(
                    acl.mdl.get_cur_output_dims(model.handle, tensor.index),
                    "acl.mdl.get_cur_output_dims",
                )
                dims = [int(d) for d in list(found["dims"])[: int(found["dimCount"])]]
            shapes.append(tuple(dims))
        return shapes

    def execute_async(
        self, model: AclModel, inputs: Dataset, outputs: Dataset, stream: Any
    ) -> None:
        check(
            self._acl.mdl.execute_async(model.model_id, inputs.handle, outputs.handle, stream),
            "acl.mdl.execute_async",
        )
        self._device(model.device_id).clock.start()
        self._inflight[stream] = self._inflight.get(stream, 0) + 1

    # --- observation --------------------------------------------------------------------

    def active_devices(self) -> list[int]:
        with self._lock:
            return sorted(self._devices)

    def device_stats(self, device_id: int) -> DeviceStats:
        # Asked from any thread (metrics), so bind here rather than at the caller.
        self.bind_thread(device_id)
        free, total, ret = self._acl.rt.get_mem_info(ACL_HBM_MEM)
        if int(ret) != 0 or int(total) == 0:
            free, total, ret = self._acl.rt.get_mem_info(ACL_DDR_MEM)
            check(ret, "acl.rt.get_mem_info")
        utilization = -1.0
        query = getattr(self._acl.rt, "get_device_utilization_rate", None)
        if query is not None:
            info, ret = query(device_id)
            if int(ret) == 0 and isinstance(info, dict):
                rates = [
                    float(info.get(k, -1))
                    for k in ("cube_utilization", "vector_utilization", "aicpu_utilization")
                ]
                utilization = max(rates)
        return DeviceStats(
            device_id=device_id,
            memory_total=int(total),
            memory_used=int(total) - int(free),
            busy_ns=self._device(device_id).clock.busy_ns(),
            utilization=utilization,
        )

    def shutdown(self) -> None:
        if self._finalized:
            return
        for device_id in list(self._devices):
            device = self._devices.pop(device_id)
            try:
                check(self._acl.rt.destroy_context(device.context), "acl.rt.destroy_context")
                check(self._acl.rt.reset_device(device_id), "acl.rt.reset_device")
            except AclError as exc:
                log.warning("releasing NPU %d: %s", device_id, exc)
        ret = int(self._acl.finalize())
        self._finalized = True
        if ret not in (0, ACL_ERROR_REPEAT_FINALIZE):
            raise AclError("acl.finalize", ret)


def _tensor(index: int, name: str, dtype: int, dims: Any, size: int) -> TensorDesc:
    numpy_dtype = ACL_DTYPES.get(dtype)
    if numpy_dtype is None and name == DYNAMIC_BATCH_INPUT:
        # Only pyACL writes the gear input (set_dynamic_batch_size); its type is opaque here.
        numpy_dtype = np.dtype(np.uint8)
    if numpy_dtype is None:
        raise AclError(
            "acl.mdl.get_input_data_type",
            -1,
            f"tensor '{name}' has unsupported aclDataType {dtype}",
        )
    shape = tuple(int(d) for d in list(dims.get("dims", []))[: int(dims.get("dimCount", 0))])
    return TensorDesc(index, name, numpy_dtype, shape, size)
