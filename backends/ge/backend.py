"""The GE backend (`ge`, alias `npu_ge`): models on NPU streams through the ACL shim.

A model version becomes executor slots on its devices, each of `instance_exec_blocks`
graphs (a model copy on its own stream; `blocks.GeBlocks` splits a batch across them),
see `options` for how a config decides the slots and gears. Loading is blocking and runs
off the event loop; a model is returned, and so becomes READY, only after its
`model_warmup` samples ran on every slot and the conversion accuracy check (`accuracy`)
compared the compiled model with onnxruntime.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ge_serve.backends.base import Executor, LoadedModel, ModelSpec, SlotInfo
from ge_serve.backends.onnx_check import check_config_fits
from ge_serve.backends.onnx_io import (
    DEFAULT_MAX_BATCH_SIZE,
    TensorInfo,
    autocomplete_from_onnx,
    read_onnx_tensors,
)
from ge_serve.backends.warmup import run_warmup
from ge_serve.protos import model_config_pb2

from . import accuracy
from .acl import AclRuntime, ModelSource
from .blocks import GeBlocks
from .executor import GeExecutor
from .options import (
    GePlan,
    check_gears,
    intra_threads,
    make_plan,
    output_max_shapes,
    parameters,
    with_npu_config,
)
from .shape_infer import OutputSizer, range_output_max
from .shapes import DYNAMIC, MODE_NAMES, describe_mode

log = logging.getLogger(__name__)

NAME = "ge"


def _refuse_initializer_inputs(
    name: str, config: model_config_pb2.ModelConfig, overridable: list[TensorInfo]
) -> None:
    """Refuse a config input that is one of the model's initializers (Triton's onnxruntime
    backend takes one as an optional input that a request may override): atc compiles
    initializers into the graph as constants, so no request could change it."""
    stored = {info.name for info in overridable}
    for entry in config.input:
        if entry.name in stored:
            raise ValueError(
                f"unable to load model '{name}', input '{entry.name}' is an initializer "
                "of the model, which the GE backend compiles into the graph as a constant "
                "and cannot take from a request; remove it from the config's inputs (the "
                "stored value is used), or serve the model with the onnxruntime backend"
            )


def backend_config_for(entries: Mapping[str, str] | tuple[tuple[str, str], ...]) -> dict[str, str]:
    """`--backend-config=ge,<k>=<v>` and `--backend-config=npu_ge,<k>=<v>` as {k: v}."""
    pairs = entries.items() if isinstance(entries, Mapping) else entries
    found: dict[str, str] = {}
    for key, text in pairs:
        for prefix in ("npu_ge.", "ge."):
            if key.startswith(prefix):
                found[key[len(prefix) :]] = text
                break
    return found


@dataclass(frozen=True, slots=True)
class GeDeviceMetrics:
    """One device's figures for the metrics endpoint."""

    device: str
    # Busy fraction 0.0-1.0 since the previous sample; negative when unknown.
    utilization: float
    memory_used_bytes: int
    memory_total_bytes: int
    # Bytes held by the slots' I/O pools on the device (part of memory_used_bytes).
    pool_bytes: int
    # The cost model's profile when execution time is modelled (--sim-cost), else "".
    simulated_timing: str = ""
    # Graph executions the loaded models' slots ran on the device so far.
    executions: int = 0


