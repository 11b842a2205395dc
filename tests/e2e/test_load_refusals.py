"""Configs Triton refuses to load, refused by ge-serve with Triton's exact reason
(model_config_utils.cc): in the repository index and in the log, while every other model
serves."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pymodels
import pytest
from modelgen import add_sub_model, write_model
from serverproc import ServerProcess, running_server, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PYTHON_IO = """
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
CACHE = "response_cache { enable: true }"
DECOUPLED = "model_transaction_policy { decoupled: true }"

# model name -> Triton's reason, exactly
REFUSED = {
    "stream_cached": (
        "Response Cache does not currently support model stream_cached with 'decoupled' "
        "transaction policy. Please disable the response cache."
    ),
    # Decoupled by its auto_complete_config, not by config.pbtxt.
    "auto_stream_cached": (
        "Response Cache does not currently support model auto_stream_cached with "
        "'decoupled' transaction policy. Please disable the response cache."
    ),
    # Decoupled by its step, which only the ensemble's plan finds out.
    "stream_ensemble_cached": (
        "Response Cache does not currently support model stream_ensemble_cached with "
        "'decoupled' transaction policy. Please disable the response cache."
    ),
    "ensemble_with_backend": (
        "Ensemble model 'ensemble_with_backend' must have platform type 'ensemble' and empty "
        "backend type"
    ),
    "negative_batch": "'max_batch_size' must be non-negative value for negative_batch",
    "batch_input_int64": "batch input data type must be TYPE_INT32 or TYPE_FP32 for "
    "batch_input_int64",
    "batch_input_unknown": "unknown source input name 'NOPE' for batch_input_unknown",
    "batch_input_two_sources": "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source "
    "input, got 2 for batch_input_two_sources",
    "batch_output_unknown": "unknown source input name 'NOPE' for batch_output_unknown",
}
# Each batch input model: its batch_input's data type and source inputs.
BATCH_INPUTS = {
    "batch_input_int64": ("TYPE_INT64", '"IN"'),
    "batch_input_unknown": ("TYPE_INT32", '"NOPE"'),
    "batch_input_two_sources": ("TYPE_INT32", '"IN", "IN"'),
}
# Never run: each model using it is refused at load.
UNUSED = """
class TritonPythonModel:
    def execute(self, requests):
        return []
"""
# Valid but for its backend.
ENSEMBLE_WITH_BACKEND = """
name: "ensemble_with_backend"
platform: "ensemble"
backend: "python"
max_batch_size: 4
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ {
  model_name: "good" model_version: -1
  input_map { key: "A" value: "A" } input_map { key: "B" value: "B" }
  output_map { key: "SUM" value: "SUM" }
} ] }
"""

STREAM_ENSEMBLE_CACHED = f"""
name: "stream_ensemble_cached"
platform: "ensemble"
{PYTHON_IO}
{CACHE}
ensemble_scheduling {{ step [ {{
  model_name: "square_step" model_version: -1
  input_map {{ key: "IN" value: "IN" }} output_map {{ key: "OUT" value: "OUT" }}
}} ] }}
"""


def python_config(name: str, body: str) -> str:
    return f'name: "{name}"\nbackend: "python"\n{body}\n'


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("refused")
    write_model(repo, "good", add_sub_model(("batch", 4)))
    pymodels.write_model(
        repo,
        "stream_cached",
        pymodels.SQUARE,
        python_config("stream_cached", f"{DECOUPLED}\n{PYTHON_IO}\n{CACHE}"),
    )
    decoupling = 'config.set_model_transaction_policy({"decoupled": True})'
    pymodels.write_auto_complete(repo, "auto_stream_cached", 0, decoupling)
    (repo / "auto_stream_cached" / "config.pbtxt").write_text(
        python_config("auto_stream_cached", CACHE)
    )
    write_model(repo, "ensemble_with_backend", None, ENSEMBLE_WITH_BACKEND)
    step = python_config("square_step", f"{DECOUPLED}\n{PYTHON_IO}")
    pymodels.write_model(repo, "square_step", pymodels.SQUARE, step)
    write_model(repo, "stream_ensemble_cached", None, STREAM_ENSEMBLE_CACHED)
    negative = python_config("negative_batch", f"max_batch_size: -1\n{PYTHON_IO}")
    pymodels.write_model(repo, "negative_batch", UNUSED, negative)
    for name, (data_type, sources) in BATCH_INPUTS.items():
        batch_input = (
            f'batch_input [ {{ kind: BATCH_ELEMENT_COUNT target_name: "N" '
            f"data_type: {data_type} source_input: [ {sources} ] }} ]"
        )
        body = f"max_batch_size: 4\n{PYTHON_IO}\n{batch_input}\ndynamic_batching {{ }}"
        pymodels.write_model(repo, name, UNUSED, python_config(name, body))
    batch_output = (
        'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUT" '
        'source_input: "NOPE" } ]'
    )
    body = f"max_batch_size: 4\n{PYTHON_IO}\n{batch_output}\ndynamic_batching {{ }}"
    config = python_config("batch_output_unknown", body)
    pymodels.write_model(repo, "batch_output_unknown", UNUSED, config)
    extra = ["--exit-on-error=false", "--cache-config=local,size=1048576"]
    with running_server([repo], extra, wait_ready=False) as proc:
        # Not ready (strict readiness: some models are unavailable), but live and serving.
        wait_for(proc, "/v2/health/live", 60)
        yield proc


@pytest.mark.parametrize("name", list(REFUSED))
def test_the_index_and_the_log_give_tritons_reason(refusing: ServerProcess, name: str) -> None:
    rows = httpx.post(refusing.base_url + "/v2/repository/index", timeout=10).json()
    (row,) = [row for row in rows if row["name"] == name]
    assert (row["state"], row.get("reason")) == ("UNAVAILABLE", REFUSED[name]), row
    log = refusing.log()
    assert f"failed to load '{name}': {REFUSED[name]}" in log, log


def test_the_other_models_serve(refusing: ServerProcess) -> None:
    body = {
        "inputs": [
            {"name": "A", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": [4, 3, 2, 1]},
        ]
    }
    response = httpx.post(refusing.base_url + "/v2/models/good/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs == {"SUM": [5, 5, 5, 5], "DIFF": [-3, -1, 1, 3]}
    rows = httpx.post(refusing.base_url + "/v2/repository/index", json={"ready": True}).json()
    assert [row["name"] for row in rows] == ["good", "square_step"]
