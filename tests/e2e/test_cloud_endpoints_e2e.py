"""Triton's SageMaker and Vertex AI endpoints, as their clients see them: SageMaker's
/ping, /invocations of the default model and the multi-model endpoint; Vertex AI's
health and predict routes with the redirect header; the startup errors of both."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.http as httpclient
from modelgen import write_model
from onnx import TensorProto, helper
from serverproc import ServerProcess, free_ports, running_server, server_command, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

SM_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="
CONFIG = """
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
        {{ name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }},
         {{ name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }} ]
"""
DATA = np.arange(16, dtype=np.int32).reshape(1, 16)


def add_sub() -> onnx.ModelProto:
    """Triton's qa `onnx_int32_int32_int32`: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = their
    difference."""
    io = [
        helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 16])
        for name in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")
    ]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "add_sub",
        io[:2],
        io[2:],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def add_model(repo: Path, name: str, folder: str | None = None) -> Path:
    return write_model(repo, folder or name, add_sub(), CONFIG.format(name=name))


def request_body(binary_input: bool = False, binary_output: bool = False) -> tuple[bytes, int]:
    inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]
    for tensor in inputs:
        tensor.set_data_from_numpy(DATA, binary_data=binary_input)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_output)]
    body, length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    return body, length or 0


@pytest.fixture
def cloud_port() -> int:
    return free_ports(1)[0]


@pytest.fixture(scope="module")
def sagemaker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One server for the module: the tests that take it only send requests, which leave
    it as it was (no model is loaded or unloaded, no statistics are read)."""
    (cloud_port,) = free_ports(1)
    repo = tmp_path_factory.mktemp("sagemaker") / "models"
    add_model(repo, "sm_model")
    env = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "sm_model"}
    extra = ["--allow-sagemaker=true", f"--sagemaker-port={cloud_port}"]
    with running_server([repo], extra, env=env):
        yield f"http://127.0.0.1:{cloud_port}"


def test_sagemaker_pings_and_invokes_the_default_model(sagemaker: str) -> None:
    assert httpx.get(f"{sagemaker}/ping").status_code == 200
    body, _ = request_body()
    reply = httpx.post(f"{sagemaker}/invocations", content=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model_name"] == "sm_model"
    assert reply.json()["outputs"][0]["data"] == (DATA * 2).ravel().tolist()
    # Binary tensors both ways: the JSON header's length travels in the content type.
    body, length = request_body(binary_input=True, binary_output=True)
    reply = httpx.post(
        f"{sagemaker}/invocations", content=body, headers={"Content-Type": f"{SM_MIME}{length}"}
    )
    assert reply.status_code == 200, reply.text
    content_type = reply.headers["content-type"]
    assert content_type.startswith(SM_MIME)
    result = httpclient.InferenceServerClient.parse_response_body(
        reply.content, header_length=int(content_type[len(SM_MIME) :])
    )
    assert result.as_numpy("OUTPUT0").tolist() == (DATA * 2).tolist()


@pytest.mark.parametrize(
    ("content_type", "message"),
    [
        (f"x/{SM_MIME}10", "expect MIME type for binary data starts with"),
        (f"{SM_MIME}abc", "Unable to parse inference header size, got: abc"),
        (f"{SM_MIME}-1", "inference header size should be in range"),
        (f"{SM_MIME}99999999999", "value is out of range, got: 99999999999"),
    ],
)
def test_sagemaker_refuses_a_bad_header_size(
    sagemaker: str, content_type: str, message: str
) -> None:
    body, _ = request_body(binary_input=True)
    reply = httpx.post(
        f"{sagemaker}/invocations", content=body, headers={"Content-Type": content_type}
    )
    assert reply.status_code == 400
    assert message in reply.json()["error"]
    assert httpx.get(f"{sagemaker}/ping").status_code == 200


def test_sagemaker_answers_other_paths_400(sagemaker: str) -> None:
    assert httpx.get(f"{sagemaker}/v2/health/ready").status_code == 400
    assert httpx.post(f"{sagemaker}/ping").status_code == 405


def test_sagemaker_without_a_default_model_names_the_placeholder(
    tmp_path: Path, cloud_port: int
) -> None:
    repo = tmp_path / "models"
    add_model(repo, "sm_model")
    extra = ["--allow-sagemaker=true", f"--sagemaker-port={cloud_port}"]
    with running_server([repo], extra):
        body, _ = request_body()
        reply = httpx.post(f"http://127.0.0.1:{cloud_port}/invocations", content=body)
    assert reply.status_code >= 400
    assert "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME" in reply.json()["error"]


@contextlib.contextmanager
def mme_server(tmp_path: Path, cloud_port: int, *more: str) -> Iterator[ServerProcess]:
    """A server in explicit mode with an empty repository and the SageMaker endpoint,
    its multi-model root `tmp_path / "ml_models"`."""
    (tmp_path / "models").mkdir(exist_ok=True)
    env = {"GE_SERVE_SAGEMAKER_MODELS_ROOT": str(tmp_path / "ml_models")}
    extra = ["--allow-sagemaker=true", f"--sagemaker-port={cloud_port}", *more]
    with running_server(
        [tmp_path / "models"], [*extra, "--model-control-mode=explicit"], env=env
    ) as proc:
        yield proc


@dataclass
class MultiModel:
    """The module's multi-model server: its multi-model root, and its /models url."""

    server: ServerProcess
    root: Path
    url: str


# Load urls inside the shared multi-model root that its server must refuse, by case.
REFUSED = {
    "escape": "789hash/model",
    "inner_link": "111hash/model",
    "not_a_folder": "000hash/model",
}


@pytest.fixture(scope="module")
def multi_model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiModel]:
    """One multi-model server for the tests that load into it under names of their own and
    unload what they loaded: between tests it lists no model and serves none (the
    `multi_model` fixture makes sure), as a fresh one would."""
    (cloud_port,) = free_ports(1)
    tmp_path = tmp_path_factory.mktemp("multi-model")
    root = tmp_path / "ml_models"
    # For test_sagemaker_refuses_a_load_path_outside_its_root.
    add_model(root / "123hash", "inside", "model")
    outside = add_model(tmp_path / "elsewhere" / "456hash", "outside", "model")
    (root / "789hash").mkdir()
    (root / "789hash" / "model").symlink_to(outside)
    (root / "000hash").mkdir()
    (root / "000hash" / "model").write_text("not a folder")
    # The url stays inside; the model folder chosen in it is a link that leaves.
    (root / "111hash" / "model").mkdir(parents=True)
    (root / "111hash" / "model" / "m").symlink_to(outside)
    with mme_server(tmp_path, cloud_port) as server:
        yield MultiModel(server, root, f"http://127.0.0.1:{cloud_port}/models")


