"""One executor slot of the GE backend: a model copy bound to (device, stream).

The slot owns its loaded model, its stream and its I/O pool: device buffers for every
model input and output, and the input/output datasets over them, made once at load and
reused by every execution. A dynamic-batch OM wants its buffers sized for its largest gear
(pyACL reports input sizes at the largest gear), so one set of buffers serves every gear:
an execution copies the batch in, sets the gear, runs, and copies the batch's rows out.
Nothing is allocated on the device per request; only the host arrays handed back to the
caller are new.

Models whose other dims vary (shapes.py) execute only what the OM was compiled for: the
exact shapes of an ND or image-size gear, selected before each run, or shapes inside the
ranges of a shape-range OM, described before each run with tensor descs; anything else is
refused (`ShapeRejected`, answered as invalid input) with what the model accepts. Their
buffers are sized for the largest gear, or each range's maximum, and their output shapes
are read back from the device after each run. A GE dynamic-shape OM (-1 dims with no
upper bound) has no maximum to size for: its buffers start small and grow on demand, the
outputs' to what shape inference gives for each request (`OutputSizer`, `pool.regrow`);
requests that fit allocate nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

from ge_serve.backends.base import Array, BackendError, ShapeBucket, ShapeRejected, SlotInfo

from .acl import (
    AclError,
    AclModel,
    AclRuntime,
    Dataset,
    DeviceBuffer,
    PreparedModel,
    TensorDesc,
    TensorPlan,
)
from .pool import PoolStats, match, quietly, range_bound, regrow
from .shape_infer import OutputSizer
from .shapes import (
    DESCRIBED,
    DIMS,
    DYNAMIC,
    HW,
    RANGE,
    describe_gears,
    format_range,
    gear_index,
    gear_values,
    in_range,
    max_shape,
)

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class GeExecutor:
    """Executes batches of one model copy on one (device, stream)."""

    def __init__(
        self,
        slot: SlotInfo,
        runtime: AclRuntime,
        model: AclModel,
        stream: Any,
        inputs: tuple[TensorPlan, ...],
        outputs: tuple[TensorPlan, ...],
        batching: bool,
        output_max: tuple[tuple[str, tuple[int, ...]], ...] = (),
        sizer: OutputSizer | None = None,
    ) -> None:
        self.slot = slot
        self._runtime = runtime
        self._model: AclModel | None = model
        self._stream: Any = stream
        self._device = model.device_id
        # The device was opened for this slot (by `create`); closing the slot releases it.
        self._device_open = True
        self._batching = batching
        desc = model.desc
        self._inputs = match(inputs, desc.data_inputs(), "input")
        self._outputs = match(outputs, desc.outputs, "output")
        self._output_max = dict(output_max)
        self._kind = desc.shape_kind
        self._sizer = sizer
        # static_model with a dynamic batch: the OM holds batch 1, run once per row.
        self.loop = False
        if self._kind == DYNAMIC and sizer is None:
            raise ValueError(
                "the model has dims with no upper bound (GE dynamic shape), and without its "
                "ONNX source there is nothing to size its output buffers from; give its "
                "dims ranges with an upper bound (graph.ge.inputShape low~high) or gears"
            )
        if desc.shape_gears:
            leads = {g[0][0] for g in desc.shape_gears if g and g[0]}
            self.gears: tuple[int, ...] = tuple(sorted(leads)) if batching else ()
        elif desc.shape_kind in DESCRIBED:
            self.gears = ()
        elif desc.gears:
            self.gears = desc.gears
        elif batching:
            lead = desc.data_inputs()[0].dims[0] if desc.data_inputs() else -1
            if lead < 1:
                raise ValueError(
                    "the compiled model has neither batch gears nor a fixed batch dimension"
                )
            self.gears = (lead,)
        else:
            self.gears = ()
        self.stats = PoolStats(slot.name, slot.device_id, slot.stream)
        self._in_buffers: list[DeviceBuffer] = []
        self._out_buffers: list[DeviceBuffer] = []
        self._in_dataset: Dataset | None = None
        self._out_dataset: Dataset | None = None

    @classmethod
    def create(
        cls,
        slot: SlotInfo,
        runtime: AclRuntime,
        prepared: PreparedModel,
        inputs: tuple[TensorPlan, ...],
        outputs: tuple[TensorPlan, ...],
        batching: bool,
        sizer: OutputSizer | None = None,
    ) -> GeExecutor:
        """Open the device, make a stream, load a copy of the model and build the pool."""
        device = slot.device_id
        runtime.open_device(device)
        stream: Any = None
        model: AclModel | None = None
        executor: GeExecutor | None = None
        try:
            runtime.bind_thread(device)
            stream = runtime.create_stream(device)
            model = runtime.load_model(device, prepared)
            executor = cls(
                slot,
                runtime,
                model,
                stream,
                inputs,
                outputs,
                batching,
                prepared.source.output_max,
                sizer,
            )
            executor._build_pool()
            return executor
        except BaseException:
            if executor is not None:
                quietly(executor.close)
            else:
                quietly(runtime.bind_thread, device)
                if model is not None:
                    quietly(runtime.unload_model, model)
                if stream is not None:
                    quietly(runtime.destroy_stream, device, stream)
                quietly(runtime.close_device, device)
            raise

    @property
    def shape_kind(self) -> str:
        return self._kind

    def describe_shapes(self) -> str:
        assert self._model is not None
        desc = self._model.desc
        if self._kind in DESCRIBED:
            names = [t.name for t in desc.data_inputs()]
            return ", ".join(
                f"{n} {format_range(r)}" for n, r in zip(names, desc.ranges, strict=True)
            )
        return describe_gears(desc)

    @property
    def shape_buckets(self) -> tuple[ShapeBucket, ...]:
        """The gears as the scheduler pads to them: the varying inputs' full shapes."""
        assert self._model is not None
        desc = self._model.desc
        data = desc.data_inputs()
        varying = [i for i, t in enumerate(data) if any(d < 0 for d in t.dims)]
        buckets = [
            ShapeBucket({data[i].name: gear[i] for i in varying}) for gear in desc.shape_gears
        ]
        return tuple(
            sorted(buckets, key=lambda b: (sum(math.prod(s) for s in b.shapes.values()), str(b)))
        )

    @property
    def memory_bytes(self) -> int:
        model = self._model.memory_bytes if self._model is not None else 0
        return model + self.stats.bytes

    def _build_pool(self) -> None:
        runtime, device = self._runtime, self._device
        assert self._model is not None
        desc = self._model.desc
        runtime.bind_thread(device)
        for tensor in desc.inputs:
            self._in_buffers.append(self._alloc(self._capacity(tensor, "input")))
        for tensor in desc.outputs:
            self._out_buffers.append(self._alloc(self._capacity(tensor, "output")))
        self._in_dataset = runtime.create_dataset(device, self._in_buffers)
        self._out_dataset = runtime.create_dataset(device, self._out_buffers)

    def _capacity(self, tensor: TensorDesc, what: str) -> int:
        """A tensor's buffer bytes: as the model reports them (at its largest gear), or, for
        a shape-range model, which reports 0, at the ranges' maximum."""
        if tensor.size > 0 or self._kind != RANGE:
            return tensor.size  # GE dynamic shape: 0, grown on demand
        assert self._model is not None
        desc = self._model.desc
        if what == "input":
            ranges = desc.ranges[[t.index for t in desc.data_inputs()].index(tensor.index)]
            return math.prod(max_shape(ranges)) * tensor.dtype.itemsize
        shape = self._output_max.get(tensor.name) or range_bound(tensor, desc, self._batching)
        return math.prod(shape) * tensor.dtype.itemsize

    def _alloc(self, size: int) -> DeviceBuffer:
        buffer = self._runtime.malloc(self._device, max(size, 1))
        self.stats.allocations += 1
        self.stats.buffers += 1
        self.stats.bytes += buffer.size
        return buffer

    # --- execution ----------------------------------------------------------------------

    def _batch_of(self, inputs: Mapping[str, Array]) -> int:
        if not self._batching:
            return 1
        sizes = {int(inputs[p.name].shape[0]) for p, _ in self._inputs if p.name in inputs}
        if len(sizes) != 1:
            raise BackendError(f"inputs disagree on the batch size: {sorted(sizes)}")
        batch = sizes.pop()
        if batch not in self.gears:
            raise BackendError(
                f"batch size {batch} is not a gear of this model (gears {list(self.gears)}); "
                "batches must be padded to a gear"
            )
        return batch

    def execute(self, inputs: Mapping[str, Array]) -> dict[str, Array]:
        return self.launch(inputs)()

    def launch(self, inputs: Mapping[str, Array]) -> Callable[[], dict[str, Array]]:
        """Start one execution on this slot's stream; the call returned waits for it and
        hands back the outputs. Graph blocks (`blocks.GeBlocks`) start every block's
        execution before waiting for any, so they overlap on their streams. A static
        model (`static_model` with a dynamic batch) runs its batch-1 graph once per row."""
        model, in_ds, out_ds = self._model, self._in_dataset, self._out_dataset
        if model is None or in_ds is None or out_ds is None:
            raise BackendError(f"executor {self.slot.name} is closed")
        finish = self._guarded(lambda: self._start(inputs, model, in_ds, out_ds))
        return lambda: self._guarded(finish)

    def _start(
        self, inputs: Mapping[str, Array], model: AclModel, in_ds: Dataset, out_ds: Dataset
    ) -> Callable[[], dict[str, Array]]:
        if self._kind:
            done = self._execute_shaped(inputs, model, in_ds, out_ds)
            return lambda: done
        if not (self.loop and self._batching):
            return self._execute(inputs, model, in_ds, out_ds)
        rows = self._batch_rows(inputs)
        parts = [
            self._execute({n: a[i : i + 1] for n, a in inputs.items()}, model, in_ds, out_ds)()
            for i in range(rows)
        ]
        joined = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        return lambda: joined

    def _batch_rows(self, inputs: Mapping[str, Array]) -> int:
        sizes = {int(inputs[p.name].shape[0]) for p, _ in self._inputs if p.name in inputs}
        if len(sizes) != 1 or min(sizes) < 1:
            raise BackendError(f"inputs disagree on the batch size: {sorted(sizes)}")
        return sizes.pop()

    def _guarded(self, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except ShapeRejected:
            raise
        except BackendError:
            self.stats.failures += 1
            raise
        except (AclError, ValueError) as exc:
            self.stats.failures += 1
            raise BackendError(f"{self.slot.name}: {exc}") from exc

    def _execute(
        self, inputs: Mapping[str, Array], model: AclModel, in_ds: Dataset, out_ds: Dataset
    ) -> Callable[[], dict[str, Array]]:
        runtime, device = self._runtime, self._device
        runtime.bind_thread(device)
        batch = self._batch_of(inputs)
        moved_in = 0
        for plan, tensor in self._inputs:
            array = inputs.get(plan.name)
            if array is None:
                raise BackendError(f"input '{plan.name}' is missing")
            expected = self._shape(tensor, batch)
            if tuple(array.shape) != expected:
                raise BackendError(
                    f"input '{plan.name}' has shape {list(array.shape)}, the model takes "
                    f"{list(expected)}"
                )
            data = np.ascontiguousarray(array, dtype=tensor.dtype)
            runtime.memcpy_h2d(self._in_buffers[tensor.index], data)
            moved_in += data.nbytes
        if model.desc.gears:
            runtime.set_dynamic_batch(model, in_ds, batch)
        runtime.execute_async(model, in_ds, out_ds, self._stream)

        def finish() -> dict[str, Array]:
            runtime.bind_thread(device)
            runtime.synchronize_stream(device, self._stream)
            results: dict[str, Array] = {}
            moved_out = 0
            for plan, tensor in self._outputs:
                host = np.empty(self._shape(tensor, batch), dtype=tensor.dtype)
                runtime.memcpy_d2h(host, self._out_buffers[tensor.index])
                moved_out += host.nbytes
                results[plan.name] = host if host.dtype == plan.dtype else host.astype(plan.dtype)
            stats = self.stats
            stats.executions += 1
            stats.by_gear[batch] = stats.by_gear.get(batch, 0) + 1
            stats.bytes_in += moved_in
            stats.bytes_out += moved_out
            return results

        return finish

    def _execute_shaped(
        self, inputs: Mapping[str, Array], model: AclModel, in_ds: Dataset, out_ds: Dataset
    ) -> dict[str, Array]:
        """One execution of an ND-gear, image-size or shape-range model."""
        runtime, device, desc = self._runtime, self._device, model.desc
        runtime.bind_thread(device)
        ordered = sorted(self._inputs, key=lambda pair: pair[1].index)
        arrays = []
        for plan, _ in ordered:
            array = inputs.get(plan.name)
            if array is None:
                raise BackendError(f"input '{plan.name}' is missing")
            arrays.append(array)
        shapes = [tuple(int(d) for d in a.shape) for a in arrays]
        index = -1
        if self._kind in DESCRIBED:
            for (plan, _), shape, ranges in zip(ordered, shapes, desc.ranges, strict=True):
                if not in_range(shape, ranges):
                    raise ShapeRejected(
                        f"input '{plan.name}' has shape {list(shape)}, outside the model's "
                        f"shape range {format_range(ranges)}"
                    )
        else:
            found = gear_index(desc, shapes)
            if found is None:
                got = ", ".join(
                    f"{p.name} {list(s)}" for (p, _), s in zip(ordered, shapes, strict=True)
                )
                raise ShapeRejected(
                    f"input shapes {got} are not a gear of this model; its gears are: "
                    f"{describe_gears(desc)}"
                )
            index = found
        if self._kind == DYNAMIC:
            self._grow(ordered, shapes)
            grown_in, grown_out = self._in_dataset, self._out_dataset
            assert grown_in is not None and grown_out is not None
            in_ds, out_ds = grown_in, grown_out
        moved_in = 0
        for (_, tensor), array in zip(ordered, arrays, strict=True):
            data = np.ascontiguousarray(array, dtype=tensor.dtype)
            runtime.memcpy_h2d(self._in_buffers[tensor.index], data)
            moved_in += data.nbytes
        if self._kind in DESCRIBED:
            runtime.set_input_shapes(model, in_ds, shapes)
        elif self._kind == DIMS:
            runtime.set_dynamic_dims(model, in_ds, gear_values(desc, index))
        elif self._kind == HW:
            height, width = gear_values(desc, index)
            runtime.set_dynamic_hw(model, in_ds, height, width)
        runtime.execute_async(model, in_ds, out_ds, self._stream)
        runtime.synchronize_stream(device, self._stream)
        produced = runtime.output_shapes(model, out_ds)
        results: dict[str, Array] = {}
        moved_out = 0
        for plan, tensor in self._outputs:
            shape = tuple(produced[tensor.index])
            host = np.empty(shape, dtype=tensor.dtype)
            if host.nbytes > self._out_buffers[tensor.index].size:
                raise BackendError(
                    f"output '{tensor.name}' of shape {list(shape)} exceeds its "
                    f"{self._out_buffers[tensor.index].size}-byte device buffer"
                )
            runtime.memcpy_d2h(host, self._out_buffers[tensor.index])
            moved_out += host.nbytes
            results[plan.name] = host if host.dtype == plan.dtype else host.astype(plan.dtype)
        stats = self.stats
        stats.executions += 1
        key = "x".join(str(d) for d in shapes[0]) if shapes else "-"
        stats.by_gear[key] = stats.by_gear.get(key, 0) + 1
        stats.bytes_in += moved_in
        stats.bytes_out += moved_out
        return results

    def _grow(
        self, ordered: list[tuple[TensorPlan, TensorDesc]], shapes: list[tuple[int, ...]]
    ) -> None:
        """Grow the buffers a GE dynamic-shape execution needs past their size: inputs to
        this request's bytes, outputs to what shape inference says they will hold. The
        datasets are rebuilt over the new buffers; requests that fit change nothing."""
        assert self._model is not None and self._sizer is not None
        try:
            produced = self._sizer(
                {tensor.name: shape for (_, tensor), shape in zip(ordered, shapes, strict=True)}
            )
        except ValueError as exc:
            raise BackendError(f"sizing the outputs: {exc}") from exc
        need_in = {
            tensor.index: math.prod(shape) * tensor.dtype.itemsize
            for (_, tensor), shape in zip(ordered, shapes, strict=True)
        }
        need_out = {}
        for tensor in self._model.desc.outputs:
            shape = produced.get(tensor.name)
            if shape is None:
                raise BackendError(f"shape inference gives no shape for output '{tensor.name}'")
            need_out[tensor.index] = math.prod(shape) * tensor.dtype.itemsize
        runtime, device = self._runtime, self._device
        self._in_dataset = regrow(
            runtime, device, self._in_buffers, self._in_dataset, need_in, self.stats
        )
        self._out_dataset = regrow(
            runtime, device, self._out_buffers, self._out_dataset, need_out, self.stats
        )

    def _shape(self, tensor: TensorDesc, batch: int) -> tuple[int, ...]:
        dims = tensor.dims
        shape = (batch, *dims[1:]) if self._batching else dims
        if any(d < 0 for d in shape):
            raise BackendError(f"tensor '{tensor.name}' has a dynamic shape {list(dims)}")
        if math.prod(shape) * tensor.dtype.itemsize > tensor.size:
            raise BackendError(
                f"tensor '{tensor.name}' of shape {list(shape)} exceeds its "
                f"{tensor.size}-byte device buffer"
            )
        return tuple(shape)

    def pool_stats(self) -> dict[str, Any]:
        return self.stats.as_dict()

    # --- teardown -----------------------------------------------------------------------

    def close(self) -> None:
        """Free the pool, unload the model, destroy the stream; every step is attempted."""
        runtime, device = self._runtime, self._device
        errors: list[BaseException] = []

        def attempt(call: Any, *args: Any) -> None:
            try:
                call(*args)
            except Exception as exc:
                errors.append(exc)

        if not self._device_open:
            return
        attempt(runtime.bind_thread, device)
        for dataset in (self._in_dataset, self._out_dataset):
            if dataset is not None:
                attempt(runtime.destroy_dataset, device, dataset)
        self._in_dataset = self._out_dataset = None
        for buffer in self._in_buffers + self._out_buffers:
            attempt(runtime.free, buffer)
        self._in_buffers, self._out_buffers = [], []
        self.stats.buffers = 0
        self.stats.bytes = 0
        if self._model is not None:
            attempt(runtime.unload_model, self._model)
            self._model = None
        if self._stream is not None:
            attempt(runtime.destroy_stream, device, self._stream)
            self._stream = None
        self._device_open = False
        attempt(runtime.close_device, device)
        if errors:
            raise BackendError(f"closing {self.slot.name}: {errors[0]}") from errors[0]
