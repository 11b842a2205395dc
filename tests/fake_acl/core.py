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

import ctypes
from types import ModuleType, SimpleNamespace

from .models import ModelCalls
from .state import (
    INVALID_PARAM,
    REPEAT_FINALIZE,
    REPEAT_INITIALIZE,
    RT_CONTEXT_NULL,
    RT_INVALID_DEVICEID,
    RT_MEMORY_ALLOCATION,
    SUCCESS,
    Alloc,
    Stream,
)


class FakeAcl(ModelCalls):
    """The fake's acl and acl.rt calls; acl.mdl comes from ModelCalls, shapes from
    DynamicShapes, the state and the checks every call makes from AclState."""

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
        self.streams[stream] = Stream(device, context)
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
        self.allocs[ptr] = Alloc(device, buffer, size)
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
