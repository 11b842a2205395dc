"""How a model config maps onto GE slots, gears and `atc` options.

Follows CANN's npu_ge Triton backend so its configs load unchanged:
- `parameters` `device_ids` ("4,5"), `device_exec_blocks` (streams per device),
  `instance_exec_blocks` (streams per instance), `static_model` ("1");
- any `ge.*`, `session.ge.*`, `graph.ge.*` (or `global.ge.*`) key, e.g.
  `graph.ge.inputShape`, `graph.ge.dynamicDims` ("1;2;4;8") and `graph.ge.dynamicNodeType`;
- the same keys from `--backend-config=npu_ge,<key>=<value>` (the model's own win).

Options that name a file (`FILE_OPTIONS`, `ATC_FILE_FLAGS`, e.g. `ge.fusionSwitchFile`)
are resolved inside the model folder when they come from the model's own parameters, and
atc gets the resolved path; a value that leaves the folder fails the load. Values from
`--backend-config` are the operator's and pass through as given.

Slots: the devices are `device_ids`, else the `gpus` of the instance groups, else NPU 0.
Each device gets `device_exec_blocks` streams when set, else the instance count
(`count` of the groups that list it, or of every group that lists no gpus) times
`instance_exec_blocks` (default 1). Each stream is one executor slot with its own copy of
the model, as one loaded OM must not run on two streams at once.

Gears: batching models always execute at a gear, as a compiled OM does: the gears are
`dynamicDims` when given, the single batch `max_batch_size` for `static_model`, and
otherwise 1, 2, 4, ... up to `max_batch_size`. Dims other than the batch that vary
(ND gears, image-size gears, shape ranges) are planned by `shapes.plan_shapes`; their
batch gears are the batch dims of the shape gears.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ge_serve.protos import model_config_pb2

from ..onnx_io import CONFIG_NUMPY
from ..paths import resolve_inside
from .acl import TensorPlan
from .shapes import BATCH, DESCRIBED, STATIC, ShapePlan, plan_shapes

log = logging.getLogger(__name__)

# GE option (ge_api_types.h) -> the atc flag that sets the same thing when compiling an OM.
ATC_FLAGS = {
    "ge.exec.precision_mode": "precision_mode",
    "ge.exec.precision_mode_v2": "precision_mode_v2",
    "ge.exec.op_precision_mode": "op_precision_mode",
    "ge.exec.modify_mixlist": "modify_mixlist",
    "ge.opSelectImplmode": "op_select_implmode",
    "ge.optypelistForImplmode": "optypelist_for_implmode",
    "ge.outputDatatype": "output_type",
    "ge.bufferOptimize": "buffer_optimize",
    "ge.enableSmallChannel": "enable_small_channel",
    "ge.enableCompressWeight": "enable_compress_weight",
    "ge.compressWeightConf": "compress_weight_conf",
    "ge.fusionSwitchFile": "fusion_switch_file",
    "ge.INPUT_NODES_SET_FP16": "input_fp16_nodes",
    "ge.insertOpFile": "insert_op_conf",
    "ge.opDebugLevel": "op_debug_level",
    "ge.autoTuneMode": "auto_tune_mode",
    "ge.virtual_type": "virtual_type",
    "ge.deterministic": "deterministic",
    "ge.customizeDtypes": "customize_dtypes",
}
# GE options (ge_api_types.h, unscoped) whose value is a file or folder path.
FILE_OPTIONS = frozenset(
    {
        "ge.exec.op_precision_mode",
        "ge.exec.modify_mixlist",
        "ge.exec.opDebugConfig",
        "ge.exec.dumpPath",
        "ge.compressWeightConf",
        "ge.fusionSwitchFile",
        "ge.insertOpFile",
        "ge.customizeDtypes",
        "ge.keepDtype",
        "ge.debugDir",
        "ge.tuningPath",
        "ge.op_compiler_cache_dir",
        "ge.op_bank_path",
        "ge.mdl_bank_path",
        "ge.graphParallelOptionPath",
    }
)
# atc flags (CANN's atc reference) whose value is a file or folder path.
ATC_FILE_FLAGS = frozenset(
    {
        "model",
        "weight",
        "om",
        "output",
        "json",
        "singleop",
        "check_report",
        "insert_op_conf",
        "op_name_map",
        "fusion_switch_file",
        "compress_weight_conf",
        "keep_dtype",
        "customize_dtypes",
        "op_precision_mode",
        "modify_mixlist",
        "op_debug_config",
        "op_bank_path",
        "mdl_bank_path",
        "debug_dir",
        "op_compiler_cache_dir",
        "cluster_config",
        "graph_parallel_option_path",
    }
)
# atc flags that ge-serve sets itself (what to compile, into which file, in which mode).
_OWN_ATC_FLAGS = frozenset({"model", "framework", "output", "mode"})
_ATC_FLAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
# Options ge-serve turns into atc's shape and gear flags itself.
_SHAPE_OPTIONS = ("ge.inputShape", "ge.dynamicDims", "ge.dynamicNodeType", "ge.dynamicImageSize")
# atc flags given as `atc.<flag>` that say the same as a shape option (the option wins).
_SHAPE_FLAGS = {
    "input_shape": "ge.inputShape",
    "dynamic_dims": "ge.dynamicDims",
    "dynamic_image_size": "ge.dynamicImageSize",
}
_SCOPES = ("graph.", "session.", "global.")


def numpy_dtype(config_type: int) -> np.dtype[Any]:
    """The numpy type of a config data type, for the types an NPU tensor can have."""
    dtype = CONFIG_NUMPY.get(config_type)
    if dtype is None or config_type == model_config_pb2.TYPE_STRING:
        name = model_config_pb2.DataType.Name(config_type)  # type: ignore[arg-type]
        if config_type == model_config_pb2.TYPE_STRING:
            raise ValueError(
                "string (BYTES) tensors cannot live on an NPU; serve this model with "
                'backend: "onnxruntime"'
            )
        raise ValueError(f"data type {name} is not supported by the GE backend")
    return dtype


@dataclass(frozen=True, slots=True)
class GePlan:
    """Everything the GE backend decided about one model, from its config."""

    # (device id, streams on it), in device order.
    slots: tuple[tuple[int, int], ...]
    batching: bool
    gears: tuple[int, ...]
    static_model: bool
    inputs: tuple[TensorPlan, ...]
    outputs: tuple[TensorPlan, ...]
    input_shape: str
    atc_options: tuple[tuple[str, str], ...]
    # How dims other than the batch vary (ND gears, image-size gears, ranges).
    shapes: ShapePlan = field(default_factory=lambda: ShapePlan(STATIC))
    # Every GE option given, keyed without its scope prefix (for the log).
    ge_options: dict[str, str] = field(default_factory=dict)
    # GE options that have no atc flag and so do not apply to an OM.
    unused_options: tuple[str, ...] = ()

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(device for device, _ in self.slots)

    @property
    def slot_count(self) -> int:
        return sum(streams for _, streams in self.slots)


def parameters(
    config: model_config_pb2.ModelConfig, backend_config: Mapping[str, str]
) -> dict[str, str]:
    """The model's parameters over `--backend-config` (the model's own win)."""
    merged = dict(backend_config)
    for key, param in config.parameters.items():
        merged[key] = str(param.string_value)
    return merged


def _int_param(params: Mapping[str, str], key: str) -> int | None:
    text = params.get(key)
    if text is None or text.strip() == "":
        return None
    try:
        number = int(text.strip())
    except ValueError:
        raise ValueError(f"parameter {key} must be a whole number, got '{text}'") from None
    if number < 1:
        raise ValueError(f"parameter {key} must be at least 1, got {number}")
    return number


def _device_ids(params: Mapping[str, str]) -> tuple[int, ...] | None:
    text = params.get("device_ids")
    if text is None or not text.strip():
        return None
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise ValueError(
                f'parameter device_ids must list NPU ids separated by commas (e.g. "4,5"), '
                f"got '{text}'"
            )
        if int(part) not in ids:
            ids.append(int(part))
    if not ids:
        raise ValueError(f"parameter device_ids names no NPU: '{text}'")
    return tuple(ids)


def _slots(
    config: model_config_pb2.ModelConfig, params: Mapping[str, str]
) -> tuple[tuple[int, int], ...]:
    per_instance = _int_param(params, "instance_exec_blocks") or 1
    per_device = _int_param(params, "device_exec_blocks")
    named = _device_ids(params)
    groups = list(config.instance_group)
    if named is not None:
        devices = named
    else:
        listed: list[int] = []
        for group in groups:
            for gpu in group.gpus:
                if gpu < 0:
                    raise ValueError(f"instance_group gpus must be NPU ids >= 0, got {gpu}")
                if gpu not in listed:
                    listed.append(int(gpu))
        devices = tuple(listed) or (0,)
    if per_device is not None:
        return tuple((device, per_device) for device in devices)
    counts = dict.fromkeys(devices, 0)
    for group in groups or [model_config_pb2.ModelInstanceGroup(count=1)]:
        count = max(group.count, 1)
        targets = devices if named is not None or not group.gpus else tuple(group.gpus)
        for device in targets:
            counts[device] += count
    return tuple((device, max(counts[device], 1) * per_instance) for device in devices)


def _unscoped(key: str) -> str:
    for scope in _SCOPES:
        if key.startswith(scope):
            return key[len(scope) :]
    return key


def ge_options(params: Mapping[str, str]) -> dict[str, str]:
    """`ge.*` options from parameters, with any graph./session./global. scope removed."""
    options: dict[str, str] = {}
    for key, text in params.items():
        bare = _unscoped(key)
        if bare.startswith("ge."):
            options[bare] = text
    return options


def atc_flag(key: str) -> str:
    """The atc flag an `atc.<flag>` parameter sets, spelled as atc documents it (atc also
    takes leading dashes and '-' for '_'). A name that is no flag, such as one holding '=',
    which would smuggle a second flag into the argument, is a ValueError."""
    name = key[len("atc.") :]
    flag = name.lstrip("-").replace("-", "_")
    if not _ATC_FLAG_NAME.fullmatch(flag):
        raise ValueError(f"parameter {key}: {name!r} is not an atc flag name")
    return flag


def file_parameters(params: Mapping[str, str]) -> list[tuple[str, str]]:
    """(key, value) of the parameters whose value names a file or folder: GE options in
    FILE_OPTIONS (any scope) and `atc.<flag>` for flags in ATC_FILE_FLAGS. Empty values
    name nothing and are left out."""
    found: list[tuple[str, str]] = []
    for key, text in params.items():
        if not text:
            continue
        if key.startswith("atc."):
            if atc_flag(key) in ATC_FILE_FLAGS:
                found.append((key, text))
        elif _unscoped(key) in FILE_OPTIONS:
            found.append((key, text))
    return found


def parameter_path(model_dir: Path, key: str, value: str) -> Path:
    """A file parameter's path inside the model folder; OutsideFolder when it leaves it."""
    return resolve_inside(model_dir, value, f"parameter {key} {value!r}")


