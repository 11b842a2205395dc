"""A loaded model version as the core sees it: config, tensor specs, scheduler, executors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ge_serve.backends.base import LoadedModel
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.base import Scheduler

from .types import DataType, RequestedOutput


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output as the client sees it (dims exclude the batch dim)."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    # The shape the model itself uses, when the config has `reshape` (batch excluded).
    model_dims: tuple[int, ...] | None = None
    optional: bool = False
    label_filename: str = ""


@dataclass(slots=True)
class ModelVersion:
    name: str
    version: int
    config: model_config_pb2.ModelConfig
    backend: str
    model_dir: Path
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    loaded: LoadedModel
    scheduler: Scheduler
    labels: dict[str, list[str]] = field(default_factory=dict)
    # --model-namespacing: the repository folder it came from (its metrics' `namespace`
    # label, as Triton's); "" without namespacing.
    namespace: str = ""
    # Set (on the loop) just before the lifecycle starts closing this version's scheduler;
    # the core then sends new requests to the version that replaced it.
    retiring: bool = False
    # Read from the config once: every request asks (a protobuf field read is dearer).
    max_batch_size: int = field(init=False)
    version_str: str = field(init=False)
    # Triton's `model_transaction_policy { decoupled: true }`: any number of responses
    # per request, through streaming only.
    decoupled: bool = field(init=False)
    # The outputs a request that names none gets: all of them, in the config's order.
    all_outputs: tuple[RequestedOutput, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.max_batch_size = int(self.config.max_batch_size)
        self.version_str = str(self.version)
        self.decoupled = bool(self.config.model_transaction_policy.decoupled)
        self.all_outputs = tuple(RequestedOutput(name) for name in self.outputs)


def tensor_specs(
    entries: list[model_config_pb2.ModelInput] | list[model_config_pb2.ModelOutput],
) -> dict[str, TensorSpec]:
    specs: dict[str, TensorSpec] = {}
    for entry in entries:
        model_dims = tuple(entry.reshape.shape) if entry.HasField("reshape") else None
        optional = bool(getattr(entry, "optional", False))
        label = str(getattr(entry, "label_filename", ""))
        specs[entry.name] = TensorSpec(
            name=entry.name,
            datatype=DataType.from_config(model_config_pb2.DataType.Name(entry.data_type)),
            dims=tuple(entry.dims),
            model_dims=model_dims,
            optional=optional,
            label_filename=label,
        )
    return specs
