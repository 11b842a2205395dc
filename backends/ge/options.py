"""How a model config maps onto GE slots, gears and `atc` options.

Follows CANN's npu_ge Triton backend so its configs load unchanged:
- `parameters` `device_ids` ("4,5"), `device_exec_blocks` (graphs per device),
  `instance_exec_blocks` (graphs one execute call splits its batch across),
  `static_model` ("1" or "true");
- any `ge.*`, `session.ge.*`, `graph.ge.*` (or `global.ge.*`) key, e.g.
  `graph.ge.inputShape`, `graph.ge.dynamicDims` ("1;2;4;8") and `graph.ge.dynamicNodeType`;
- the same keys from `--backend-config=npu_ge,<key>=<value>` (the model's own win).

Options that name a file (`FILE_OPTIONS`, `ATC_FILE_FLAGS`, e.g. `ge.fusionSwitchFile`)
are resolved inside the model folder when they come from the model's own parameters, and
atc gets the resolved path; a value that leaves the folder fails the load. Values from
`--backend-config` are the operator's and pass through as given.

Graphs and slots: the devices are `device_ids`, else the `gpus` of the instance groups,
else NPU 0. As in npu_ge, a device holds `device_exec_blocks` graphs when set, else the
instance count (`count` of the groups that list it, or of every group that lists no gpus)
times `instance_exec_blocks` (default 1). A graph is a model copy on its own stream, as
one loaded OM must not run on two streams at once. An executor slot holds
`instance_exec_blocks` graphs and splits each batch across them (`blocks.GeBlocks`).

GE options with an atc flag (`ATC_FLAGS`) compile into the OM; GE runtime options
(`RUNTIME_OPTIONS`) are accepted with a warning; any other GE option fails the load.

Gears: batching models always execute at a gear, as a compiled OM does: the gears are
`dynamicDims` when given, batch 1 for `static_model` (npu_ge's one-batch graph, run once
per row), and otherwise 1, 2, 4, ... up to `max_batch_size`. Dims other than the batch that vary
(ND gears, image-size gears, shape ranges) are planned by `shapes.plan_shapes`; their
batch gears are the batch dims of the shape gears.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ge_serve.protos import model_config_pb2

from ..onnx_io import CONFIG_NUMPY, within_thread_bound
from ..paths import resolve_inside
from .acl import TensorPlan
from .option_tables import ATC_FILE_FLAGS, ATC_FLAGS, FILE_OPTIONS, RUNTIME_OPTIONS
from .shapes import BATCH, DESCRIBED, STATIC, ShapePlan, plan_shapes

log = logging.getLogger(__name__)

# atc flags that ge-serve sets itself (what to compile, into which file, in which mode,
# for which SoC, with which gears), and what a user sets instead. A second copy on the
# command line would fight ge-serve's (atc takes one of them, and the OM would no longer
# match what ge-serve planned for it).
_OWN_ATC_FLAGS = {
    "model": "the model file is the version folder's model",
    "framework": "it follows the model file's suffix (.onnx, .pb)",
    "output": "the OM goes into the atc cache (--atc-cache-dir)",
    "mode": "ge-serve only compiles models (mode 0)",
    "soc_version": "it is asked of the NPU (acl.get_soc_name); an OM built for another SoC "
    "does not run on it",
    "dynamic_batch_size": 'give the batch gears as graph.ge.dynamicDims (e.g. "1;2;4;8")',
}
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

    # (device id, executor slots on it), in device order.
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
    # GE runtime options (RUNTIME_OPTIONS) that have no atc flag and so do not apply.
    unused_options: tuple[str, ...] = ()
    # instance_exec_blocks: graphs (each a model copy on its own stream) per slot, which
    # one execute call splits its batch across.
    exec_blocks: int = 1
    # static_model with a dynamic batch: the OM is compiled at batch 1 and each slot runs
    # it once per row of a batch.
    static_loop: bool = False

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(device for device, _ in self.slots)

    @property
    def slot_count(self) -> int:
        """Graphs (model copies on their own streams) in all."""
        return sum(slots for _, slots in self.slots) * self.exec_blocks


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
) -> tuple[tuple[tuple[int, int], ...], int]:
    """(device, slots on it) and the graphs per slot (instance_exec_blocks). As in npu_ge,
    a device holds instances x instance_exec_blocks graphs, or device_exec_blocks."""
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
        blocks = min(per_instance, per_device)
        return tuple((device, max(per_device // blocks, 1)) for device in devices), blocks
    counts = dict.fromkeys(devices, 0)
    for group in groups or [model_config_pb2.ModelInstanceGroup(count=1)]:
        count = max(group.count, 1)
        targets = devices if named is not None or not group.gpus else tuple(group.gpus)
        for device in targets:
            counts[device] += count
    return tuple((device, max(counts[device], 1)) for device in devices), per_instance


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
    for key in [*(backend_config or {}), *own]:
        instead = _OWN_ATC_FLAGS.get(atc_flag(key)) if key.startswith("atc.") else None
        if instead is not None:
            raise ValueError(
                f"parameter {key}: ge-serve sets atc's --{atc_flag(key)} itself ({instead})"
            )
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
    static = params.get("static_model", "").strip().lower() in ("1", "true")
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
        gears = (1,)  # npu_ge builds a batch-1 graph and loops over the batch
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
        if flag is not None:
            atc.append((flag, options[key]))
        elif key in RUNTIME_OPTIONS:
            unused.append(key)
        else:
            raise ValueError(
                f"GE option {key} has no atc flag and no pyACL equivalent, so ge-serve cannot "
                "apply it to the OM, and ignoring it could change what the model computes; "
                "remove it, or give the atc flag that does the same as atc.<flag>"
            )
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
    slots, blocks = _slots(config, params)
    return GePlan(
        slots=slots,
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
        exec_blocks=blocks,
        static_loop=static and batching and shapes.kind in (BATCH, STATIC),
    )


def with_npu_config(backend_config: dict[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """`backend_config` with GE_NPU_CONFIG applied as npu_ge applies it: the environment
    variable holds a JSON object of global GE options, which take the place of the
    `--backend-config` ge.* options (the model's own parameters still win over both).
    Values that are not strings become text as JSON writes them. A ValueError says what is
    wrong with it."""
    text = environ.get("GE_NPU_CONFIG", "").strip()
    if not text:
        return backend_config
    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"GE_NPU_CONFIG is not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(given, dict):
        raise ValueError(
            "GE_NPU_CONFIG must be a JSON object of GE options, such as "
            '{"ge.exec.precision_mode": "force_fp16"}'
        )
    options: dict[str, str] = {}
    for key, value in given.items():
        if not _unscoped(key).startswith("ge."):
            raise ValueError(f"GE_NPU_CONFIG key {key!r} is not a GE option (ge.*)")
        options[_unscoped(key)] = value if isinstance(value, str) else json.dumps(value)
    kept = {k: v for k, v in backend_config.items() if not _unscoped(k).startswith("ge.")}
    log.info(
        "GE_NPU_CONFIG: %d global GE option(s) (%s), in place of --backend-config's ge.* "
        "options, as npu_ge reads it",
        len(options),
        ", ".join(sorted(options)),
    )
    return {**kept, **options}


def output_max_shapes(params: Mapping[str, str]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """`output_max_shape` ("PROBS:4,80,12;BOXES:4,100,6"): each output's largest shape, to
    size the device buffers of a prebuilt shape-range OM whose outputs vary."""
    text = params.get("output_max_shape", "").strip()
    found: list[tuple[str, tuple[int, ...]]] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, sep, dims = part.rpartition(":")
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        if not sep or not name or not shape or min(shape) < 1:
            raise ValueError(
                f"parameter output_max_shape entry '{part}' is not name:dims with dims >= 1"
            )
        found.append((name.strip(), shape))
    return tuple(found)


def intra_threads(params: Mapping[str, str], streams: int, cores: int) -> int:
    """onnxruntime threads per simulated stream: configured, or the cores shared out."""
    configured = params.get("intra_op_thread_count", "").strip()
    if configured:
        if not configured.isdigit() or int(configured) < 1:
            raise ValueError(
                f"parameter intra_op_thread_count must be a whole number >= 1, got '{configured}'"
            )
        return within_thread_bound(int(configured))
    return max(cores // max(streams, 1), 1)
