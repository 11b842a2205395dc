"""The model-config fields ge-serve accepts but does not act on, found at load time.

Triton's `model_config.proto` has fields for features ge-serve does not have: CUDA
graphs and TensorRT profiles, host policies, metric controls. A config written for
Triton may set them; silently accepting one would let an operator believe it works.
So every load walks the config once (`check`): a field in `WARNED` gets one warning
line naming it and saying what ge-serve does instead; a field in `REFUSED`, whose
absence would change what a model computes, fails the load with the reason.

Fields are named by their dotted path in the proto (`instance_group.passive`); where a
field sits in a repeated entry, the message names the entry (`instance_group[1].passive`).
A scalar counts as set when it differs from its default (`passive: false` says nothing),
a message when the config has it at all (`optimization {}` is set).

`model_repository_agents` is not here: the agents run at load (repoagents.py).

This is the one place that knows what is ignored (the list came from reading every
field of protos/model_config.proto against the code that reads configs);
tests/unit/test_unhonoured.py checks each entry. `autocomplete.check` calls `check` on
every load, ensembles included.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from google.protobuf.message import Message

from ge_serve.protos import model_config_pb2

from ..errors import ErrorCode, ServerError

# Accepted and ignored: what the field asks for, and what ge-serve does instead.
WARNED: dict[str, str] = {
    "optimization": (
        "GPU execution settings (CUDA graphs, TensorRT, OpenVINO and other accelerators, "
        "pinned memory, priority, eager batching) are not applied, nor is the graph level "
        "outside onnxruntime; the GE backend takes its options from `parameters` (ge.* and "
        "graph.ge.*)"
    ),
    "instance_group.passive": (
        "passive instances are not kept out of scheduling; every instance serves requests"
    ),
    "instance_group.host_policy": "host policies (NUMA binding) are not applied",
    "instance_group.secondary_devices": "secondary devices are not opened or used",
    "instance_group.profile": "TensorRT optimization profiles do not apply to any backend here",
    "model_metrics": "per-model metric controls (custom histogram buckets) are not applied",
    "metric_tags": "metric tags are not added to the model's metrics",
    "model_operations": (
        "custom operation libraries are not loaded; a model that needs one fails in its backend"
    ),
    "ensemble_scheduling.max_inflight_requests": (
        "the number of in-flight requests in an ensemble is not bounded"
    ),
    "input.is_non_linear_format_io": "non-linear I/O formats are TensorRT's; tensors stay linear",
    "output.is_non_linear_format_io": "non-linear I/O formats are TensorRT's; tensors stay linear",
    "sequence_batching.state.use_same_buffer_for_input_output": (
        "state is copied between requests; the hint to share one buffer is not used"
    ),
    "sequence_batching.state.use_growable_memory": (
        "state buffers are sized per request; growable memory is not used"
    ),
}

# Ignoring these would change what a model computes or which model runs, so they fail
# the load.
REFUSED: dict[str, str] = {
    "input.is_shape_tensor": (
        "shape tensors (TensorRT) are not supported: the tensor would be batched and sent as data"
    ),
    "output.is_shape_tensor": "shape tensors (TensorRT) are not supported",
    "ensemble_scheduling.step.model_namespace": (
        "a step's model namespace is not supported: the step's model is looked up in the "
        "ensemble's own namespace first, which could run a different model"
    ),
}


def set_fields(message: Message, prefix: str = "", where: str = "") -> Iterator[tuple[str, str]]:
    """(path, where) for every field set in `message` and its sub-messages: `path` the
    proto path (`instance_group.passive`), `where` the same with repeated entries
    indexed (`instance_group[1].passive`). Map fields (`parameters`) are not entered."""
    for field, value in message.ListFields():
        path = f"{prefix}{field.name}"
        here = f"{where}{field.name}"
        yield path, here
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        if isinstance(value, Message):
            yield from set_fields(value, f"{path}.", f"{here}.")
        else:  # a repeated message field
            entries: list[Any] = list(value)
            for index, entry in enumerate(entries):
                yield from set_fields(entry, f"{path}.", f"{here}[{index}].")


def check(config: model_config_pb2.ModelConfig) -> list[str]:
    """The warnings for the fields `config` sets that ge-serve ignores, one line each;
    raises ServerError (INVALID_ARG) naming the first field whose absence would change
    results."""
    warnings = []
    for path, where in set_fields(config):
        if path in REFUSED:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"model '{config.name}': config field '{where}' is not supported: {REFUSED[path]}",
            )
        if path == "optimization" and _only_honoured(config):
            continue
        if path in WARNED:
            warnings.append(
                f"model '{config.name}': config field '{where}' is accepted and not honoured: "
                f"{WARNED[path]}"
            )
    return warnings


def _only_honoured(config: model_config_pb2.ModelConfig) -> bool:
    """Nothing in `optimization` but what is done: the pinned-memory defaults the config
    API shows (`as_served`: a config read back from it and loaded again), and on
    onnxruntime the graph level (backends/ort_options.py applies it)."""
    fields = {field.name: value for field, value in config.optimization.ListFields()}
    onnxruntime = (config.backend or config.platform) in ("onnxruntime", "onnxruntime_onnx")
    if onnxruntime and fields.pop("graph", None) is not None and not fields:
        return True
    return set(fields) == {"input_pinned_memory", "output_pinned_memory"} and all(
        value.enable for value in fields.values()
    )
