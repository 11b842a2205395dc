"""The response cache seen from outside: repeated identical requests are answered from it
with identical outputs, as statistics and Triton's nv_cache_* metrics show; entries are
evicted within the budget; requests with shared-memory outputs bypass it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from deployfiles import DEPLOY
from metricdocs import documented, undocumented
from modelgen import add_sub_model, write_model
from promtext import scrape
from protocols import PROTOCOLS, Triton
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CONFIG = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }},
        {{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }},
         {{ name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{cache}
"""
# Room for two entries of this model's outputs (2 x 16 bytes plus what each array and
# entry costs in memory, 864 bytes in all) and no third.
BUDGET = 2000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("models")
    enabled = "response_cache { enable: true }"
    write_model(repo, "cached", add_sub_model(), CONFIG.format(name="cached", cache=enabled))
    write_model(repo, "uncached", add_sub_model(), CONFIG.format(name="uncached", cache=""))
    write_split_ensemble(repo)
    flags = [f"--cache-config=local,size={BUDGET}", "--allow-client-shm=true"]
    with running_server([repo], flags) as proc:
        yield proc


def write_split_ensemble(repo: Path) -> None:
    """`split`, cached: S = SUM of one step over `uncached`, D = DIFF of another. A request
    for one of them runs only its step."""
    maps = 'input_map { key: "A" value: "A" } input_map { key: "B" value: "B" }'
    steps = [
        f'{{ model_name: "uncached" model_version: -1 {maps} '
        f'output_map {{ key: "{out}" value: "{name}" }} }}'
        for out, name in (("SUM", "S"), ("DIFF", "D"))
    ]
    (repo / "split" / "1").mkdir(parents=True)
    (repo / "split" / "config.pbtxt").write_text(
        'name: "split"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "S" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "D" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
        "response_cache { enable: true }\n"
    )


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Triton]:
    client = Triton.connect(request.param, server)
    try:
        yield client
    finally:
        client.close()


def operands(seed: float) -> dict[str, Any]:
    a = np.full((1, 4), seed, dtype=np.float32)
    return {"A": a, "B": a * 2}


def stats(triton: Triton, model: str) -> dict[str, Any]:
    options = {"as_json": True} if triton.protocol == "grpc" else {}
    found = triton.client.get_inference_statistics(model, **options)["model_stats"][0]
    infer = found["inference_stats"]

    def count(key: str) -> int:
        return int(infer[key].get("count", 0))

    return {
        "hit": count("cache_hit"),
        "miss": count("cache_miss"),
        "success": count("success"),
        "queue": count("queue"),
        "inferences": int(found.get("inference_count", 0)),
        "executions": int(found.get("execution_count", 0)),
    }


def test_repeated_requests_are_answered_from_the_cache(
    triton: Triton, server: ServerProcess
) -> None:
    before = stats(triton, "cached")
    seed = float(uuid.uuid4().int % 1000) + (0.25 if triton.protocol == "http" else 0.5)
    first = triton.infer("cached", operands(seed))
    results = [triton.infer("cached", operands(seed)) for _ in range(3)]
    for result in results:
        np.testing.assert_array_equal(result.as_numpy("SUM"), first.as_numpy("SUM"))
        np.testing.assert_array_equal(result.as_numpy("DIFF"), first.as_numpy("DIFF"))
    only_sum = triton.infer("cached", operands(seed), outputs=["SUM"])
    np.testing.assert_array_equal(only_sum.as_numpy("SUM"), first.as_numpy("SUM"))
    after = stats(triton, "cached")
    delta = {key: after[key] - before[key] for key in after}
    # As Triton counts them (core infer_stats.cc, UpdateSuccessCacheHit): every success
    # was queued, hits included; only the miss was computed.
    assert delta == {
        "hit": 4,
        "miss": 1,
        "success": 5,
        "queue": 5,
        "inferences": 1,
        "executions": 1,
    }
    metrics = scrape(server.metrics_url)
    labels = {"model": "cached", "version": "1"}
    computed = after["success"] - after["hit"]
    assert metrics.value("nv_inference_queue_summary_us_count", **labels) == after["success"]
    for stage in ("compute_input", "compute_infer", "compute_output"):
        # Hits add no compute time to the window: each quantile is a computed request's.
        name = f"nv_inference_{stage}_summary_us"
        assert metrics.value(name + "_count", **labels) == computed
        assert metrics.value(name, **labels, quantile="0.5") > 0
    assert metrics.value("nv_cache_num_hits_per_model", **labels) == after["hit"]
    assert metrics.value("nv_cache_num_misses_per_model", **labels) == after["miss"]
    assert metrics.value("nv_cache_hit_duration_per_model", **labels) > 0
    assert metrics.value("nv_cache_miss_duration_per_model", **labels) > 0
    assert not metrics.find("nv_cache_num_hits_per_model", model="uncached")
    # Triton's cache summaries (summaries are on by default here): a row per hit and per
    # miss, µs.
    for name, key in (("hit", "hit"), ("miss", "miss")):
        family = f"nv_cache_{name}_summary_per_model"
        assert metrics.types[family] == "summary"
        assert metrics.value(family + "_count", **labels) == after[key]
        assert metrics.value(family, **labels, quantile="0.5") > 0
    assert not metrics.find("nv_cache_hit_summary_per_model_count", model="uncached")
    # The cache's families are among those deploy/README.md lists for every name.
    assert undocumented(metrics, documented(DEPLOY / "README.md")) == []