def parse_gears(text: str) -> tuple[int, ...]:
    """`dynamicDims` batch gears: "1;2;4;8" (commas between gears are accepted too)."""
    separator = ";" if ";" in text else ","
    gears: list[int] = []
    for part in text.split(separator):
        part = part.strip()
        if not part:
            continue
        if "," in part:
            raise ValueError(
                f"graph.ge.dynamicDims '{text}' has several values per gear (ND dynamic dims); "
                'ge-serve serves batch gears, one value per gear such as "1;2;4;8"'
            )
        if not part.isdigit() or int(part) < 1:
            raise ValueError(
                f"graph.ge.dynamicDims '{text}': '{part}' is not a batch size of 1 or more"
            )
        gears.append(int(part))
    if not gears:
        raise ValueError(f"graph.ge.dynamicDims '{text}' names no gear")
    return tuple(sorted(set(gears)))


def check_gears(gears: tuple[int, ...], max_batch_size: int, source: str) -> None:
    """A batch of max_batch_size must fit a gear: the scheduler pads up, never splits."""
    if gears and gears[-1] < max_batch_size:
        raise ValueError(
            f"max_batch_size {max_batch_size} exceeds the largest batch gear {gears[-1]} of "
            f"{source} ({';'.join(str(g) for g in gears)}): lower max_batch_size or add a gear"
        )


