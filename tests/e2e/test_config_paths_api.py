"""The load API refuses config paths that lead out of the model folder, over HTTP and gRPC,
and nothing outside reaches a response or the log (see tests/component/test_config_paths.py
for every field and form, in process)."""

from __future__ import annotations

import base64
import json
import os
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient
from modelgen import add_const_model, identity_model, write_model
from onnx import TensorProto
from serverproc import running_server
from swapmodels import ADDK, write_addk
from tritonclient.utils import InferenceServerException

INSIDE = "must name a file inside the model folder"
MODEL = identity_model(TensorProto.FLOAT, ("batch", 3))
BASE = 'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 2\n'


# --- through the load API ------------------------------------------------------------------


def _load_cases(repo: Path, secret: Path) -> list[tuple[str, dict[str, Any]]]:
    """(what the reason names, a JSON ModelConfig) for configs the load API gets."""
    base: dict[str, Any] = {
        "name": ADDK,
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    }

    def with_label(value: str) -> dict[str, Any]:
        output = {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}
        return dict(base, output=[dict(output, label_filename=value)])

    warmup_input = {"data_type": "TYPE_FP32", "dims": [4], "input_data_file": str(secret)}
    warmup = [{"name": "w", "batch_size": 1, "inputs": {"INPUT0": warmup_input}}]
    deep = "../" * (len(repo.resolve().parts) + 2)
    return [
        ("label_filename '/proc/self/environ'", with_label("/proc/self/environ")),
        (f"label_filename '{deep}proc/self/environ'", with_label(f"{deep}proc/self/environ")),
        (f"label_filename '{secret}'", with_label(str(secret))),
        (f"default_model_filename '{secret}'", dict(base, default_model_filename=str(secret))),
        (f"input_data_file '{secret}'", dict(with_label("labels.txt"), model_warmup=warmup)),
    ]


@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_the_load_api_refuses_paths_out_of_the_folder(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    repo = tmp_path / "repo"
    write_addk(repo, [1])
    outside = tmp_path_factory.mktemp("outside")
    token = f"SECRET-{uuid.uuid4().hex}"
    secret = outside / "secret.txt"
    secret.write_text(token)
    linked = write_model(repo, "linked", None, BASE.replace('"m"', '"linked"'))
    (linked / "1" / "model.onnx").write_bytes(MODEL.SerializeToString())
    (linked / "config.pbtxt").write_text(
        BASE.replace('"m"', '"linked"') + 'output [ { name: "OUTPUT" label_filename: "l" } ]'
    )
    os.symlink(secret, linked / "l")
    private = tmp_path / "server-tmp"
    private.mkdir()
    extra = ["--model-control-mode=explicit", f"--load-model={ADDK}"]
    env = {"TMPDIR": str(private), "GE_SERVE_TEST_SECRET": token}
    with running_server([repo], extra, env=env) as server:
        seen: list[str] = []
        url = f"{server.base_url}/v2/repository/models"
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        model = base64.b64encode(add_const_model(7.0).SerializeToString()).decode()
        try:
            for what, config in _load_cases(repo, secret):
                text = json.dumps(config)
                for files in ({}, {"file:1/model.onnx": model}):
                    body = {"parameters": {"config": text, **files}}
                    response = httpx.post(f"{url}/{ADDK}/load", json=body, timeout=30)
                    assert response.status_code == 400, response.text
                    error = response.json()["error"]
                    assert f"{what} " in error and INSIDE in error, error
                    seen.append(response.text)
                    raw = {k: base64.b64decode(v) for k, v in files.items()}
                    with pytest.raises(InferenceServerException) as caught:
                        grpc.load_model(ADDK, config=text, files=raw or None)
                    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
                    assert what in str(caught.value.message()) and INSIDE in str(
                        caught.value.message()
                    )
                    seen.append(str(caught.value.message()))
            # From the repository, without a config in the request: a link pointing out.
            response = httpx.post(f"{url}/linked/load", timeout=30)
            assert response.status_code == 400
            assert "label_filename 'l' of output 'OUTPUT'" in response.json()["error"]
            assert "symbolic link" in response.json()["error"]
            seen.append(response.text)
            index = httpx.post(f"{server.base_url}/v2/repository/index", timeout=30)
            seen.append(index.text)
            # A failed load leaves the model serving, and no override folder behind.
            infer = {
                "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]
            }
            infer_url = f"{server.base_url}/v2/models/{ADDK}/infer"
            served = httpx.post(infer_url, json=infer, timeout=30)
            assert served.json()["outputs"][0]["data"] == [1.0] * 4
            assert list(private.glob("ge-serve-*")) == []
        finally:
            grpc.close()
        log = server.log()
    for text in [*seen, log]:
        assert token not in text
    assert "label_filename '/proc/self/environ'" in log
