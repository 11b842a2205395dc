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

Prefix caching (vLLM's automatic prefix caching): a full block is known by the whole
prefix up to it, at the same positions, and a new sequence whose prompt starts with the
same full blocks shares them instead of computing them again: every chat request starts
with the same system prompt and role markers, every turn of a chat with the turns before.
A shared block is only read (a sequence writes past its full blocks: only blocks already
full are remembered, prompt or generated, and tokens are only ever appended), and is
counted by reference. When its last holder releases it, a
remembered block stays findable, in a least-recently-released order of evictable blocks:
`allocate` takes the uncached free blocks first, then evicts the least recently
released cached block (forgetting its key), as vLLM's free block queue does; `share`
revives a cached free block (held again, no longer evictable). `free` counts both kinds,
so admission, preemption and the usage gauge see a released cached block as free. With
prefix caching off nothing is remembered, and a released block is simply free.

Keys are a hash chain over the whole prefix (vLLM's `hash_block_tokens` with its sha256):
sha256 of the parent block's key and this block's tokens. Not the parent's block id, as
while only held blocks were cached: a block now outlives its holders, so its parent may
be evicted and that id reused for other content, and a child keyed on the id would then
match a prefix it does not hold. A digest of the whole prefix cannot go stale that way
(a child whose parent was evicted is simply unreachable, since `share` walks from the
first block, until it is evicted in turn).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

PADDING_BLOCK = 0


class BlockAllocator:
    """Usable blocks 1..count; O(1) allocate and free; full blocks shared by prefix, and
    kept findable after their release until evicted (least recently released first)."""

    __slots__ = ("_cached", "_evictable", "_free", "_key_of", "_refs", "total")

    def __init__(self, count: int) -> None:
        self.total = count
        # Free blocks no key names, taken first.
        self._free = list(range(count, 0, -1))
        # Free blocks still cached, least recently released first.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        # Holders of each held block; a shared block has more than one.
        self._refs: dict[int, int] = {}
        # The key of each remembered block (held, or evictable), and the block each cached
        # key names (one per key: a second block of the same prefix is not findable).
        self._key_of: dict[int, bytes] = {}
        self._cached: dict[bytes, int] = {}

    @property
    def free(self) -> int:
        """Blocks that can be allocated: free, and cached but held by none."""
        return len(self._free) + len(self._evictable)

    @property
    def used(self) -> int:
        return self.total - self.free

    @property
    def cached(self) -> int:
        """Blocks findable by prefix (held or not)."""
        return len(self._cached)

    def allocate(self, count: int) -> list[int] | None:
        """`count` blocks, or None (and nothing taken) when fewer are free."""
        if count > self.free:
            return None
        if count <= 0:
            return []
        plain = min(count, len(self._free))
        taken = self._free[len(self._free) - plain :]
        del self._free[len(self._free) - plain :]
        for _ in range(count - plain):
            block, _none = self._evictable.popitem(last=False)
            del self._cached[self._key_of.pop(block)]
            taken.append(block)
        for block in taken:
            self._refs[block] = 1
        return taken

    def release(self, blocks: list[int]) -> None:
        """Let go of a sequence's blocks (and empty the list). A block no other sequence
        holds is free again: still findable where cached (its last block released first,
        so evicted first: vLLM's order), else forgotten."""
        for block in reversed(blocks):
            left = self._refs.pop(block) - 1
            if left:
                self._refs[block] = left
                continue
            key = self._key_of.get(block)
            if key is not None and self._cached.get(key) == block:
                self._evictable[block] = None
                continue
            if key is not None:
                del self._key_of[block]
            self._free.append(block)
        blocks.clear()

    def share(self, tokens: Sequence[int], block_size: int, most: int) -> list[int]:
        """The cached blocks that already hold the first full blocks of `tokens` (at most
        `most` of them), each now held once more (a free one revived)."""
        found: list[int] = []
        key = b""
        for i in range(most):
            key = block_key(key, tokens[i * block_size : (i + 1) * block_size])
            block = self._cached.get(key)
            if block is None:
                break
            if block in self._evictable:
                del self._evictable[block]
                self._refs[block] = 1
            else:
                self._refs[block] += 1
            found.append(block)
        return found

    def remember(
        self, blocks: Sequence[int], tokens: Sequence[int], block_size: int, start: int, end: int
    ) -> None:
        """Blocks start..end-1 of a sequence are full: later prompts may share them. The
        blocks before `start` were remembered before (or shared), in order."""
        for i in range(start, end):
            block = blocks[i]
            if block in self._key_of:
                continue  # shared, or remembered by an earlier step
            parent = self._key_of.get(blocks[i - 1]) if i else b""
            if parent is None:
                return  # a block before was never remembered: its prefix has no key
            key = block_key(parent, tokens[i * block_size : (i + 1) * block_size])
            self._key_of[block] = key
            self._cached.setdefault(key, block)


def block_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """A full block's key: sha256 over its parent's key (empty for the first block) and
    its tokens, so over the whole prefix up to it."""
    digest = hashlib.sha256(parent)
    digest.update(np.asarray(tokens, np.int64).tobytes())
    return digest.digest()


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