class GeBackend:
    name = NAME

    def __init__(
        self,
        runtime: AclRuntime,
        backend_config: Mapping[str, str] | None = None,
        cores: int | None = None,
        environ: Mapping[str, str] | None = None,
        default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
    ) -> None:
        self.runtime = runtime
        # Auto-complete's max_batch_size for ONNX models that can batch (Triton's
        # --backend-config=<backend>,default-max-batch-size).
        self.default_max_batch_size = default_max_batch_size
        # GE_NPU_CONFIG, as npu_ge reads it: JSON global GE options that take the place of
        # --backend-config's ge.* options. A bad one fails every GE load with its reason.
        self.npu_config_error = ""
        try:
            self.backend_config = with_npu_config(
                dict(backend_config or {}), (os.environ if environ is None else environ)
            )
        except ValueError as exc:
            self.backend_config = dict(backend_config or {})
            self.npu_config_error = str(exc)
        self.cores = cores or os.cpu_count() or 1
        self._lock = threading.Lock()
        self._executors: weakref.WeakSet[GeExecutor] = weakref.WeakSet()

    def default_model_filename(self) -> str:
        return "model.onnx"

    def autocomplete(self, config: model_config_pb2.ModelConfig, model_path: Path) -> None:
        # An OM or a TensorFlow graph cannot be read here; such configs list their tensors.
        if model_path.suffix.lower() == ".onnx":
            autocomplete_from_onnx(config, model_path, self.default_max_batch_size)
        elif config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
            # Its config says it batches, and nothing can say otherwise: dynamic batching,
            # as for an ONNX file that can batch.
            config.dynamic_batching.SetInParent()

    def load(self, spec: ModelSpec) -> LoadedModel:
        if not spec.model_path.is_file():
            raise FileNotFoundError(f"model file '{spec.model_path}' does not exist")
        config = spec.config
        if self.npu_config_error:
            raise ValueError(self.npu_config_error)
        if spec.model_path.suffix.lower() == ".onnx":
            # Neither ATC nor the simulated runtime compares the config with the graph: a
            # contradiction would load READY and fail every request. An OM or a TF graph
            # is not read here (the executor pairs the config's tensors with an OM's).
            inputs, outputs, overridable = read_onnx_tensors(spec.model_path, any_type=True)
            _refuse_initializer_inputs(spec.name, config, overridable)
            check_config_fits(spec.name, config, inputs, outputs)
        plan = make_plan(config, self.backend_config, spec.model_dir)
        self._check_devices(plan)
        blocks = plan.exec_blocks if plan.batching else 1
        if plan.exec_blocks > 1 and not plan.batching:
            log.warning(
                "model '%s': instance_exec_blocks %d splits a batch across graphs, and the "
                "model does not batch (max_batch_size 0): one graph per slot",
                spec.name,
                plan.exec_blocks,
            )
        if blocks > 1 and plan.shapes.gears:
            raise ValueError(
                f"instance_exec_blocks {blocks} splits each batch across {blocks} graphs, and "
                "ND or image-size gears fix the batch inside each gear; use batch gears, "
                "ranges or GE dynamic shape, or leave instance_exec_blocks at 1"
            )
        params = parameters(config, self.backend_config)
        source = ModelSource(
            path=spec.model_path,
            batching=plan.batching,
            gears=plan.gears,
            inputs=plan.inputs,
            outputs=plan.outputs,
            input_shape=plan.input_shape,
            atc_options=plan.atc_options,
            intra_threads=intra_threads(params, plan.slot_count, self.cores),
            shapes=plan.shapes,
            output_max=range_output_max(spec.model_path, plan.shapes) or output_max_shapes(params),
        )
        prepared = self.runtime.prepare_model(source)
        sizer = (
            OutputSizer(spec.model_path)
            if plan.shapes.kind == DYNAMIC and spec.model_path.suffix.lower() == ".onnx"
            else None
        )
        if plan.unused_options:
            log.warning(
                "model '%s': GE runtime options with no atc flag have no effect on an OM run "
                "through pyACL (they do not change results): %s",
                spec.name,
                ", ".join(plan.unused_options),
            )
        graphs: list[GeExecutor] = []
        slots: list[Executor] = []
        try:
            for slot in _slots(spec, plan, self._serial()):
                group = []
                for block in range(blocks):
                    info = slot if blocks == 1 else _graph_slot(slot, block, blocks)
                    graph = GeExecutor.create(
                        info,
                        self.runtime,
                        prepared,
                        plan.inputs,
                        plan.outputs,
                        plan.batching,
                        sizer,
                    )
                    graph.loop = plan.static_loop
                    graphs.append(graph)
                    group.append(graph)
                slots.append(group[0] if blocks == 1 else GeBlocks(slot, group))
            first = graphs[0]
            gears = first.gears
            buckets = first.shape_buckets
            if plan.batching and gears and not plan.static_loop:
                check_gears(gears, int(config.max_batch_size), "the compiled model")
            if plan.static_loop or blocks > 1:
                gears = ()  # any batch: looped over rows or split across graphs
            warm = run_warmup(spec, slots, gears)
            probe = accuracy.Probe(
                plan.batching,
                gears,
                plan.inputs,
                plan.shapes,
                dict(buckets[0].shapes) if buckets else {},
            )
            report = accuracy.check(spec, slots[0], probe, params, warm)
        except BaseException:
            for graph in graphs:
                try:
                    graph.close()
                except Exception:
                    log.exception("releasing slot %s failed", graph.slot.name)
            raise
        log.info(
            "model '%s' version %d on %s: %d slot(s)%s on NPU %s, %s, %s; mode: %s",
            spec.name,
            spec.version,
            self.runtime.kind,
            len(slots),
            f" of {blocks} graphs each (instance_exec_blocks)" if blocks > 1 else "",
            ",".join(str(d) for d in plan.device_ids),
            _shapes_note(first, gears),
            prepared.note if self._timing() == "measured" else f"{prepared.note}, {self._timing()}",
            describe_mode(plan.shapes, plan.static_loop)
            if spec.model_path.suffix.lower() != ".om"
            else f"{MODE_NAMES.get(first.shape_kind, 'batch gears or fixed shapes')}, as the "
            "prebuilt OM was compiled",
        )
        with self._lock:
            self._executors.update(graphs)
        return LoadedModel(
            executors=list(slots),
            gears=gears if plan.batching else (),
            shape_buckets=buckets,
            memory_bytes=sum(graph.memory_bytes for graph in graphs),
            extra={
                "runtime": self.runtime.kind,
                "timing": self._timing(),
                "devices": plan.device_ids,
                "pool_stats": lambda: [graph.pool_stats() for graph in graphs],
                accuracy.CONFIG_KEY: report or [],
            },
        )

    def _serial(self) -> bool:
        """Whether a device runs one model execution at a time. An NPU's AI cores run one
        graph after another, whichever stream submits it; the simulated NPU does so only
        with modelled timing (--sim-cost: one timeline per device), and otherwise runs
        its slots' onnxruntime sessions side by side on the host."""
        return self.runtime.kind != "sim" or getattr(self.runtime, "cost", None) is not None

    def _timing(self) -> str:
        cost = getattr(self.runtime, "cost", None)
        return str(cost.describe()) if cost is not None else "measured"

    def _check_devices(self, plan: GePlan) -> None:
        count = self.runtime.device_count()
        for device in plan.device_ids:
            if device >= count:
                hint = " (--sim-devices)" if self.runtime.kind == "sim" else ""
                raise ValueError(
                    f"NPU {device} is not available: the {self.runtime.kind} runtime has "
                    f"{count} device(s), ids 0-{count - 1}{hint}"
                )

    def device_metrics(self) -> list[GeDeviceMetrics]:
        """Per-device figures (metrics sampler thread): memory, busy share, I/O pool bytes."""
        with self._lock:
            executors = list(self._executors)
        pools: dict[int, int] = {}
        runs: dict[int, int] = {}
        for executor in executors:
            device = executor.slot.device_id
            pools[device] = pools.get(device, 0) + executor.stats.bytes
            runs[device] = runs.get(device, 0) + executor.stats.executions
        cost = getattr(self.runtime, "cost", None)
        profile = str(cost.name) if cost is not None else ""
        found = []
        for device in self.runtime.active_devices():
            stats = self.runtime.device_stats(device)
            found.append(
                GeDeviceMetrics(
                    device=f"{self.runtime.kind}{device}",
                    utilization=stats.utilization / 100.0 if stats.utilization >= 0 else -1.0,
                    memory_used_bytes=stats.memory_used,
                    memory_total_bytes=stats.memory_total,
                    pool_bytes=pools.get(device, 0),
                    simulated_timing=profile,
                    executions=runs.get(device, 0),
                )
            )
        return found

    def close(self) -> None:
        """Release the device runtime at server exit."""
        self.runtime.shutdown()