def test_a_model_without_the_option_is_not_cached(triton: Triton) -> None:
    before = stats(triton, "uncached")
    for _ in range(2):
        triton.infer("uncached", operands(1.0))
    after = stats(triton, "uncached")
    assert (after["hit"], after["miss"]) == (0, 0)
    assert after["executions"] - before["executions"] == 2


def test_entries_are_evicted_within_the_budget(triton: Triton) -> None:
    base = 5000.0 + (0 if triton.protocol == "http" else 100)
    for seed in (base, base + 1, base + 2):  # the third evicts the first
        triton.infer("cached", operands(seed))
    before = stats(triton, "cached")
    triton.infer("cached", operands(base + 2))  # still cached
    triton.infer("cached", operands(base))  # evicted: computed again
    after = stats(triton, "cached")
    assert (after["hit"] - before["hit"], after["miss"] - before["miss"]) == (1, 1)


def test_shared_memory_outputs_bypass_the_cache(triton: Triton) -> None:
    name = f"cache_out_{triton.protocol}_{uuid.uuid4().hex[:6]}"
    key = f"/ge_test_{name}"
    handle = shm.create_shared_memory_region(name, key, 64)
    try:
        triton.client.register_system_shared_memory(name, key, 64)
        before = stats(triton, "cached")
        for _ in range(2):
            out = triton.module.InferRequestedOutput("SUM")
            out.set_shared_memory(name, 16)
            triton.client.infer("cached", triton.inputs(operands(42.0)), outputs=[out])
        after = stats(triton, "cached")
        assert (after["hit"], after["miss"]) == (before["hit"], before["miss"])
        assert after["executions"] - before["executions"] == 2
        value = shm.get_contents_as_numpy(handle, np.float32, [1, 4])
        np.testing.assert_array_equal(value, np.full((1, 4), 126.0, np.float32))
        triton.client.unregister_system_shared_memory(name)
    finally:
        shm.destroy_shared_memory_region(handle)


def test_an_ensemble_asked_for_some_outputs_is_not_answered_from_a_partial_entry(
    triton: Triton,
) -> None:
    # A request for S runs only S's step: its answer must not be what a request for D
    # with the same inputs finds later.
    given = operands(40.0 + len(triton.protocol))
    total, difference = given["A"] + given["B"], given["A"] - given["B"]
    only_sum = triton.infer("split", given, outputs=["S"])
    np.testing.assert_array_equal(only_sum.as_numpy("S"), total)
    only_diff = triton.infer("split", given, outputs=["D"])
    np.testing.assert_array_equal(only_diff.as_numpy("D"), difference)
    both = triton.infer("split", given)
    np.testing.assert_array_equal(both.as_numpy("S"), total)
    np.testing.assert_array_equal(both.as_numpy("D"), difference)
    # The whole answer was kept: any request now finds it, each output right.
    before = stats(triton, "split")["hit"]
    again = triton.infer("split", given, outputs=["D"])
    np.testing.assert_array_equal(again.as_numpy("D"), difference)
    assert stats(triton, "split")["hit"] == before + 1