def default_gears(max_batch_size: int) -> tuple[int, ...]:
    gears = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i < max_batch_size]
    return (*gears, max_batch_size)


def _tensors(entries: Any) -> tuple[TensorPlan, ...]:
    plans = []
    for entry in entries:
        dims = tuple(entry.reshape.shape) if entry.HasField("reshape") else tuple(entry.dims)
        try:
            dtype = numpy_dtype(entry.data_type)
        except ValueError as exc:
            raise ValueError(f"tensor '{entry.name}': {exc}") from None
        plans.append(TensorPlan(entry.name, dtype, tuple(int(d) for d in dims)))
    return tuple(plans)


def _input_shape(inputs: tuple[TensorPlan, ...], batching: bool, gears: tuple[int, ...]) -> str:
    parts = []
    for plan in inputs:
        if any(d < 0 for d in plan.dims):
            raise ValueError(
                f"input '{plan.name}' has dims {list(plan.dims)}; the GE backend compiles fixed "
                "shapes apart from the batch dimension: give fixed dims in config.pbtxt or "
                "set graph.ge.inputShape"
            )
        lead = [] if not batching else [-1 if len(gears) > 1 else gears[0]]
        dims = lead + list(plan.dims)
        parts.append(f"{plan.name}:" + ",".join(str(d) for d in dims))
    return ";".join(parts)


