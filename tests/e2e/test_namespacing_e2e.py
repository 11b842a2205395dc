"""`--model-namespacing=true`: two repositories with a same-named model, each with an
ensemble over it, served by the real ge-serve process and tritonclient."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from modelgen import add_const_model, write_model
from prometheus_client.parser import text_string_to_metric_families
from protocols import PROTOCOLS, Triton
from serverproc import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

AMBIGUOUS = (
    "There are 2 identifiers of model 'calc' in global map, model namespace must be "
    "provided to resolve ambiguity."
)

CALC = """
name: "calc"
backend: "onnxruntime"
max_batch_size: 8
"""


def ensemble(name: str) -> str:
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
ensemble_scheduling {{
  step [ {{
    model_name: "calc"
    model_version: -1
    input_map {{ key: "INPUT0" value: "IN" }}
    output_map {{ key: "OUTPUT0" value: "OUT" }}
  }} ]
}}
"""


def write_repo(root: Path, constant: float, ensemble_name: str) -> Path:
    write_model(root, "calc", add_const_model(constant), CALC)
    write_model(root, ensemble_name, None, ensemble(ensemble_name))
    return root


@pytest.fixture(scope="module")
def namespaced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    plus = write_repo(tmp_path_factory.mktemp("plus"), 100.0, "ens_plus")
    minus = write_repo(tmp_path_factory.mktemp("minus"), -100.0, "ens_minus")
    with running_server([plus, minus], ["--model-namespacing=true"]) as server:
        yield server


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_ensemble_runs_its_own_namespace_model(
    protocol: str, namespaced: ServerProcess
) -> None:
    triton = Triton.connect(protocol, namespaced)
    try:
        data = np.arange(8, dtype=np.float32).reshape(2, 4)
        plus = triton.infer("ens_plus", {"IN": data}).as_numpy("OUT")
        minus = triton.infer("ens_minus", {"IN": data}).as_numpy("OUT")
        np.testing.assert_array_equal(plus, data + 100)
        np.testing.assert_array_equal(minus, data - 100)
    finally:
        triton.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_shared_name_is_refused_with_tritons_message(
    protocol: str, namespaced: ServerProcess
) -> None:
    triton = Triton.connect(protocol, namespaced)
    try:
        data = np.zeros((1, 4), dtype=np.float32)
        with pytest.raises(InferenceServerException) as infer:
            triton.infer("calc", {"INPUT0": data})
        assert AMBIGUOUS in str(infer.value)
        if protocol == "grpc":
            assert infer.value.status() == "StatusCode.INVALID_ARGUMENT"
        else:
            assert infer.value.status() == "400"
        with pytest.raises(InferenceServerException) as metadata:
            triton.client.get_model_metadata("calc")
        assert AMBIGUOUS in str(metadata.value)
        with pytest.raises(InferenceServerException) as config:
            triton.client.get_model_config("calc")
        assert AMBIGUOUS in str(config.value)
        assert not triton.client.is_model_ready("calc")
        # The index lists each model by its name, once per namespace, as Triton does.
        if protocol == "http":
            index = triton.client.get_model_repository_index()
        else:
            index = triton.client.get_model_repository_index(as_json=True)["models"]
        names = sorted(entry["name"] for entry in index)
        assert names == ["calc", "calc", "ens_minus", "ens_plus"]
    finally:
        triton.close()


def calc_counts(server: ServerProcess) -> dict[str | None, float]:
    text = httpx.get(server.metrics_url, timeout=30).text
    families = list(text_string_to_metric_families(text))  # a duplicate series raises
    return {
        sample.labels.get("namespace"): sample.value
        for family in families
        if family.name == "nv_inference_count"
        for sample in family.samples
        if sample.labels["model"] == "calc"
    }


def test_each_namespaces_model_has_metric_series_of_its_own(namespaced: ServerProcess) -> None:
    # Without the namespace label the two `calc` models wrote identical series: an
    # exposition Prometheus rejects, and no way to tell them apart.
    before = calc_counts(namespaced)
    assert len(before) == 2 and None not in before, before
    triton = Triton.connect("http", namespaced)
    try:
        triton.infer("ens_plus", {"IN": np.zeros((1, 4), dtype=np.float32)})
    finally:
        triton.close()
    after = calc_counts(namespaced)
    grew = sorted(after[space] - before[space] for space in before)
    assert grew == [0.0, 1.0], "only the plus namespace's calc ran"
