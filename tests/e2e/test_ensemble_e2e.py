"""Ensembles over the wire: the real ge-serve process and tritonclient, HTTP and gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from ensemblerepo import write_pipelines
from protocols import PROTOCOLS, Triton
from serverproc import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`none` mode: the whole repository loads, ensembles after their models."""
    repo = write_pipelines(tmp_path_factory.mktemp("pipelines"))
    with running_server([repo]) as server:
        yield server


def model_stats(triton: Triton, name: str) -> dict[str, Any]:
    if triton.protocol == "http":
        found = triton.client.get_inference_statistics(name)
    else:
        found = triton.client.get_inference_statistics(name, as_json=True)
    (entry,) = found["model_stats"]
    return dict(entry)


def count(entry: dict[str, Any], key: str) -> int:
    # gRPC's JSON leaves zero counts out and prints 64-bit integers as strings.
    return int(entry.get(key, 0))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_diamond_answers_and_each_model_counts_it(
    protocol: str, pipelines: ServerProcess
) -> None:
    triton = Triton.connect(protocol, pipelines)
    try:
        before = {n: model_stats(triton, n) for n in ("diamond", "add1", "add10", "add_sub")}
        data = np.arange(12, dtype=np.float32).reshape(3, 4)
        result = triton.infer("diamond", {"IN": data})
        np.testing.assert_array_equal(result.as_numpy("SUM"), 2 * data + 11)
        np.testing.assert_array_equal(result.as_numpy("DIFF"), np.full((3, 4), -9))
        only = triton.infer("diamond", {"IN": data}, outputs=["DIFF"])
        assert only.as_numpy("SUM") is None

        for name, old in before.items():
            new = model_stats(triton, name)
            assert count(new, "inference_count") - count(old, "inference_count") == 6
            assert count(new, "execution_count") - count(old, "execution_count") == 2
        diamond = model_stats(triton, "diamond")
        assert [count(b, "batch_size") for b in diamond["batch_stats"]] == [3]

        metadata = triton.client.get_model_metadata("diamond")
        platform = metadata["platform"] if protocol == "http" else metadata.platform
        assert platform == "ensemble"
        if protocol == "http":
            config = triton.client.get_model_config("diamond")
        else:
            config = triton.client.get_model_config("diamond", as_json=True)["config"]
        assert len(config["ensemble_scheduling"]["step"]) == 3
        assert not config.get("instance_group")
    finally:
        triton.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bad_request_to_an_ensemble_is_refused_as_for_any_model(
    protocol: str, pipelines: ServerProcess
) -> None:
    triton = Triton.connect(protocol, pipelines)
    try:
        with pytest.raises(InferenceServerException) as caught:
            triton.infer("chain", {"IN": np.ones((1, 5), np.float32)})
        triton.expect_error(caught.value, "INVALID_ARGUMENT", "unexpected shape for input 'IN'")
    finally:
        triton.close()


def test_explicit_mode_loads_and_unloads_an_ensemble_with_its_models(tmp_path: Path) -> None:
    repo = write_pipelines(tmp_path / "repo")
    with running_server([repo], ["--model-control-mode=explicit"]) as server:
        http = Triton.connect("http", server)
        grpc = Triton.connect("grpc", server)
        try:
            http.client.load_model("chain")
            assert all(http.client.is_model_ready(n) for n in ("chain", "add1", "add10"))
            out = grpc.infer("chain", {"IN": np.ones((2, 4), np.float32)}).as_numpy("OUT")
            np.testing.assert_array_equal(out, np.full((2, 4), 12))

            # Unloading a step model takes the ensemble down, and loading it brings it back.
            grpc.client.unload_model("add10")
            index = {r["name"]: r for r in http.client.get_model_repository_index()}
            assert index["chain"]["state"] == "UNAVAILABLE"
            assert index["chain"]["reason"] == (
                "ensemble 'chain' depends on 'add10' which has no loaded version."
            )
            grpc.client.load_model("add10")
            assert http.client.is_model_ready("chain")

            # add1 came along with chain; add10 was loaded on its own just now.
            grpc.client.unload_model("chain", unload_dependents=True)
            ready = [http.client.is_model_ready(n) for n in ("chain", "add1", "add10")]
            assert ready == [False, False, True]
        finally:
            http.close()
            grpc.close()
