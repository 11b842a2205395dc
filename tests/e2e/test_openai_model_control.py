"""Triton's OpenAI front end's `POST /v1/models/{model}/load` and `/unload`, over raw
HTTP: its answers, statuses and words, in OpenAI's error object, over the model control
the v2 repository API uses."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import httpx
import pymodels
import pytest
import textgen
from serverproc import ServerProcess, running_server, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

EXPLICIT_ONLY = "Model load/unload requires --model-control-mode=explicit"
ADMIN = {"admin": "s3cret"}
BROKEN = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("broken on purpose")
"""
BROKEN_CONFIG = """name: "broken"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = textgen.write(tmp_path_factory.mktemp("openai-model-control"))
    pymodels.write_model(repo, "broken", BROKEN, BROKEN_CONFIG)
    return repo


@pytest.fixture(scope="module")
def explicit(repo: Path) -> Iterator[ServerProcess]:
    extra = ["--model-control-mode=explicit", "--http-restricted-api=model-repository:admin=s3cret"]
    with running_server([repo], extra) as server:
        yield server


@pytest.fixture
def http(explicit: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=explicit.base_url, headers=ADMIN, timeout=60) as client:
        yield client
        for name in ("textgen", "embedder"):  # each test starts with nothing loaded
            client.post(f"/v2/repository/models/{name}/unload")


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def listed(http: httpx.Client) -> list[str]:
    return [model["id"] for model in http.get("/v1/models").json()["data"]]


def test_load_then_unload(http: httpx.Client) -> None:
    assert listed(http) == []
    loaded = http.post("/v1/models/textgen/load")
    assert loaded.status_code == 200, loaded.text
    model = loaded.json()
    assert (model["id"], model["object"]) == ("textgen", "model")
    assert model["created"] > 0 and model["owned_by"]
    assert listed(http) == ["textgen"]
    assert http.get("/v2/models/textgen/ready").status_code == 200
    completion = http.post("/v1/completions", json={"model": "textgen", "prompt": "hi"})
    assert completion.status_code == 200, completion.text

    error = error_of(http.post("/v1/models/textgen/load"), 400)
    assert error["message"] == "Model 'textgen' is already loaded"

    unloaded = http.post("/v1/models/textgen/unload")
    assert unloaded.status_code == 200, unloaded.text
    assert unloaded.json() == {"status": "success", "model": "textgen"}
    assert listed(http) == []
    assert http.get("/v2/models/textgen/ready").status_code != 200
    assert error_of(http.get("/v1/models/textgen"), 404)["code"] == "model_not_found"

    error = error_of(http.post("/v1/models/textgen/unload"), 400)
    assert error["message"] == "Unknown model: textgen"


def test_unknown_and_failing_models(http: httpx.Client, explicit: ServerProcess) -> None:
    port = explicit.http_port
    error = error_of(http.post("/v1/models/unknown_model/load"), 400)
    assert error["message"].startswith("Failed to load model 'unknown_model': ")
    assert "failed to poll from model repository" in error["message"]
    assert error_of(http.post("/v1/models/unknown_model/unload"), 400)["message"] == (
        "Unknown model: unknown_model"
    )
    # A model whose own initialize fails: the status v2 gives the same failure.
    failed = http.post("/v1/models/broken/load")
    v2 = http.post("/v2/repository/models/broken/load")
    error = error_of(failed, v2.status_code)
    assert error["message"].startswith("Failed to load model 'broken': ")
    assert "broken on purpose" in error["message"]
    # Bad names are bad requests, never a 500; a name with a slash has no route. Sent
    # as written (httpx would resolve the `..`).
    for name, status in (("..", 400), ("%20%20", 400), ("%0A%09", 400), ("a/b", 404)):
        for verb in ("load", "unload"):
            connection = HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                connection.request("POST", f"/v1/models/{name}/{verb}", headers=ADMIN)
                response = connection.getresponse()
                assert response.status == status, (name, verb, response.read())
            finally:
                connection.close()
    assert http.get("/v2/health/live").status_code == 200


def test_of_concurrent_loads_or_unloads_of_a_model_one_succeeds(http: httpx.Client) -> None:
    def post(verb: str) -> list[int]:
        with ThreadPoolExecutor(5) as pool:
            answers = pool.map(lambda _: http.post(f"/v1/models/textgen/{verb}"), range(5))
            return sorted(answer.status_code for answer in answers)

    assert post("load") == [200, 400, 400, 400, 400]
    assert listed(http) == ["textgen"]
    assert post("unload") == [200, 400, 400, 400, 400]
    assert listed(http) == []


def test_they_are_in_the_model_repository_category(explicit: ServerProcess) -> None:
    for verb in ("load", "unload"):
        response = httpx.post(f"{explicit.base_url}/v1/models/textgen/{verb}", timeout=30)
        error = error_of(response, 401)
        assert (
            error["message"] == "This API is restricted, expecting header 'admin' with valid value"
        )
    # /v1/models stays in `metadata`, which is not restricted here.
    assert httpx.get(f"{explicit.base_url}/v1/models", timeout=30).status_code == 200


def test_without_explicit_model_control_they_are_refused(repo: Path) -> None:
    with running_server([repo], ["--exit-on-error=false"], wait_ready=False) as server:
        wait_for(server, "/v2/health/live", 60)  # not ready: `broken` does not load
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            for verb in ("load", "unload"):
                error = error_of(http.post(f"/v1/models/textgen/{verb}"), 400)
                assert error["message"] == EXPLICIT_ONLY
                assert error["type"] == "invalid_request_error"
