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

Prefix caching (vLLM's automatic prefix caching, for the blocks held now): a full block is
known by its tokens and the block before it (so by the whole prefix up to it, at the same
positions), and a new sequence whose prompt starts with the same full blocks shares them
instead of computing them again: every chat request starts with the same system prompt
and role markers. A shared block is only read (a sequence writes past its shared blocks),
and is counted by reference: it goes back to the free list, and is forgotten, when its
last holder releases it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

PADDING_BLOCK = 0


class BlockAllocator:
    """Usable blocks 1..count; O(1) allocate and free; full blocks shared by prefix."""

    __slots__ = ("_cached", "_free", "_key_of", "_refs", "total")

    def __init__(self, count: int) -> None:
        self.total = count
        self._free = list(range(count, 0, -1))
        # Holders of each held block; a shared block has more than one.
        self._refs: dict[int, int] = {}
        # (block before it or -1, its tokens) -> a full block, and back.
        self._cached: dict[tuple[int, tuple[int, ...]], int] = {}
        self._key_of: dict[int, tuple[int, tuple[int, ...]]] = {}

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
        for block in taken:
            self._refs[block] = 1
        return taken

    def release(self, blocks: list[int]) -> None:
        """Let go of a sequence's blocks (and empty the list); a block goes back to the
        free list when no other sequence holds it."""
        for block in reversed(blocks):
            left = self._refs.pop(block) - 1
            if left:
                self._refs[block] = left
                continue
            key = self._key_of.pop(block, None)
            if key is not None:
                del self._cached[key]
            self._free.append(block)
        blocks.clear()

    def share(self, tokens: Sequence[int], block_size: int, most: int) -> list[int]:
        """The held blocks that already hold the first full blocks of `tokens` (at most
        `most` of them), each now held once more."""
        found: list[int] = []
        parent = -1
        for i in range(most):
            block = self._cached.get((parent, tuple(tokens[i * block_size : (i + 1) * block_size])))
            if block is None:
                break
            self._refs[block] += 1
            found.append(block)
            parent = block
        return found

    def remember(
        self, blocks: Sequence[int], tokens: Sequence[int], block_size: int, start: int, end: int
    ) -> None:
        """Blocks start..end-1 of a sequence are full: later prompts may share them."""
        for i in range(start, end):
            block = blocks[i]
            key = (blocks[i - 1] if i else -1, tuple(tokens[i * block_size : (i + 1) * block_size]))
            if key not in self._cached and block not in self._key_of:
                self._cached[key] = block
                self._key_of[block] = key


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

    def release(self) -> None:
        """Free the cache arrays once their runner is closed (the allocator stays, for a
        late abort's bookkeeping)."""
        self.keys, self.values = [], []

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
