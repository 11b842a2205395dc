"""The repository API over gRPC with tritonclient.grpc: index, load (with config and file
overrides as bytes_param), unload, and the errors the core gives, each as its gRPC status."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from modelgen import add_const_model
from serverproc import ServerProcess, running_server
from swapmodels import ADDK, WIDTH, write_addk
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CONFIG = {
    "name": ADDK,
    "backend": "onnxruntime",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
}


def addk(client: grpcclient.InferenceServerClient) -> tuple[str, float]:
    inputs = [grpcclient.InferInput("INPUT0", [1, WIDTH], "FP32")]
    inputs[0].set_data_from_numpy(np.zeros((1, WIDTH), np.float32))
    result = client.infer(ADDK, inputs)
    return result.get_response().model_version, float(result.as_numpy("OUTPUT0")[0, 0])


def test_none_mode_refuses_load_and_unload(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for call in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as caught:
                call("simple")
            assert caught.value.status() == "StatusCode.UNAVAILABLE"
            assert "not allowed" in caught.value.message()
        assert client.is_model_ready("simple")
    finally:
        client.close()


def test_load_unload_and_overrides(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_addk(repo, [1, 2])
    private = tmp_path / "server-tmp"
    private.mkdir()
    extra = ["--model-control-mode=explicit", f"--load-model={ADDK}"]
    with running_server([repo], extra, env={"TMPDIR": str(private)}) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            index = client.get_model_repository_index()
            assert {(m.name, m.version, m.state) for m in index.models} >= {(ADDK, "2", "READY")}
            assert addk(client) == ("2", 2.0)

            client.unload_model(ADDK, unload_dependents=True)
            assert not client.is_model_ready(ADDK)
            client.load_model(ADDK)
            assert addk(client) == ("2", 2.0)

            config = dict(CONFIG, version_policy={"specific": {"versions": [1]}})
            client.load_model(ADDK, config=json.dumps(config))
            assert addk(client) == ("1", 1.0)

            model = add_const_model(50.0).SerializeToString()
            client.load_model(ADDK, config=json.dumps(CONFIG), files={"file:5/model.onnx": model})
            assert addk(client) == ("5", 50.0)

            with pytest.raises(InferenceServerException) as caught:
                client.load_model(ADDK, files={"file:5/model.onnx": model})
            assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "'config' parameter is required" in caught.value.message()
            with pytest.raises(InferenceServerException) as caught:
                client.load_model(ADDK, config='{"max_batch_size": "many"}')
            assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "not a valid JSON ModelConfig" in caught.value.message()
            with pytest.raises(InferenceServerException) as caught:
                client.load_model("no_such_model")
            assert "failed to load" in caught.value.message()
            assert addk(client) == ("5", 50.0)  # failed loads leave it serving
        finally:
            client.close()
