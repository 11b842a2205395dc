"""The response cache: keys, LRU eviction within the byte budget, and who bypasses it."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
from google.protobuf import text_format

from ge_serve.protos import model_config_pb2
from ge_serve.server.inference.responsecache import ResponseCache, cache_key, enabled_for

OUT_BYTES = 1024


def model(
    name: str = "m",
    version: int = 1,
    config: str = "response_cache { enable: true }",
    folder: str = "",
) -> Any:
    parsed = text_format.Parse(config, model_config_pb2.ModelConfig())
    decoupled = parsed.model_transaction_policy.decoupled
    model_dir = Path(folder or f"/repo/{name}")
    return SimpleNamespace(
        name=name, version=version, config=parsed, decoupled=decoupled, model_dir=model_dir
    )


def inputs(value: int, shape: tuple[int, ...] = (4,), dtype: Any = np.int32) -> dict[str, Any]:
    return {"x": np.full(shape, value, dtype=dtype)}


def outputs(value: int) -> dict[str, Any]:
    return {"y": np.full(OUT_BYTES // 4, value, dtype=np.int32)}


def test_the_key_is_model_version_and_each_inputs_name_type_shape_and_bytes() -> None:
    base = cache_key(model(), inputs(1))
    assert cache_key(model(), inputs(1)) == base
    assert cache_key(model("other"), inputs(1)) != base
    assert cache_key(model(version=2), inputs(1)) != base
    assert cache_key(model(), inputs(2)) != base
    assert cache_key(model(), inputs(1, (2, 2))) != base, "same bytes, other shape"
    assert cache_key(model(), {"x": np.full(4, 1, np.uint32)}) != base, "same bytes, other type"
    assert cache_key(model(), {"z": inputs(1)["x"]}) != base, "other name"
    a, b = np.array([b"ab", b"c"], dtype=object), np.array([b"a", b"bc"], dtype=object)
    assert cache_key(model(), {"s": a}) != cache_key(model(), {"s": b}), "element boundaries"
    both = {"x": np.ones(2, np.int32), "w": np.zeros(2, np.int32)}
    assert cache_key(model(), both) == cache_key(model(), dict(reversed(both.items())))


def test_hits_return_what_was_stored_read_only_and_copied() -> None:
    cache = ResponseCache(1 << 20)
    first = cache.lookup(model(), inputs(1))
    assert first.found is None
    produced = outputs(7)
    cache.insert(first, produced, {"p": 1})
    produced["y"][:] = 0  # an executor reusing its buffer must not change the entry
    again = cache.lookup(model(), inputs(1))
    assert again.found is not None
    assert again.found.outputs["y"].tolist() == [7] * (OUT_BYTES // 4)
    assert not again.found.outputs["y"].flags.writeable
    assert again.found.parameters == {"p": 1}
    assert (cache.counts.hits, cache.counts.misses) == (1, 1)


def test_least_recently_used_entries_are_evicted_within_the_budget() -> None:
    entry = OUT_BYTES + 512 + 160  # the array, the entry's and the array's overhead
    cache = ResponseCache(2 * entry)
    for value in (1, 2):
        cache.insert(cache.lookup(model(), inputs(value)), outputs(value), {})
    assert len(cache) == 2 and cache.counts.bytes == 2 * entry
    assert cache.lookup(model(), inputs(1)).found is not None  # 1 is now the most recent
    cache.insert(cache.lookup(model(), inputs(3)), outputs(3), {})
    assert len(cache) == 2 and cache.counts.evictions == 1
    assert cache.lookup(model(), inputs(2)).found is None, "the least recently used went"
    assert cache.lookup(model(), inputs(1)).found is not None
    assert cache.lookup(model(), inputs(3)).found is not None
    assert cache.counts.bytes <= cache.capacity


def test_an_entry_larger_than_the_budget_is_not_kept() -> None:
    cache = ResponseCache(OUT_BYTES // 2)
    cache.insert(cache.lookup(model(), inputs(1)), outputs(1), {})
    assert len(cache) == 0 and cache.counts.skipped == 1


def test_models_without_the_option_bypass() -> None:
    # A decoupled model with the option never loads (tests/e2e/test_load_refusals.py).
    assert enabled_for(model())
    assert not enabled_for(model(config=""))


def test_same_named_models_of_two_namespaces_never_share_entries() -> None:
    data = inputs(1)
    assert cache_key(model(folder="/r1/m"), data) != cache_key(model(folder="/r2/m"), data)


def test_the_budget_bounds_the_memory_bytes_outputs_take() -> None:
    # BYTES elements are Python objects: counted by their content alone, a cache took
    # 3.4 times its budget.
    budget = 1 << 20
    cache = ResponseCache(budget)
    tracemalloc.start()
    try:
        for value in range(4_000):
            strings = [str(value * 128 + i).encode() for i in range(128)]
            produced = {"y": np.array(strings, dtype=object).reshape(8, 16)}
            cache.insert(cache.lookup(model(), inputs(value)), produced, {})
            del produced, strings
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cache.counts.evictions > 0 and cache.counts.bytes <= budget
    assert held <= 1.1 * budget, f"{held / budget:.2f} times the budget"
