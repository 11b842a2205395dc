"""The onnxruntime backend's session and run options, read from a model's config as
Triton's onnxruntime backend reads them (onnxruntime_backend src/onnxruntime.cc).

`parameters`: `execution_mode` (0 sequential, 1 parallel), `intra_op_thread_count`,
`inter_op_thread_count`, `enable_mem_arena`, `enable_mem_pattern`,
`session.use_device_allocator_for_initializers` and, per run,
`memory.enable_memory_arena_shrinkage`; `optimization.graph.level`; and the names of
`optimization.execution_accelerators.cpu_execution_accelerator`. A value Triton refuses
fails the load with Triton's words (its ParseIntValue / ParseBoolValue texts), since a
setting silently dropped would read as applied. ge-serve's own `allow_spinning` is read
here too. Everything runs once per load; nothing here is on the request path.
"""

from __future__ import annotations

import logging
import os
import re

import onnxruntime as ort

from ge_serve.protos import model_config_pb2

from .onnx_io import max_intra_op_threads
from .text_bool import triton_bool

log = logging.getLogger(__name__)

SHRINKAGE = "memory.enable_memory_arena_shrinkage"
DEVICE_ALLOCATOR = "session.use_device_allocator_for_initializers"
# Triton's CPU accelerators (only with its OpenVINO build). ge-serve has no OpenVINO
# execution provider: the name is accepted and `unhonoured` warns about `optimization`.
CPU_ACCELERATORS = ("openvino",)
_INT32 = 2**31
# onnxruntime's severities: 0 verbose ... 3 error, 4 fatal.
_FATAL = 4
_WHOLE = re.compile(r"\s*[+-]?[0-9]+")


def parse_int(text: str) -> int:
    """A whole number as a model parameter; Triton's ParseIntValue text otherwise. (Its
    std::stoi also reads a number's start, `2abc` as 2; here only a whole number is one.)"""
    if _WHOLE.fullmatch(text) and -_INT32 <= int(text) < _INT32:
        return int(text)
    raise ValueError(f"failed to convert '{text}' to integral number")


def parse_bool(text: str) -> bool:
    """Triton's ParseBoolValue: true/on/1 or false/off/0, in any case."""
    return triton_bool(text, "failed to convert '{text}' to boolean")


def string_param(config: model_config_pb2.ModelConfig, key: str) -> str | None:
    if key in config.parameters:
        return str(config.parameters[key].string_value)
    return None


def int_param(config: model_config_pb2.ModelConfig, key: str) -> int:
    """An integer parameter, 0 when absent (Triton's TryParseModelStringParameter)."""
    text = string_param(config, key)
    return 0 if text is None else parse_int(text)


def thread_count(config: model_config_pb2.ModelConfig, key: str) -> int:
    """`key`'s thread count; 0 (or less) leaves it to the default. onnxruntime starts
    every thread when a session is made, per slot: thousands run the process out of
    threads and the load hangs, so a count past max_intra_op_threads() is refused."""
    count = int_param(config, key)
    bound = max_intra_op_threads()
    if count > bound:
        raise ValueError(
            f"parameter {key} {count} is more threads than this host can use "
            f"(at most {bound}: 4 per core, at least 64)"
        )
    return count


def graph_level(config: model_config_pb2.ModelConfig) -> ort.GraphOptimizationLevel:
    """`optimization.graph.level` as Triton maps it: -1 basic, 1 extended, 2 none, and
    anything else (0 when unset) all."""
    levels = {
        -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }
    return levels.get(config.optimization.graph.level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)


def session_options(config: model_config_pb2.ModelConfig, slots: int) -> ort.SessionOptions:
    """The options every slot's session is made with; ValueError for a value Triton
    refuses, checked in Triton's order."""
    options = ort.SessionOptions()
    options.graph_optimization_level = graph_level(config)
    mode = int_param(config, "execution_mode")
    if mode not in (0, 1):
        raise ValueError(
            "Invalid configuration value provided. Expected values for  execution_mode "
            f"are 0 or 1 but got {mode} ."
        )
    options.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if mode else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    # Triton leaves 0 to onnxruntime (every core); the slots here share the cores.
    intra = thread_count(config, "intra_op_thread_count")
    options.intra_op_num_threads = intra if intra > 0 else max((os.cpu_count() or 1) // slots, 1)
    inter = thread_count(config, "inter_op_thread_count")
    if inter > 0:
        options.inter_op_num_threads = inter
    name = config.name
    allocator = string_param(config, DEVICE_ALLOCATOR)
    if allocator is not None:
        log.debug("Configuring '%s' to '%s' for '%s'", DEVICE_ALLOCATOR, allocator, name)
        options.add_session_config_entry(DEVICE_ALLOCATOR, allocator)
    arena = string_param(config, "enable_mem_arena")
    if arena is not None:
        options.enable_cpu_mem_arena = parse_bool(arena)
        log.debug("Configuring enable_mem_arena to %s", arena)
    pattern = string_param(config, "enable_mem_pattern")
    if pattern is not None:
        options.enable_mem_pattern = parse_bool(pattern)
        log.debug("Configuring enable_mem_pattern to %s", pattern)
    # Spinning intra-op threads burn the cores the event loop and other slots need.
    spin = string_param(config, "allow_spinning") or "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    return options


def check_accelerators(config: model_config_pb2.ModelConfig) -> None:
    """Refuse a CPU execution accelerator Triton does not know, in its words."""
    accelerators = config.optimization.execution_accelerators
    for accelerator in accelerators.cpu_execution_accelerator:
        if accelerator.name not in CPU_ACCELERATORS:
            raise ValueError(f"unknown Execution Accelerator '{accelerator.name}' is requested")


def run_options(
    config: model_config_pb2.ModelConfig, options: ort.SessionOptions
) -> ort.RunOptions:
    """The options of every run: onnxruntime's log quiet but for its fatal errors, and the
    arena shrinkage the config asks for.

    A run that fails is the request's to answer (its client is told, and statistics
    count it), while onnxruntime would also print each failure to stderr in its own
    format, one line per bad request, outside the server's log.

    onnxruntime checks the shrink list only when a run starts, so Triton loads a bad one
    and fails every request; here the one list this host can honour (the CPU arena,
    `cpu:0`, while it is enabled) is checked at load instead."""
    run = ort.RunOptions()
    run.log_severity_level = _FATAL
    value = string_param(config, SHRINKAGE)
    if value is None:
        return run
    devices = value.split(";")
    if devices[-1] == "":  # onnxruntime reads `cpu:0;` as `cpu:0`, and `` as no arena
        devices.pop()
    if any(entry != "cpu:0" for entry in devices) or (devices and not options.enable_cpu_mem_arena):
        raise ValueError(
            f"parameter {SHRINKAGE} '{value}' names an arena this host does not have: "
            "the only one is 'cpu:0' (the CPU arena, while enable_mem_arena is on)"
        )
    log.debug("Configuring %s to %s", SHRINKAGE, value)
    run.add_run_config_entry(SHRINKAGE, value)
    return run