@pytest.fixture
def multi_model(multi_model_server: MultiModel) -> Iterator[MultiModel]:
    """The shared multi-model server; what a test leaves loaded, failing half-way, is
    unloaded after it, so that the failure stays that test's."""
    yield multi_model_server
    for entry in httpx.get(multi_model_server.url).json()["models"]:
        httpx.delete(f"{multi_model_server.url}/{entry['modelName']}")


def test_sagemaker_multi_model_endpoint(multi_model: MultiModel) -> None:
    root, url = multi_model.root, multi_model.url
    model_url = add_model(root / "200hash", "sm_mme_model_1", "model")
    load = {"model_name": "sm_mme_model_1", "url": str(model_url)}
    reply = httpx.post(url, content=json.dumps(load))
    assert reply.status_code == 200, reply.text
    assert httpx.post(url, content=json.dumps(load)).status_code == 409
    entry = {"modelName": "sm_mme_model_1", "modelUrl": str(root / "200hash")}
    assert httpx.get(url).json() == {"models": [entry]}
    assert httpx.get(f"{url}/sm_mme_model_1").json() == entry
    body, _ = request_body()
    reply = httpx.post(f"{url}/sm_mme_model_1/invoke", content=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["model_name"] == "sm_mme_model_1"
    assert httpx.post(f"{url}/other/invoke", content=body).status_code == 404
    assert httpx.delete(f"{url}/sm_mme_model_1").status_code == 200
    assert httpx.delete(f"{url}/sm_mme_model_1").status_code == 404
    assert httpx.get(url).json() == {"models": []}
    # Loaded again once unloaded: its folder was unregistered.
    assert httpx.post(url, content=json.dumps(load)).status_code == 200


@pytest.mark.parametrize("where", ["outside", "escape", "inner_link", "not_a_folder", "proc"])
def test_sagemaker_refuses_a_load_path_outside_its_root(
    multi_model: MultiModel, where: str
) -> None:
    urls = {
        "outside": str(multi_model.root.parent / "elsewhere" / "456hash" / "model"),
        **{case: str(multi_model.root / path) for case, path in REFUSED.items()},
        "proc": "/proc/self/cwd",
    }
    load = {"model_name": "m", "url": urls[where]}
    reply = httpx.post(multi_model.url, content=json.dumps(load))
    assert reply.status_code == 400
    assert "error" in reply.json()
    assert httpx.get(multi_model.url).json() == {"models": []}


def indexed(http_url: str) -> set[str]:
    reply = httpx.post(f"http://{http_url}/v2/repository/index", json={})
    return {entry["name"] for entry in reply.json()}


def test_sagemaker_target_model_is_kept_from_load_to_unload(multi_model: MultiModel) -> None:
    """SageMaker sends X-Amzn-SageMaker-Target-Model: the model serves under it, is listed
    under its load name, and is unloaded, and forgotten, whatever a later header says."""
    server, url = multi_model.server, multi_model.url
    model_url = add_model(multi_model.root / "300hash", "whatever", "model")
    load = {"model_name": "hash3", "url": str(model_url)}
    target = {"X-Amzn-SageMaker-Target-Model": "tgt3"}
    assert httpx.post(url, content=json.dumps(load), headers=target).status_code == 200
    assert [m["modelName"] for m in httpx.get(url).json()["models"]] == ["hash3"]
    ready = f"http://{server.http_url}/v2/models/tgt3/ready"
    assert httpx.get(ready).status_code == 200
    wrong = {"X-Amzn-SageMaker-Target-Model": "nonexistent"}
    assert httpx.delete(f"{url}/hash3", headers=wrong).status_code == 200
    assert httpx.get(ready).status_code != 200
    assert "tgt3" not in indexed(server.http_url)


def test_sagemaker_model_url_as_given_and_restricted_invoke(tmp_path: Path) -> None:
    """Triton's qa setup: the models root is a link. modelUrl names the folder as the load
    url did (links not followed); an invocation without the restricted-API header is 403,
    not one of the invocation's own error codes."""
    cloud_port = free_ports(1)[0]
    real = tmp_path / "unpacked"
    add_model(real / "123hash", "m", "model")
    (tmp_path / "ml_models").symlink_to(real)
    given = tmp_path / "ml_models" / "123hash" / "model"
    with mme_server(tmp_path, cloud_port, "--http-restricted-api=inference:X-Auth=secret"):
        url = f"http://127.0.0.1:{cloud_port}/models"
        load = {"model_name": "m", "url": str(given)}
        assert httpx.post(url, content=json.dumps(load)).status_code == 200
        shown = str(tmp_path / "ml_models" / "123hash")
        assert httpx.get(url).json() == {"models": [{"modelName": "m", "modelUrl": shown}]}
        body, _ = request_body()
        reply = httpx.post(f"{url}/m/invoke", content=body)
        assert reply.status_code == 403
        assert reply.json() == {"error": "This API is restricted, expecting header 'X-Auth'"}
        reply = httpx.post(f"{url}/m/invoke", content=body, headers={"X-Auth": "secret"})
        assert reply.status_code == 200, reply.text


def test_sagemaker_failed_load_of_a_served_name_leaves_it_serving(tmp_path: Path) -> None:
    """A multi-model load under a name the server already serves fails (the name is in
    two repositories) and leaves that model serving, as Triton does."""
    cloud_port = free_ports(1)[0]
    add_model(tmp_path / "models", "taken")
    model_url = add_model(tmp_path / "ml_models" / "123hash", "taken", "model")
    with mme_server(tmp_path, cloud_port, "--load-model=taken") as server:
        load = {"model_name": "taken", "url": str(model_url)}
        reply = httpx.post(f"http://127.0.0.1:{cloud_port}/models", content=json.dumps(load))
        assert reply.status_code == 400
        assert httpx.get(f"http://{server.http_url}/v2/models/taken/ready").status_code == 200


ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "A" data_type: TYPE_INT32 dims: [ {dims} ] }} ]
output [ {{ name: "SUM" data_type: TYPE_INT32 dims: [ 16 ] }} ]
ensemble_scheduling {{ step [ {{
  model_name: "step" model_version: -1
  input_map {{ key: "INPUT0" value: "A" }} input_map {{ key: "INPUT1" value: "A" }}
  output_map {{ key: "OUTPUT0" value: "SUM" }}
}} ] }}
"""


def test_sagemaker_failed_ensemble_load_takes_its_steps_down(multi_model: MultiModel) -> None:
    """An ensemble archive whose ensemble fails to load leaves nothing served or listed:
    its steps, loaded for it, go with it."""
    archive = multi_model.root / "400hash" / "model"
    add_model(archive, "step")
    (archive / "ens" / "1").mkdir(parents=True)
    (archive / "ens" / "config.pbtxt").write_text(ENSEMBLE.format(dims=8))  # step takes 16
    server, url = multi_model.server, multi_model.url
    load = {"model_name": "e1", "url": str(archive)}
    reply = httpx.post(url, content=json.dumps(load))
    assert reply.status_code == 400 and "error" in reply.json()
    assert httpx.get(f"http://{server.http_url}/v2/models/step/ready").status_code != 200
    assert indexed(server.http_url) == set()
    # The archive mended, it loads: nothing of the failed load stands in its way.
    (archive / "ens" / "config.pbtxt").write_text(ENSEMBLE.format(dims=16))
    assert httpx.post(url, content=json.dumps(load)).status_code == 200
    assert httpx.get(f"http://{server.http_url}/v2/models/e1/ready").status_code == 200


VERTEX_ENV = {"AIP_PREDICT_ROUTE": "/predict", "AIP_HEALTH_ROUTE": "/health"}


def test_vertex_ai_predicts_and_redirects(tmp_path: Path, cloud_port: int) -> None:
    repo = tmp_path / "models"
    add_model(repo, "addsub")
    add_model(repo, "subadd")
    extra = [
        "--allow-vertex-ai=true",
        f"--vertex-ai-port={cloud_port}",
        "--vertex-ai-default-model=addsub",
    ]
    with running_server([repo], extra, env=VERTEX_ENV):
        base = f"http://127.0.0.1:{cloud_port}"
        assert httpx.get(f"{base}/health").status_code == 200
        body, _ = request_body()
        reply = httpx.post(f"{base}/predict", content=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model_name"] == "addsub"
        redirect = "X-Vertex-Ai-Triton-Redirect"
        reply = httpx.post(
            f"{base}/predict", content=body, headers={redirect: "v2/models/subadd/infer"}
        )
        assert reply.json()["model_name"] == "subadd"
        for path in ("v2/models/subadd/ready", "v2/health/live", "v2", "v2/models/addsub/config"):
            assert httpx.post(f"{base}/predict", headers={redirect: path}).status_code == 200
        index = httpx.post(f"{base}/predict", headers={redirect: "v2/repository/index"})
        assert {entry["name"] for entry in index.json()} == {"addsub", "subadd"}
        blocked = httpx.post(
            f"{base}/predict", headers={redirect: "v2/repository/models/subadd/unload"}
        )
        assert blocked.status_code == 403
        assert httpx.get(f"{base}/predict", headers={redirect: "v2"}).status_code == 405
        assert httpx.post(f"{base}/other").status_code == 400


def start_failure(repo: Path, extra: list[str], env: dict[str, str]) -> str:
    """The log of a server that must refuse to start."""
    http, grpc, metrics = free_ports(3)
    command = server_command([repo], extra, (http, grpc, metrics))
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode != 0
    return done.stdout + done.stderr


@pytest.mark.parametrize(
    ("variables", "extra", "message"),
    [
        ({"AIP_HEALTH_ROUTE": "/health"}, [], "API_PREDICT_ROUTE is not defined"),
        ({"AIP_PREDICT_ROUTE": "/predict"}, [], "AIP_HEALTH_ROUTE is not defined"),
        (VERTEX_ENV, ["--vertex-ai-default-model=subadd"], "Expect the default model 'subadd'"),
        (VERTEX_ENV, [], "Expect the model repository contains only a single model"),
    ],
)
def test_vertex_ai_startup_errors(
    tmp_path: Path, variables: dict[str, str], extra: list[str], message: str
) -> None:
    repo = tmp_path / "models"
    add_model(repo, "addsub")
    add_model(repo, "other")
    env = {**os.environ, **variables}
    log = start_failure(repo, ["--allow-vertex-ai=true", "--vertex-ai-port=0", *extra], env)
    assert "failed to start Vertex AI service" in log
    assert message in log


def test_vertex_ai_serves_alone_in_its_environment(tmp_path: Path, cloud_port: int) -> None:
    # AIP_MODE=PREDICTION: Vertex AI on, HTTP and gRPC off, AIP_STORAGE_URI the repository.
    repo = tmp_path / "models"
    add_model(repo, "addsub")
    env = {
        **VERTEX_ENV,
        "AIP_MODE": "PREDICTION",
        "AIP_STORAGE_URI": str(repo),
        "AIP_HTTP_PORT": str(cloud_port),
    }
    with running_server([], [], env=env, wait_ready=False) as server:
        server.http_port = cloud_port
        wait_for(server, "/health", 60)
        assert "Started HTTPService" not in server.log()
        body, _ = request_body()
        reply = httpx.post(f"http://127.0.0.1:{cloud_port}/predict", content=body)
        assert reply.json()["model_name"] == "addsub"