def make_plan(
    config: model_config_pb2.ModelConfig,
    backend_config: Mapping[str, str] | None = None,
    model_dir: Path | None = None,
) -> GePlan:
    """The plan for a config. With `model_dir`, the model's own file parameters become
    their resolved paths inside it (OutsideFolder, a ValueError, when one leaves it)."""
    own = parameters(config, {})
    for key in own:
        if key.startswith("atc.") and atc_flag(key) in _OWN_ATC_FLAGS:
            raise ValueError(f"parameter {key}: ge-serve sets atc's --{atc_flag(key)} itself")
    if model_dir is not None:
        for key, text in file_parameters(own):
            own[key] = str(parameter_path(model_dir, key, text))
    params = {**(backend_config or {}), **own}
    options = ge_options(params)
    for key in [k for k in params if k.startswith("atc.")]:
        option = _SHAPE_FLAGS.get(atc_flag(key))
        if option is not None:
            options.setdefault(option, params.pop(key))
    batching = config.max_batch_size > 0
    static = params.get("static_model", "").strip() == "1"
    dims_text = options.get("ge.dynamicDims", "").strip()
    inputs = _tensors(config.input)
    outputs = _tensors(config.output)
    shapes = plan_shapes(options, inputs, batching, int(config.max_batch_size))
    if shapes.kind not in (BATCH, STATIC):
        dims_text = ""
    if shapes.kind in DESCRIBED:
        gears: tuple[int, ...] = ()
        high = shapes.inputs[0].ranges[0][1] if batching else 0
        if batching and 0 <= high < config.max_batch_size:
            raise ValueError(
                f"max_batch_size {config.max_batch_size} exceeds the batch range of "
                f"graph.ge.inputShape '{shapes.input_shape}' (at most {high})"
            )
    elif shapes.gears:
        gears = tuple(sorted({g[0][0] for g in shapes.gears})) if batching else ()
        check_gears(gears, int(config.max_batch_size), "the shape gears")
    elif not batching:
        gears = ()
        if dims_text:
            log.warning(
                "model '%s': graph.ge.dynamicDims is ignored because max_batch_size is 0",
                config.name,
            )
    elif static:
        gears = (int(config.max_batch_size),)
    elif dims_text:
        gears = parse_gears(dims_text)
        check_gears(gears, int(config.max_batch_size), "graph.ge.dynamicDims")
    else:
        gears = default_gears(int(config.max_batch_size))
    if shapes.kind in (BATCH, STATIC):
        input_shape = options.get("ge.inputShape", "").strip() or _input_shape(
            inputs, batching, gears
        )
    else:
        input_shape = shapes.input_shape
    atc: list[tuple[str, str]] = list(shapes.atc_flags)
    unused: list[str] = []
    for key in sorted(options):
        if key in _SHAPE_OPTIONS:
            continue
        flag = ATC_FLAGS.get(key)
        if flag is None:
            unused.append(key)
        else:
            atc.append((flag, options[key]))
    for key in sorted(params):
        if key.startswith("atc."):
            atc.append((atc_flag(key), params[key]))
    for key in ("dump_graph", "dump_data", "profiling"):
        if params.get(key, "").strip() not in ("", "0", "false"):
            log.warning(
                "model '%s': npu_ge parameter %s is accepted but has no effect in ge-serve",
                config.name,
                key,
            )
    return GePlan(
        slots=_slots(config, params),
        batching=batching,
        gears=gears,
        static_model=static,
        inputs=inputs,
        outputs=outputs,
        input_shape=input_shape,
        atc_options=tuple(atc),
        shapes=shapes,
        ge_options=options,
        unused_options=tuple(unused),
    )


def intra_threads(params: Mapping[str, str], streams: int, cores: int) -> int:
    """onnxruntime threads per simulated stream: configured, or the cores shared out."""
    configured = params.get("intra_op_thread_count", "").strip()
    if configured:
        if not configured.isdigit() or int(configured) < 1:
            raise ValueError(
                f"parameter intra_op_thread_count must be a whole number >= 1, got '{configured}'"
            )
        return int(configured)
    return max(cores // max(streams, 1), 1)