def _shapes_note(executor: GeExecutor, gears: tuple[int, ...]) -> str:
    kind = executor.shape_kind
    if kind:
        return f"{kind} shapes ({executor.describe_shapes()})"
    return f"gears {list(gears)}" if gears else "no batch gears"


def _graph_slot(slot: SlotInfo, block: int, blocks: int) -> SlotInfo:
    """Where one graph of a block slot runs: its own stream."""
    return SlotInfo(
        name=f"{slot.name}_g{block}",
        device=slot.device,
        device_id=slot.device_id,
        stream=slot.stream * blocks + block,
        serial=slot.serial,
    )


def _slots(spec: ModelSpec, plan: GePlan, serial: bool) -> list[SlotInfo]:
    """Slots interleaved across devices: stream 0 of each device, then stream 1, ...
    (`serial`: each device runs one execution at a time, see SlotInfo)."""
    slots: list[SlotInfo] = []
    most = max(streams for _, streams in plan.slots)
    for stream in range(most):
        for device, streams in plan.slots:
            if stream < streams:
                slots.append(
                    SlotInfo(
                        name=f"{spec.name}_{spec.version}_npu{device}_{stream}",
                        device=f"npu{device}",
                        device_id=device,
                        stream=stream,
                        serial=serial,
                    )
                )
    return slots


def loaded_pool_stats(loaded: LoadedModel) -> list[dict[str, Any]]:
    """Per-slot I/O pool figures of a GE model (empty for other backends)."""
    stats = loaded.extra.get("pool_stats")
    return list(stats()) if callable(stats) else []
