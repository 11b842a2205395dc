"""The KV cache: one pool of fixed-size blocks per layer, and who holds which block.

Each layer's keys and values live in one preallocated array of shape
[blocks, block_size, kv_heads, head_dim], which the step graph reads whole, zero-copy
(a sequence's past is gathered inside the graph through its block table). A sequence
holds a list of blocks; token t of it lives in block blocks[t // block_size] at offset
t % block_size. After each step only the new tokens' keys and values are written into
their slots: no cache is ever copied or grown. Block 0 is never handed out: it pads the
block tables of shorter rows, and the attention mask hides it.

The allocator is a free list; a sequence that cannot get a block waits or is preempted
(its blocks freed and its tokens recomputed later), which the scheduler decides.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

PADDING_BLOCK = 0


class BlockAllocator:
    """Usable blocks 1..count; O(1) allocate and free."""

    __slots__ = ("_free", "total")

    def __init__(self, count: int) -> None:
        self.total = count
        self._free = list(range(count, 0, -1))

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return self.total - len(self._free)

    def allocate(self, count: int) -> list[int] | None:
        """`count` blocks, or None (and nothing taken) when fewer are free."""
        if count > len(self._free):
            return None
        if count <= 0:
            return []
        taken = self._free[-count:]
        del self._free[-count:]
        return taken

    def release(self, blocks: list[int]) -> None:
        self._free.extend(reversed(blocks))
        blocks.clear()


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class KvPool:
    """The cache arrays of every layer, shaped as the step graph takes them."""

    def __init__(
        self, layers: int, blocks: int, block_size: int, kv_heads: int, head_dim: int
    ) -> None:
        shape = (blocks + 1, block_size, kv_heads, head_dim)
        self.block_size = block_size
        self.keys: list[npt.NDArray[np.float32]] = [
            np.zeros(shape, np.float32) for _ in range(layers)
        ]
        self.values: list[npt.NDArray[np.float32]] = [
            np.zeros(shape, np.float32) for _ in range(layers)
        ]
        self.allocator = BlockAllocator(blocks)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)

    def write(
        self,
        keys: list[npt.NDArray[Any]],
        values: list[npt.NDArray[Any]],
        tokens: npt.NDArray[np.intp],
        blocks: npt.NDArray[np.intp],
        offsets: npt.NDArray[np.intp],
    ) -> None:
        """Store the step's new tokens: new token tokens[i] of each layer's output (flat
        over its leading axes: [tokens, kv_heads, head_dim]) goes to slot (blocks[i],
        offsets[i])."""
        for layer, (new_k, new_v) in enumerate(zip(keys, values, strict=True)):
            shape = (-1, *new_k.shape[-2:])
            self.keys[layer][blocks, offsets] = new_k.reshape(shape)[tokens]
            self.values[layer][blocks, offsets] = new_v.reshape(shape)[tokens]
