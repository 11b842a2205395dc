"""The sequence batcher's policy, read and checked once from `sequence_batching` at load.

Every check runs before the scheduler exists, so a block ge-serve cannot honour fails the
load with a reason (Triton's wording where it has one) instead of serving a stateful
model without its semantics.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ge_serve.protos import model_config_pb2
from ge_serve.server.errors import invalid_arg

from .correlation import CorrelationId, SequenceFlags
from .work import Array, WorkItem

Control = model_config_pb2.ModelSequenceBatching.Control
Kind = Control.Kind

# Triton's default for max_sequence_idle_microseconds.
DEFAULT_IDLE_US = 1_000_000

# Numpy types for the CORRID control's data_type (Triton's allowed set).
_CORRID_TYPES: dict[int, Any] = {
    model_config_pb2.TYPE_UINT64: np.uint64,
    model_config_pb2.TYPE_INT64: np.int64,
    model_config_pb2.TYPE_UINT32: np.uint32,
    model_config_pb2.TYPE_INT32: np.int32,
    model_config_pb2.TYPE_STRING: np.object_,
}

_STATE_TYPES: dict[int, Any] = {
    model_config_pb2.TYPE_BOOL: np.bool_,
    model_config_pb2.TYPE_UINT8: np.uint8,
    model_config_pb2.TYPE_UINT16: np.uint16,
    model_config_pb2.TYPE_UINT32: np.uint32,
    model_config_pb2.TYPE_UINT64: np.uint64,
    model_config_pb2.TYPE_INT8: np.int8,
    model_config_pb2.TYPE_INT16: np.int16,
    model_config_pb2.TYPE_INT32: np.int32,
    model_config_pb2.TYPE_INT64: np.int64,
    model_config_pb2.TYPE_FP16: np.float16,
    model_config_pb2.TYPE_FP32: np.float32,
    model_config_pb2.TYPE_FP64: np.float64,
}


class Strategy(enum.Enum):
    DIRECT = "direct"
    OLDEST = "oldest"


@dataclass(frozen=True, slots=True)
class ControlTensor:
    """One control input: its tensor name, kind, and the (false, true) values, or for
    CORRID the numpy type of the ID."""

    name: str
    kind: int
    false_true: tuple[Any, Any] = (0, 1)
    dtype: Any = np.int32

    def value(self, on: bool) -> Any:
        return self.false_true[1 if on else 0]

    def type_name(self) -> str:
        """The CORRID type as the protocol names it (UINT64, BYTES, ...)."""
        return "BYTES" if self.dtype is np.object_ else np.dtype(self.dtype).name.upper()

    def corrid(self, correlation_id: CorrelationId) -> Array:
        """The CORRID tensor of one request. A numeric ID (a uint64) is cut to the
        tensor's width as Triton's SetControlTensors copies it: the low bytes, read as
        this type, so 2**33 + 5 is 5 in an INT32 and 2**64 - 1 is -1. An ID the type
        cannot hold is the client's to choose; it must not fail the request."""
        if self.dtype is np.object_:
            return np.array([str(correlation_id).encode()], dtype=np.object_)
        if isinstance(correlation_id, str):
            correlation_id = 0
        dtype = np.dtype(self.dtype)
        bits = dtype.itemsize * 8
        low = correlation_id & ((1 << bits) - 1)
        if dtype.kind == "i" and low >> (bits - 1):
            low -= 1 << bits  # two's complement, as the copied bytes read
        return np.array([low], dtype=dtype)


@dataclass(frozen=True, slots=True)
class StateTensor:
    """One implicit state: fed to `input_name`, taken back from `output_name`; a sequence
    starts from `initial` (zeros, with 1 for each variable dim, unless configured)."""

    input_name: str
    output_name: str
    initial: Array


