"""Ensemble configs: Triton's load-time checks, and the plan the ensemble scheduler runs.

The checks come in two stages, as in Triton. `check_ensemble` reads the ensemble's own
config only: the fields an ensemble may not have, its steps, and its data flow (every
output written, every tensor used, none written twice, no cycle). `build_plan` runs once
the composing models are loaded, against their completed configs: each step's tensors
exist in its model, every required model input is fed, types and shapes agree between the
step that writes a tensor and the steps that read it, and batch sizes fit.

Messages are Triton's where Triton has one (model_config_utils.cc and ensemble_utils.cc),
so that what operators search for is what they see; Triton spells the ensemble name
without quotes in some of them, and one of them has a stray quote, both kept. Cycles,
which Triton reports only as "not written" or "unused" tensors, have a message of their
own. An ensemble with a decoupled step is decoupled (ensemble_paths.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ge_serve.backends.base import LoadedModel, ModelSpec
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.ensemble import EnsemblePlan, EnsembleStep

from ..errors import ErrorCode, ServerError
from . import autocomplete
from .ensemble_paths import check_decoupled_paths

PLATFORM = "ensemble"

ModelConfig = model_config_pb2.ModelConfig
Step = model_config_pb2.ModelEnsembling.Step


class EnsembleBackend:
    """Stands in for a backend where the lifecycle wants one: an ensemble loads no files
    and has no executors; its scheduler runs other models."""

    name = PLATFORM

    def default_model_filename(self) -> str:
        return ""

    def autocomplete(self, config: ModelConfig, model_path: Path) -> None:
        return None

    def load(self, spec: ModelSpec) -> LoadedModel:
        return LoadedModel(executors=[])


ENSEMBLE_BACKEND = EnsembleBackend()


def is_ensemble(config: ModelConfig) -> bool:
    return (
        config.platform == PLATFORM
        or config.WhichOneof("scheduling_choice") == "ensemble_scheduling"
    )


def step_models(config: ModelConfig) -> tuple[str, ...]:
    """The models an ensemble's steps name, each once, in step order."""
    return tuple(dict.fromkeys(step.model_name for step in config.ensemble_scheduling.step))


def step_version(step: Step) -> str:
    """The version a step asks for; "" is the latest (Triton's -1, and 0, the field's
    default, since no version 0 can exist)."""
    return str(step.model_version) if step.model_version > 0 else ""


def _invalid(message: str) -> ServerError:
    return ServerError(ErrorCode.INVALID_ARG, message)


# --- the ensemble's own config ------------------------------------------------------------


