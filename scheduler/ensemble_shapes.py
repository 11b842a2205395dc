"""The batch dimension between an ensemble and its steps, as Triton's ensemble scheduler
fixes it up (core ensemble_scheduler.cc, ReshapeTensorDims).

Every ensemble tensor remembers the batch size of the request that made it: the ensemble
request's for its inputs (0 when the ensemble does not batch), the step request's for a
step's outputs (0 when the step model does not batch). Where a tensor made without
batching enters a model or ensemble that batches, and its shape is the config's dims, a
batch dimension of 1 is put in front; where a tensor made with a batch of 1 enters one
that does not batch, and its shape is not the config's dims, the batch dimension is taken
off. Any other shape passes as it is, for the model's own checks to judge.
"""

from __future__ import annotations

from collections.abc import Sequence

# Triton's WILDCARD_DIM: a config dimension of any size.
WILDCARD = -1


def dims_agree(config_dims: Sequence[int], shape: Sequence[int]) -> bool:
    """Triton's CompareDimsWithWildcard: as many dimensions, each equal or a wildcard."""
    if len(config_dims) != len(shape):
        return False
    return all(a == b or WILDCARD in (a, b) for a, b in zip(config_dims, shape, strict=True))


def batch_reshape(
    config_dims: Sequence[int], batching: bool, tensor_batch: int, shape: tuple[int, ...]
) -> tuple[int, ...]:
    """The shape a tensor made with batch size `tensor_batch` (0: without batching) takes
    where the config dims `config_dims` of a model that batches or not (`batching`) read
    it."""
    if batching == (tensor_batch != 0):
        return shape
    if batching:
        return (1, *shape) if dims_agree(config_dims, shape) else shape
    if tensor_batch == 1 and shape and not dims_agree(config_dims, shape):
        return shape[1:]
    return shape
