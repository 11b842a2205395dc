"""Triton's response cache (`--cache-config local,size=BYTES`, per model
`response_cache { enable: true }`): a request whose inputs were seen before is answered
from memory, without queuing or executing.

What is cached is what the model produced for the inputs (every output, and the
response parameters a model gave), not a wire response, so requests that ask for other
outputs or classification share an entry. The key is a digest of the model's name and
version and each input's name, datatype, shape and bytes, inputs taken by name.

Entries are kept in least-recently-used order within the byte budget; an entry larger
than the whole budget is not kept. Stored arrays are copies (an executor may reuse its
output buffers) and read-only. Everything here runs on the event loop.

Requests that write outputs to shared memory bypass the cache, as in Triton. A decoupled
model never reaches it: as in Triton, enabling the cache on one fails the model's load
(`autocomplete.check`), and so does enabling it with sequence batching
(scheduler/sequence_config.py).
"""

from __future__ import annotations

import hashlib
import struct
import sys
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ge_serve.backends.base import Array, ParamValue

from .model import ModelVersion

_LENGTH = struct.Struct("<Q")
# What a kept entry costs besides its arrays (key, result, dicts, the LRU's node), and
# each array's header: measured with tracemalloc, so that the budget bounds memory.
_ENTRY_OVERHEAD = 512
_ARRAY_OVERHEAD = 160


@dataclass(frozen=True, slots=True)
class CachedResult:
    outputs: dict[str, Array]
    parameters: Mapping[str, ParamValue]
    size: int


@dataclass(slots=True)
class Lookup:
    """One request's trip to the cache: its key, what was found, and the time spent."""

    key: bytes
    found: CachedResult | None
    lookup_ns: int
    # When the lookup began (time.monotonic_ns()): a hit's queue time ends there.
    started_ns: int


@dataclass(slots=True)
class CacheCounts:
    entries: int = 0
    bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    inserts: int = 0
    skipped: int = 0  # too large for the whole budget


def enabled_for(model: ModelVersion) -> bool:
    return bool(model.config.response_cache.enable)


def cache_key(model: ModelVersion, inputs: Mapping[str, Array]) -> bytes:
    digest = hashlib.blake2b(digest_size=20)
    # The folder too: with --model-namespacing, two models may share a name.
    for part in (model.name, str(model.version), str(model.model_dir)):
        digest.update(_LENGTH.pack(len(part)) + part.encode())
    for name in sorted(inputs):
        array = inputs[name]
        digest.update(_LENGTH.pack(len(name)) + name.encode())
        digest.update(array.dtype.str.encode())
        digest.update(_LENGTH.pack(array.ndim) + b"".join(_LENGTH.pack(d) for d in array.shape))
        if array.dtype == np.object_:
            for element in array.reshape(-1).tolist():
                data = element if isinstance(element, bytes) else str(element).encode()
                digest.update(_LENGTH.pack(len(data)) + data)
        else:
            digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
    return digest.digest()


def _frozen_copy(array: Array) -> tuple[Array, int]:
    """A read-only copy, and what it costs in memory: a BYTES element is a Python object
    (about 33 bytes besides its content) behind an 8-byte pointer."""
    copy = np.array(array, copy=True)
    copy.flags.writeable = False
    if copy.dtype == np.object_:
        size = sum(map(sys.getsizeof, copy.reshape(-1).tolist()))
        return copy, _ARRAY_OVERHEAD + size + 8 * copy.size
    return copy, _ARRAY_OVERHEAD + int(copy.nbytes)


class ResponseCache:
    """The server's one local cache, shared by every model that enables it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[bytes, CachedResult] = OrderedDict()
        self.counts = CacheCounts()

    def lookup(self, model: ModelVersion, inputs: Mapping[str, Array]) -> Lookup:
        started = time.monotonic_ns()
        key = cache_key(model, inputs)
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            self.counts.hits += 1
        else:
            self.counts.misses += 1
        return Lookup(key, found, time.monotonic_ns() - started, started)

    def insert(
        self, lookup: Lookup, outputs: Mapping[str, Array], parameters: Mapping[str, ParamValue]
    ) -> int:
        """Keep what the model produced for a missed key; returns the nanoseconds the
        miss cost in all (lookup and insert), as Triton's cache_miss duration counts."""
        started = time.monotonic_ns()
        kept: dict[str, Array] = {}
        size = _ENTRY_OVERHEAD
        for name, array in outputs.items():
            kept[name], nbytes = _frozen_copy(np.asarray(array))
            size += nbytes
        if size > self.capacity:
            self.counts.skipped += 1
        elif lookup.key not in self._entries:
            while self._entries and self.counts.bytes + size > self.capacity:
                _, evicted = self._entries.popitem(last=False)
                self.counts.bytes -= evicted.size
                self.counts.evictions += 1
            self._entries[lookup.key] = CachedResult(kept, dict(parameters), size)
            self.counts.bytes += size
            self.counts.inserts += 1
        self.counts.entries = len(self._entries)
        return lookup.lookup_ns + time.monotonic_ns() - started

    def __len__(self) -> int:
        return len(self._entries)

    def describe(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "entries": len(self), "bytes": self.counts.bytes}