@dataclass(frozen=True, slots=True)
class SequencePolicy:
    model: str
    max_batch_size: int
    strategy: Strategy
    idle_us: int
    max_queue_delay_us: int = 0
    # direct: the share of an instance's slots that must be ready before a batch goes
    # early (while max_queue_delay_us has not passed).
    minimum_slot_utilization: float = 0.0
    # oldest: candidate sequences per instance, and Triton's dynamic-batching rules.
    max_candidates: int = 0
    preferred_sizes: tuple[int, ...] = ()
    controls: tuple[ControlTensor, ...] = ()
    states: tuple[StateTensor, ...] = ()
    # Outputs the client may ask for; a state output not among them is never returned.
    outputs: frozenset[str] = field(default_factory=frozenset)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    @property
    def slots_per_instance(self) -> int:
        if self.strategy is Strategy.OLDEST:
            return self.max_candidates
        return max(self.max_batch_size, 1)

    def corrid_control(self) -> ControlTensor | None:
        for control in self.controls:
            if control.kind == Kind.CONTROL_SEQUENCE_CORRID:
                return control
        return None

    @classmethod
    def from_config(cls, config: model_config_pb2.ModelConfig) -> SequencePolicy:
        """Raises ServerError(INVALID_ARG) naming what cannot be honoured."""
        name = config.name
        seq = config.sequence_batching
        mbs = int(config.max_batch_size)
        if config.response_cache.enable:
            raise invalid_arg(
                f"Response Cache does not currently support model {name} with sequence "
                "batching scheduler. Please disable the response cache."
            )
        if seq.iterative_sequence:
            raise invalid_arg(
                f"model '{name}': 'iterative_sequence' is not supported by ge-serve's "
                "sequence batcher"
            )
        outputs = frozenset(o.name for o in config.output)
        states = tuple(_state(name, s, mbs) for s in seq.state)
        if states and config.model_transaction_policy.decoupled:
            raise invalid_arg(
                f"model '{name}': implicit state needs the model's one response per "
                "request; it cannot be used with a decoupled model"
            )
        inputs = {i.name for i in config.input}
        for state in states:
            if state.input_name in inputs:
                raise invalid_arg(
                    f"model '{name}': state input '{state.input_name}' is also a request input"
                )
        controls = _controls(name, seq)
        for control in controls:
            if control.name in inputs:
                raise invalid_arg(
                    f"model '{name}': control input '{control.name}' is also a request input"
                )
        idle = int(seq.max_sequence_idle_microseconds) or DEFAULT_IDLE_US
        common: dict[str, Any] = {
            "model": name,
            "max_batch_size": mbs,
            "idle_us": idle,
            "controls": controls,
            "states": states,
            "outputs": outputs,
        }
        if seq.HasField("oldest"):
            oldest = seq.oldest
            if oldest.preserve_ordering:
                raise invalid_arg(
                    f"model '{name}': 'oldest.preserve_ordering' is not supported by "
                    "ge-serve's sequence batcher"
                )
            preferred = []
            for size in oldest.preferred_batch_size:
                if size <= 0:
                    raise invalid_arg(
                        f"sequence batching preferred batch size must be positive for {name}"
                    )
                if size > mbs:
                    raise invalid_arg(
                        f"sequence batching preferred batch size must be <= max batch size "
                        f"for {name}"
                    )
                preferred.append(int(size))
            if not preferred and mbs > 0:
                preferred = [mbs]
            return cls(
                strategy=Strategy.OLDEST,
                max_queue_delay_us=int(oldest.max_queue_delay_microseconds),
                # Triton's slots per instance: max_batch_size (at least 1) unless the
                # config names a positive count.
                max_candidates=max(int(oldest.max_candidate_sequences), 0) or max(mbs, 1),
                preferred_sizes=tuple(sorted(set(preferred))),
                **common,
            )
        direct = seq.direct
        utilization = float(direct.minimum_slot_utilization)
        if not 0.0 <= utilization <= 1.0:
            raise invalid_arg(
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}"
            )
        return cls(
            strategy=Strategy.DIRECT,
            max_queue_delay_us=int(direct.max_queue_delay_microseconds),
            minimum_slot_utilization=utilization,
            **common,
        )


def _controls(name: str, seq: model_config_pb2.ModelSequenceBatching) -> tuple[ControlTensor, ...]:
    controls: list[ControlTensor] = []
    seen_kinds: set[int] = set()
    seen_names: set[str] = set()
    for control_input in seq.control_input:
        if not control_input.name:
            raise invalid_arg(f"sequence batching control tensor must have a name for {name}")
        if control_input.name in seen_names or len(control_input.control) > 1:
            raise invalid_arg(
                f"sequence batching control tensor '{control_input.name}' is specified for "
                f"multiple control kinds for {name}"
            )
        seen_names.add(control_input.name)
        for c in control_input.control:
            kind_name = Kind.Name(c.kind)
            if c.kind in seen_kinds:
                raise invalid_arg(
                    f"sequence batching specifies multiple {kind_name} tensors for {name}"
                )
            seen_kinds.add(c.kind)
            controls.append(_control(name, control_input.name, c, kind_name))
    return tuple(controls)


def _control(name: str, tensor: str, c: Any, kind_name: str) -> ControlTensor:
    forms = [
        (list(c.int32_false_true), np.int32, "int32_false_true"),
        (list(c.fp32_false_true), np.float32, "fp32_false_true"),
        (list(c.bool_false_true), np.bool_, "bool_false_true"),
    ]
    given = [form for form in forms if form[0]]
    if c.kind == Kind.CONTROL_SEQUENCE_CORRID:
        if given:
            raise invalid_arg(
                "sequence batching must not specify either 'int32_false_true', "
                f"'fp32_false_true' or 'bool_false_true' for {kind_name} for {name}"
            )
        dtype = _CORRID_TYPES.get(c.data_type)
        if dtype is None:
            raise invalid_arg(
                f"unexpected data type for control {kind_name} for {name}. Allowed data "
                "types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
            )
        return ControlTensor(tensor, c.kind, (0, 0), dtype)
    if not given:
        raise invalid_arg(
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' "
            f"or 'bool_false_true' for {kind_name} for {name}"
        )
    if len(given) > 1:
        raise invalid_arg(
            "sequence batching specifies more than one from 'int32_false_true', "
            f"'fp32_false_true' and 'bool_false_true' for {kind_name} for {name}"
        )
    values, dtype, field_name = given[0]
    if len(values) != 2:
        raise invalid_arg(
            f"sequence batching control '{field_name}' must have exactly 2 entries for "
            f"{kind_name} for {name}"
        )
    return ControlTensor(tensor, c.kind, (dtype(values[0]), dtype(values[1])), dtype)


