"""npu_ge's parameters with npu_ge's meanings, on the simulated NPU and on the real shim
against the strict fake pyACL: `instance_exec_blocks` splits one batch across that many
graphs in one execute call, `static_model` compiles batch 1 and loops over the batch, and
GE_NPU_CONFIG's global GE options take the place of --backend-config's."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fake_acl import FakeAcl, build_module
from ge_helpers import (
    EXAMPLES,
    FAKE_ATC_BIN,
    SIMPLE_IO,
    ge_runtime,
    make_model,
    params,
    simple_inputs,
    spec_for,
)

from ge_serve.backends.ge.acl import AclRuntime
from ge_serve.backends.ge.acl_real import AclReal
from ge_serve.backends.ge.backend import GeBackend
from ge_serve.backends.ge.blocks import GeBlocks, split_rows
from ge_serve.backends.ge.compile import AtcCompiler

pytestmark = pytest.mark.timeout(120)
SIMPLE_ONNX = EXAMPLES / "simple" / "1" / "model.onnx"


@pytest.fixture(params=["sim", "fake-acl"])
def runtime(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[AclRuntime]:
    yield from ge_runtime(request.param, tmp_path, monkeypatch)


def simple(repo: Path, extra: str) -> Path:
    return make_model(repo, "simple", "max_batch_size: 8\n" + SIMPLE_IO + extra, SIMPLE_ONNX)


def check(outputs: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> None:
    np.testing.assert_array_equal(outputs["OUTPUT0"], inputs["INPUT0"] + inputs["INPUT1"])
    np.testing.assert_array_equal(outputs["OUTPUT1"], inputs["INPUT0"] - inputs["INPUT1"])


def test_split_rows_spreads_a_batch_evenly() -> None:
    assert split_rows(5, 2) == [3, 2]
    assert split_rows(1, 3) == [1]
    assert split_rows(8, 4) == [2, 2, 2, 2]


def test_instance_exec_blocks_splits_each_batch_across_that_many_graphs(
    runtime: AclRuntime, tmp_path: Path
) -> None:
    backend = GeBackend(runtime, cores=1)
    loaded = backend.load(spec_for(simple(tmp_path, params(instance_exec_blocks="2"))))
    try:
        # One slot (one instance) of two graphs, each a model copy on its own stream.
        (slot,) = loaded.executors
        assert isinstance(slot, GeBlocks) and len(slot.graphs) == 2
        assert {g.slot.stream for g in slot.graphs} == {0, 1}
        assert loaded.gears == ()  # any batch: each part is padded to a gear of its graph
        # The load's accuracy check ran two batch-1 inputs on the first graph.
        assert [s["by_gear"] for s in slot.pool_stats()] == [{1: 2}, {}]
        for batch in (5, 8, 1):
            inputs = simple_inputs(batch, seed=batch)
            check(slot.execute(inputs), inputs)
        # 5 rows: 3 (padded to gear 4) and 2; 8 rows: 4 and 4; 1 row: one graph only.
        stats = slot.pool_stats()
        assert stats[0]["by_gear"] == {4: 2, 1: 3} and stats[1]["by_gear"] == {2: 1, 4: 1}
        (device,) = backend.device_metrics()
        assert device.executions == 2 + 5
    finally:
        loaded.close()


def test_static_model_runs_batch_one_graphs_over_a_dynamic_batch(
    runtime: AclRuntime, tmp_path: Path
) -> None:
    loaded = GeBackend(runtime, cores=1).load(spec_for(simple(tmp_path, params(static_model="1"))))
    try:
        assert loaded.gears == ()
        inputs = simple_inputs(3)
        check(loaded.executors[0].execute(inputs), inputs)
        # Two batch-1 runs of the load's accuracy check, then one per row.
        assert loaded.executors[0].pool_stats()["by_gear"] == {1: 2 + 3}  # type: ignore[attr-defined]
    finally:
        loaded.close()


def test_ge_npu_config_reaches_atc_in_place_of_backend_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{FAKE_ATC_BIN}:{os.environ['PATH']}")
    log = tmp_path / "atc.log"
    monkeypatch.setenv("FAKE_ATC_LOG", str(log))
    fake = FakeAcl(soc="Ascend310P3")
    real = AclReal(build_module(fake), AtcCompiler(tmp_path / "om"))
    environ = {"GE_NPU_CONFIG": json.dumps({"ge.exec.precision_mode": "force_fp32"})}
    backend = GeBackend(real, {"ge.exec.precision_mode": "force_fp16"}, cores=1, environ=environ)
    try:
        backend.load(spec_for(simple(tmp_path, ""))).close()
        (argv,) = [json.loads(line) for line in log.read_text().splitlines()]
        assert "--precision_mode=force_fp32" in argv
        bad = GeBackend(real, {}, cores=1, environ={"GE_NPU_CONFIG": "{oops"})
        with pytest.raises(ValueError, match="GE_NPU_CONFIG is not JSON"):
            bad.load(spec_for(simple(tmp_path / "again", "")))
    finally:
        real.shutdown()
    assert fake.leaks() == [] and fake.violations == []
