"""Broken models at startup: each is UNAVAILABLE with its reason in the log and in the
repository index; --exit-on-error decides whether the rest serve or the process exits."""

from __future__ import annotations

import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from modelgen import add_sub_model, write_model
from serverproc import ServerProcess, running_server, start_server, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# model name -> what its reason must say
BROKEN = {
    "bad_pbtxt": "failed to parse config.pbtxt",
    "missing_file": "model.onnx' does not exist",
    "invalid_onnx": "failed to parse ONNX file",
    "misnamed": "does not match the model folder name",
    "no_version": "no version folder",
    "latin1_value": "failed to parse config.pbtxt: 2:10 : a string value is not valid UTF-8",
}
# Bytes that are not UTF-8 in a comment and a labels file, which Triton reads as bytes.
LATIN1_CONFIG = (
    b'# Mod\xe8le fran\xe7ais\nname: "latin1"\nmax_batch_size: 4\n'
    b'output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]\n'
)


@pytest.fixture(scope="module")
def broken_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("broken")
    model = add_sub_model(("batch", 4))
    write_model(repo, "good", model)
    write_model(repo, "bad_pbtxt", model, 'name: "bad_pbtxt"\nmax_batch_size: [oops\n')
    write_model(repo, "missing_file", None, 'name: "missing_file"\n')
    write_model(repo, "invalid_onnx", b"\x08\x07 this is not a model")
    write_model(repo, "misnamed", model, 'name: "another_name"\n')
    write_model(repo, "no_version", model, versions=["0", "latest"])
    write_model(repo, "latin1_value", model)
    (repo / "latin1_value" / "config.pbtxt").write_bytes(b'name: "latin1_value"\nbackend: "\xe8"\n')
    (write_model(repo, "latin1", model) / "config.pbtxt").write_bytes(LATIN1_CONFIG)
    (repo / "latin1" / "labels.txt").write_bytes(b"a\nb\ncaf\xe9\nd\n")
    return repo


@pytest.fixture(scope="module")
def tolerant(broken_repo: Path) -> Iterator[ServerProcess]:
    with running_server([broken_repo], ["--exit-on-error=false"], wait_ready=False) as proc:
        # Not ready (strict readiness: some models are unavailable), but live and serving.
        wait_for(proc, "/v2/health/live", 60)
        yield proc


def test_other_models_serve(tolerant: ServerProcess) -> None:
    body = {
        "inputs": [
            {"name": "A", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
            {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": [4, 3, 2, 1]},
        ]
    }
    response = httpx.post(tolerant.base_url + "/v2/models/good/infer", json=body)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    assert outputs == {"SUM": [5, 5, 5, 5], "DIFF": [-3, -1, 1, 3]}
    assert httpx.get(tolerant.base_url + "/v2/models/good/ready").status_code == 200


def test_repository_index_has_the_reasons(tolerant: ServerProcess) -> None:
    rows = httpx.post(tolerant.base_url + "/v2/repository/index").json()
    by_name = {row["name"]: row for row in rows}
    assert sorted(by_name) == sorted([*BROKEN, "good", "latin1"])
    assert by_name["good"]["state"] == by_name["latin1"]["state"] == "READY"
    for name, reason in BROKEN.items():
        assert by_name[name]["state"] == "UNAVAILABLE", by_name[name]
        assert reason in by_name[name]["reason"], by_name[name]
    ready = httpx.post(tolerant.base_url + "/v2/repository/index", json={"ready": True}).json()
    assert [row["name"] for row in ready] == ["good", "latin1"]


def test_labels_that_are_not_utf8_come_back_as_they_are(tolerant: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(tolerant.http_url)
    try:
        inputs = [httpclient.InferInput(name, [1, 4], "FP32") for name in ("A", "B")]
        inputs[0].set_data_from_numpy(np.array([[0, 0, 5, 0]], np.float32))
        inputs[1].set_data_from_numpy(np.zeros((1, 4), np.float32))
        top = httpclient.InferRequestedOutput("SUM", binary_data=True, class_count=1)
        result = client.infer("latin1", inputs, outputs=[top])
        assert result.as_numpy("SUM").tolist() == [[b"5.000000:2:caf\xe9"]]
    finally:
        client.close()


def test_log_has_the_reasons(tolerant: ServerProcess) -> None:
    log = tolerant.log()
    for name, reason in BROKEN.items():
        lines = [line for line in log.splitlines() if f"'{name}'" in line and reason in line]
        assert lines, f"no log line names {name} with its reason:\n{log}"
        # And the startup table shows it.
        assert any(
            line.startswith(name) and "UNAVAILABLE" in line and reason in line
            for line in log.splitlines()
        ), log


def test_broken_models_are_not_ready_and_refuse_requests(tolerant: ServerProcess) -> None:
    base = tolerant.base_url
    assert httpx.get(base + "/v2/health/ready").status_code == 400
    assert httpx.get(base + "/v2/health/live").status_code == 200
    for name in BROKEN:
        # No READY version: Triton's GetModel NOT_FOUND, as inference below.
        assert httpx.get(f"{base}/v2/models/{name}/ready").status_code == 404
        response = httpx.post(f"{base}/v2/models/{name}/infer", json={"inputs": []})
        # Triton's ModelLifeCycle::GetModel: no READY version is NOT_FOUND.
        assert response.status_code == 404, response.text
        assert response.json()["error"] == (
            f"Request for unknown model: '{name}' has no available versions"
        )


def test_not_strict_readiness_is_ready(broken_repo: Path) -> None:
    extra = ["--exit-on-error=false", "--strict-readiness=false"]
    with running_server([broken_repo], extra) as proc:
        assert httpx.get(proc.base_url + "/v2/health/ready").status_code == 200


def test_exit_on_error_fails_startup_naming_the_models(broken_repo: Path) -> None:
    proc = start_server([broken_repo], wait_ready=False)
    try:
        rc = proc.process.wait(60)
        log = proc.log()
        assert rc != 0, log
        for name in BROKEN:  # once, as it failed; then in the table and the exit line
            assert log.count(f"failed to load '{name}'") == 1, log
        exiting = next(line for line in log.splitlines() if "exiting:" in line)
        assert all(name in exiting for name in BROKEN), exiting
        assert "--exit-on-error=false" in log
        assert "Started HTTPService" not in log
    finally:
        proc.stop(signal.SIGKILL)
        shutil.rmtree(proc.log_path.parent, ignore_errors=True)
