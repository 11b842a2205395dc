"""A Python model loaded through the load API as Triton's qa model_control test loads it:
the `file:/1/model.py` key, and model names python_backend refuses for its stub."""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Iterator

import httpx
import pytest
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

SOURCE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            given = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", given)]))
        return responses
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("empty-repo")
    with running_server([repo], ["--model-control-mode=explicit"]) as proc:
        yield proc


def load(server: ServerProcess, name: str, key: str = "file:/1/model.py") -> httpx.Response:
    config = {
        "name": name,
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    body = {
        "parameters": {
            "config": json.dumps(config),
            key: base64.b64encode(SOURCE.encode()).decode(),
        }
    }
    quoted = urllib.parse.quote(name, safe="")
    url = f"{server.base_url}/v2/repository/models/{quoted}/load"
    return httpx.post(url, json=body, timeout=60)


@pytest.mark.parametrize("name", ["TestModel123", "model-with-hyphens", "model_with_underscores"])
def test_a_leading_slash_in_the_file_key_is_the_model_folder(
    server: ServerProcess, name: str
) -> None:
    loaded = load(server, name)
    assert loaded.status_code == 200, loaded.text
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
    answered = httpx.post(f"{server.base_url}/v2/models/{name}/infer", json=body)
    assert answered.json()["outputs"][0]["data"] == [1.0, 2.0]


# A backslash is refused before this check, as a path character in a model name.
@pytest.mark.parametrize("char", list(";|&$`<>()\"'*~!"))
def test_a_name_python_backend_cannot_start_a_stub_for_is_refused(
    server: ServerProcess, char: str
) -> None:
    name = f"model{char}test"
    refused = load(server, name)
    assert refused.status_code == 400, refused.text
    assert "Invalid stub name: contains invalid characters" in refused.json()["error"]
    ready = httpx.get(f"{server.base_url}/v2/models/{urllib.parse.quote(name, safe='')}/ready")
    assert ready.status_code != 200
