"""The shape rules Triton applies to every configured input and output at load.

Triton core refuses, in `ValidateIOShape` (src/model_config_utils.cc, called for every
model by `ValidateModelIOConfig`), dims or reshape dims that are neither >= 1 nor -1, an
empty reshape on a model without batching, and a reshape whose element count differs
from the dims'. With variable-size (-1) dims the counts are compared segment by segment
between the -1s: [2, 4, -1, 6] may become [8, -1, 1, 6], not [8, -1, 2, 3]. A config
that passed here without them would load and then fail every request (an output that
cannot be reshaped), so they are load errors, with Triton's messages.
"""

from __future__ import annotations

from collections.abc import Sequence

from ge_serve.protos import model_config_pb2

from ..errors import ErrorCode, ServerError

WILDCARD = -1
INT64_MAX = 2**63 - 1


def check_io_shapes(config: model_config_pb2.ModelConfig) -> None:
    """Refuse the first input or output whose dims or reshape Triton would refuse."""
    entries: list[tuple[str, model_config_pb2.ModelInput | model_config_pb2.ModelOutput]]
    entries = [("model input ", e) for e in config.input]
    entries += [("model output ", e) for e in config.output]
    for prefix, entry in entries:
        why = _shape_problem(f"{prefix}'{entry.name}' ", entry, config.max_batch_size)
        if why is not None:
            # Triton's ValidateModelIOConfig ends each message with the model's name.
            raise ServerError(ErrorCode.INVALID_ARG, f"{why} for {config.name}")


def _shape_problem(
    named: str,
    entry: model_config_pb2.ModelInput | model_config_pb2.ModelOutput,
    max_batch_size: int,
) -> str | None:
    """Why Triton refuses the entry's shape, in its words; None when it does not.
    `named` starts most of them: "model input 'X' "."""
    has_reshape = entry.HasField("reshape")
    reshape = list(entry.reshape.shape)
    if has_reshape and not reshape and max_batch_size == 0:
        return (
            f"{named}cannot have empty reshape for non-batching model as scalar tensors are "
            "not supported"
        )
    if any(d < 1 and d != WILDCARD for d in entry.dims):
        return (
            f"{named}dimension must be integer >= 1, or {WILDCARD} to indicate a "
            "variable-size dimension"
        )
    if not has_reshape:
        return None
    if any(d < 1 and d != WILDCARD for d in reshape):
        return (
            f"{named}reshape dimensions must be integer >= 1, or {WILDCARD} to indicate a "
            "variable-size dimension"
        )
    dims_size = _element_count(entry.dims)
    reshape_size = _element_count(reshape)
    for size, what in ((dims_size, "dims"), (reshape_size, "reshape")):
        if size > INT64_MAX:
            tensor = f"{entry.name} {what}"
            return f"element count for tensor '{tensor}' exceeds maximum size of {INT64_MAX}"
    # An empty reshape (a scalar, count 0) matches dims of one element.
    if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
        return f"{named}has different size for dims and reshape"
    if dims_size == WILDCARD:
        dims_segments, reshape_segments = _segments(entry.dims), _segments(reshape)
        if len(dims_segments) != len(reshape_segments):
            return f"{named}has different number of variable-size dimensions for dims and reshape"
        if dims_segments != reshape_segments:
            return f"{named}has different size for dims and reshape"
    return None


def _element_count(dims: Sequence[int]) -> int:
    """Triton's GetElementCount: -1 with any variable-size dim, 0 for no dims."""
    if WILDCARD in dims:
        return WILDCARD
    count = 0
    for index, dim in enumerate(dims):
        count = dim if index == 0 else count * dim
    return count


def _segments(dims: Sequence[int]) -> list[int]:
    """The element counts between variable-size dims: [2, 4, -1, 6] gives [8, 6]."""
    counts = [1]
    for dim in dims:
        if dim == WILDCARD:
            counts.append(1)
        else:
            counts[-1] *= dim
    return counts