def _state(name: str, state: Any, mbs: int) -> StateTensor:
    if not state.input_name or not state.output_name:
        raise invalid_arg(
            f"model '{name}': a sequence batching state needs input_name and output_name"
        )
    dtype = _STATE_TYPES.get(state.data_type)
    if dtype is None:
        raise invalid_arg(
            f"model '{name}': state '{state.input_name}' has data type "
            f"{model_config_pb2.DataType.Name(state.data_type)}, which ge-serve cannot keep"
        )
    dims = [int(d) for d in state.dims]
    if len(state.initial_state) > 1:
        raise invalid_arg(f"State input name '{state.input_name}' specified more than once.")
    if state.initial_state:
        initial = state.initial_state[0]
        if initial.data_type != state.data_type:
            raise invalid_arg(
                "The data type used for 'initial_state' field of state "
                f"'{state.input_name}' does not match the state data type."
            )
        if not initial.name:
            raise invalid_arg(
                "Field 'name' must be set when using initial_state for state input "
                f"'{state.input_name}'."
            )
        if len(initial.dims) != len(dims):
            raise invalid_arg(
                "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
                f"dimensions for state input '{state.input_name}'. "
                f"{len(initial.dims)} != {len(dims)}"
            )
        for have, want in zip(initial.dims, dims, strict=True):
            if have == -1:
                raise invalid_arg(
                    f"'initial_state' field for state input name '{state.input_name}' "
                    "contains variable dimensions."
                )
            if want != -1 and have != want:
                raise invalid_arg(
                    f"'initial_state' dim for input name '{state.input_name}' doesn't match "
                    f"'state' dim description. {have} != {want}"
                )
        if initial.HasField("data_file"):
            raise invalid_arg(
                f"model '{name}': initial_state 'data_file' of state '{state.input_name}' is "
                "not supported by ge-serve; use zero_data"
            )
        dims = [int(d) for d in initial.dims]
    else:
        dims = [1 if d == -1 else d for d in dims]
    return StateTensor(state.input_name, state.output_name, np.zeros(dims, dtype=dtype))


def control_values(
    policy: SequencePolicy, start: bool, end: bool, ready: bool, correlation: CorrelationId
) -> Mapping[str, Array]:
    """The control tensors of one request (without a batch dim)."""
    tensors: dict[str, Array] = {}
    for control in policy.controls:
        if control.kind == Kind.CONTROL_SEQUENCE_CORRID:
            tensors[control.name] = control.corrid(correlation if ready else 0)
            continue
        if control.kind == Kind.CONTROL_SEQUENCE_START:
            on = start
        elif control.kind == Kind.CONTROL_SEQUENCE_END:
            on = end
        else:
            on = ready
        tensors[control.name] = np.array([control.value(on)], dtype=control.dtype)
    return tensors


def row_inputs(
    policy: SequencePolicy,
    inputs: Mapping[str, Array],
    flags: SequenceFlags | None,
    state: Mapping[str, Array],
) -> dict[str, Array]:
    """A batch row's inputs: the request's, with its control tensors (READY false where
    `flags` is None, a null request) and implicit state, each with the batch dim when the
    model batches."""
    if flags is None:
        controls = control_values(policy, False, False, False, 0)
    else:
        controls = control_values(policy, flags.start, flags.end, True, flags.correlation_id)
    row = dict(inputs)
    for name, value in (*controls.items(), *state.items()):
        row[name] = value[np.newaxis] if policy.batching else value
    return row


def check_request(policy: SequencePolicy, item: WorkItem) -> SequenceFlags:
    """Refuse, with Triton's errors, a request the sequence batcher cannot take."""
    flags = item.sequence
    if flags is None or not flags.in_sequence:
        raise invalid_arg(
            f"inference request to model '{policy.model}' must specify a non-zero or "
            "non-empty correlation ID"
        )
    if policy.batching and item.batch_size > 1:
        raise invalid_arg(
            f"inference request to model '{policy.model}' must specify batch-size 1 due "
            "to requirements of sequence batcher"
        )
    corrid = policy.corrid_control()
    given_string = isinstance(flags.correlation_id, str)
    if corrid is not None and (corrid.dtype is np.object_) != given_string:
        given = "BYTES" if given_string else "UINT64"
        raise invalid_arg(
            f"sequence batching control '{corrid.name}' data-type is '{given}', but model "
            f"'{policy.model}' expects '{corrid.type_name()}'"
        )
    return flags