def check_ensemble(config: ModelConfig) -> None:
    """Refuse an ensemble config that cannot work whatever its models are. Whether it is
    decoupled is its steps' say, not its own: False until `build_plan` finds one that is."""
    name = config.name
    # Triton's first check of any config: an ensemble runs its steps' backends and has
    # none of its own, so a backend here is a mistake, not something to ignore.
    if config.platform == PLATFORM and config.backend:
        raise _invalid(
            f"Ensemble model '{name}' must have platform type '{PLATFORM}' and empty backend type"
        )
    if config.WhichOneof("scheduling_choice") != "ensemble_scheduling":
        raise _invalid(
            f"ensemble scheduling must be set for ensemble {name} whose platform is {PLATFORM}"
        )
    if config.platform != PLATFORM:
        raise _invalid(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not {PLATFORM}"
        )
    if config.instance_group:
        raise _invalid(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise _invalid(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise _invalid(f"model_warmup can not be specified for ensemble '{name}'")
    steps = config.ensemble_scheduling.step
    if not steps:
        raise _invalid(f"must specify 'step' for ensemble '{name}'")
    for index, step in enumerate(steps):
        for field, present in (
            ("model_name", step.model_name),
            ("input_map", step.input_map),
            ("output_map", step.output_map),
        ):
            if not present:
                raise _invalid(f"must specify '{field}' in step {index} of ensemble '{name}'")
    autocomplete.check(config)
    _check_writers(config)
    _check_cycles(config)
    _check_data_flow(config)
    config.model_transaction_policy.decoupled = False


def _check_writers(config: ModelConfig) -> None:
    """Each ensemble tensor is written once, and never over one of the ensemble's inputs."""
    inputs = {entry.name for entry in config.input}
    written: set[str] = set()
    for index, step in enumerate(config.ensemble_scheduling.step):
        for tensor in step.output_map.values():
            if tensor in written:
                raise _invalid(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{config.name}' step {index}"
                )
            if tensor in inputs:
                raise _invalid(
                    f"ensemble tensor '{tensor}' is an input of ensemble '{config.name}' and "
                    f"can not appear in the output map of step {index}"
                )
            written.add(tensor)


def _step_label(config: ModelConfig, index: int) -> str:
    return f"step {index} (model '{config.ensemble_scheduling.step[index].model_name}')"


def _check_cycles(config: ModelConfig) -> None:
    """A step that needs, however indirectly, a tensor it writes itself can never run."""
    steps = config.ensemble_scheduling.step
    readers: dict[str, list[int]] = {}
    for index, step in enumerate(steps):
        for tensor in step.input_map.values():
            readers.setdefault(tensor, []).append(index)
    feeds = [
        sorted({r for t in step.output_map.values() for r in readers.get(t, ())}) for step in steps
    ]
    done: set[int] = set()
    path: list[int] = []

    def visit(index: int) -> None:
        path.append(index)
        for reader in feeds[index]:
            if reader in path:
                cycle = [*path[path.index(reader) :], reader]
                raise _invalid(
                    f"circular dependency in ensemble '{config.name}': "
                    + " -> ".join(_step_label(config, i) for i in cycle)
                )
            if reader not in done:
                visit(reader)
        path.pop()
        done.add(index)

    for index in range(len(steps)):
        if index not in done:
            visit(index)


def _check_data_flow(config: ModelConfig) -> None:
    """Triton's data-flow check: every input feeds a step, every output is written from the
    inputs, and every other tensor is both written and read."""
    name = config.name
    steps = config.ensemble_scheduling.step
    read = {tensor for step in steps for tensor in step.input_map.values()}
    writer = {
        tensor: index for index, step in enumerate(steps) for tensor in step.output_map.values()
    }
    tensors = read | set(writer)
    for entry in config.input:
        if entry.name not in tensors:
            raise _invalid(f"ensemble input '{entry.name}' for ensemble {name}' is not used")
    ready = {entry.name for entry in config.input}
    progress = True
    while progress:
        progress = False
        for step in steps:
            outputs = set(step.output_map.values())
            if not outputs <= ready and set(step.input_map.values()) <= ready:
                ready |= outputs
                progress = True
    answers = [entry.name for entry in config.output]
    for output in answers:
        if output not in tensors:
            raise _invalid(f"ensemble output '{output}' for ensemble {name}' is not used")
        if output not in ready:
            message = f"output '{output}' for ensemble '{name}' is not written"
            source = _unconnected_source(output, steps, writer, ready)
            if source != output:
                message += f": at least one of its depending tensors, '{source}', is not connected"
            raise _invalid(message)
    for tensor in sorted(tensors - set(answers)):
        if tensor not in ready or tensor not in read:
            raise _invalid(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'")


def _unconnected_source(
    tensor: str, steps: Sequence[Step], writer: dict[str, int], ready: set[str]
) -> str:
    """Follow a tensor that is never written back to the earliest tensor that is not."""
    seen = {tensor}
    current = tensor
    while current in writer:
        step = steps[writer[current]]
        upstream = [t for t in step.input_map.values() if t not in ready and t not in seen]
        if not upstream:
            break
        current = upstream[0]
        seen.add(current)
    return current


# --- against the composing models ---------------------------------------------------------


class _Reasoned(Protocol):
    @property
    def reason(self) -> str: ...


class _Record(Protocol):
    """What the lifecycle keeps of a model (its ModelRecord), as far as read here."""

    @property
    def reason(self) -> str: ...

    @property
    def versions(self) -> Mapping[int, _Reasoned]: ...


class _Served(Protocol):
    @property
    def config(self) -> ModelConfig: ...


def step_lookup(
    ensemble: str, get: Callable[[str, str], _Served], records: Mapping[str, _Record]
) -> Callable[[str, str], ModelConfig]:
    """`build_plan`'s view of the lifecycle: `get` is the lifecycle's (a model version that
    serves, or a ServerError), `records` its model records, for why one does not serve."""

    def config(model: str, version: str) -> ModelConfig:
        try:
            return get(model, version).config
        except ServerError:
            record = records.get(model)
            if record is None:
                raise missing_step(ensemble, model, version, False, False, "") from None
            why = [record.reason, *(entry.reason for entry in record.versions.values())]
            reason = next((w for w in why if w and w != "unloaded"), "")
            try:
                ready = bool(get(model, ""))
            except ServerError:
                ready = False
            raise missing_step(ensemble, model, version, True, ready, reason) from None

    return config


class _Labelled(Protocol):
    @property
    def labels(self) -> Mapping[str, list[str]]: ...


def inherited_labels(
    config: ModelConfig, labels: Mapping[str, list[str]], get: Callable[[str, str], _Labelled]
) -> dict[str, list[str]]:
    """The labels an ensemble classifies with, completed as Triton's core does at its load
    (model_lifecycle.cc): an output with no `label_filename` of its own takes the labels of
    the step output that writes it, as that model has them then (a nested ensemble's own
    inherited ones included). They are kept until the ensemble reloads, which it does when
    a step's model reloads (ensembles.py), as in Triton. `get(model, version)` is the
    lifecycle's; the steps are already checked to be served (`build_plan`)."""
    completed = dict(labels)
    outputs = {entry.name for entry in config.output}
    for step in config.ensemble_scheduling.step:
        for model_output, tensor in step.output_map.items():
            if tensor in outputs and tensor not in completed:
                served = get(step.model_name, step_version(step)).labels
                completed[tensor] = served.get(model_output, [])
    return completed


def missing_step(
    ensemble: str, model: str, version: str, known: bool, ready: bool, why: str
) -> ServerError:
    """Why a step's model cannot be used: never heard of, or without the version it needs.

    `known`: the model is in the repository or was loaded; `ready`: some version of it is
    READY; `why`: the reason its load failed, if it did.
    """
    if not known:
        return _invalid(
            f"ensemble {ensemble} contains models that are not available or ambiguous: {model}"
        )
    if version and ready:
        return _invalid(
            f"ensemble '{ensemble}' depends on '{model}' whose required version {version} "
            "is not loaded."
        )
    message = f"ensemble '{ensemble}' depends on '{model}' which has no loaded version."
    if why:
        message += f" Model '{model}' loading failed with error: {why}"
    return _invalid(message)


@dataclass(frozen=True, slots=True)
class _Tensor:
    """What one side of an ensemble tensor says it is: its writer's or a reader's view."""

    model: str
    data_type: int
    dims: tuple[int, ...]
    # With the batch dim, when that side batches.
    full_dims: tuple[int, ...]

    @classmethod
    def of(cls, model: str, batching: bool, data_type: int, dims: Sequence[int]) -> _Tensor:
        own = tuple(int(d) for d in dims)
        return cls(model, data_type, own, ((-1,) if batching else ()) + own)


def _dims_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _dims_str(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _agree(ensemble: str, name: str, lhs: _Tensor, rhs: _Tensor) -> None:
    """Triton's consistency rule: the same type, and shapes that match allowing -1, either
    as they are or with the batch dim (a non-batching model may read [-1, d...] where a
    batching one writes [d...])."""
    prefix = f"in ensemble {ensemble}, ensemble tensor {name}: "
    type_name = model_config_pb2.DataType.Name
    if lhs.data_type != rhs.data_type:
        raise _invalid(
            f"{prefix}inconsistent data type: {type_name(lhs.data_type)} is inferred from "
            f"model {lhs.model} while {type_name(rhs.data_type)} is inferred from model "
            f"{rhs.model}"
        )
    if not (_dims_agree(lhs.dims, rhs.dims) or _dims_agree(lhs.full_dims, rhs.full_dims)):
        raise _invalid(
            f"{prefix}inconsistent shape: {_dims_str(lhs.full_dims)} is inferred from model "
            f"{lhs.model} while {_dims_str(rhs.full_dims)} is inferred from model {rhs.model}"
        )


def _io_dims(entry: model_config_pb2.ModelInput | model_config_pb2.ModelOutput) -> Sequence[int]:
    return entry.reshape.shape if entry.HasField("reshape") else entry.dims


def build_plan(config: ModelConfig, step_config: Callable[[str, str], ModelConfig]) -> EnsemblePlan:
    """Check an ensemble (already through `check_ensemble`) against its composing models
    and return the plan its scheduler runs.

    `step_config(model, version)` returns the completed config of the version a step will
    use ("" for the latest), or raises the `missing_step` error.
    """
    name = config.name
    batching = config.max_batch_size > 0
    tensors: dict[str, _Tensor] = {}
    for entry in list(config.input) + list(config.output):
        tensors[entry.name] = _Tensor.of(name, batching, entry.data_type, _io_dims(entry))
    steps: list[EnsembleStep] = []
    for step in config.ensemble_scheduling.step:
        model = step.model_name
        version = step_version(step)
        composing = step_config(model, version)
        limit = composing.max_batch_size
        if limit != 0 and limit < config.max_batch_size:
            raise _invalid(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {model} which only allows maximum batch size to be {limit}"
            )
        _map_tensors(name, step, composing, tensors)
        steps.append(
            EnsembleStep(
                model_name=model,
                model_version=version,
                inputs=tuple(sorted(step.input_map.items())),
                outputs=tuple(sorted(step.output_map.items())),
                decoupled=composing.model_transaction_policy.decoupled,
            )
        )
    outputs = tuple(entry.name for entry in config.output)
    inputs = tuple(entry.name for entry in config.input)
    decoupled = check_decoupled_paths(name, steps, inputs, outputs)
    output_dims = {entry.name: tuple(_io_dims(entry)) for entry in config.output}
    return EnsemblePlan(name, tuple(steps), outputs, decoupled, inputs, batching, output_dims)


def _map_tensors(
    ensemble: str, step: Step, composing: ModelConfig, tensors: dict[str, _Tensor]
) -> None:
    """Check one step's maps against its model, and record the tensors it reads and writes."""
    model = step.model_name
    batching = composing.max_batch_size > 0
    inputs = {entry.name: entry for entry in composing.input}
    for model_input, tensor in sorted(step.input_map.items()):
        if model_input not in inputs:
            raise _invalid(
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapping to "
                f"non-existing input {model_input} in model {model}"
            )
    for entry in composing.input:
        if entry.name not in step.input_map:
            if entry.optional:
                continue
            raise _invalid(
                f"in ensemble {ensemble}, input {entry.name} in model {model} is not mapped "
                "to any ensemble tensors"
            )
        seen = _Tensor.of(model, batching, entry.data_type, entry.dims)
        _meet(ensemble, step.input_map[entry.name], seen, tensors)
    outputs = {entry.name: entry for entry in composing.output}
    for model_output, tensor in sorted(step.output_map.items()):
        written = outputs.get(model_output)
        if written is None:
            raise _invalid(
                f"in ensemble {ensemble}, ensemble tensor {tensor} is mapped from "
                f"non-existing output {model_output} in model {model}"
            )
        seen = _Tensor.of(model, batching, written.data_type, written.dims)
        _meet(ensemble, tensor, seen, tensors)


def _meet(ensemble: str, name: str, seen: _Tensor, tensors: dict[str, _Tensor]) -> None:
    known = tensors.get(name)
    if known is None:
        tensors[name] = seen
    else:
        _agree(ensemble, name, known, seen)
