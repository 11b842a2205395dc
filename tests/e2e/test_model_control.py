"""Model control modes and the repository API over HTTP, with the real tritonclient."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from modelgen import add_const_model
from serverproc import ServerProcess, running_server, start_server
from swapload import addk_inputs
from swapmodels import ADDK, write_addk
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

DISABLED = "explicit model load / unload is not allowed if polling is enabled"


def test_none_mode_loads_everything_and_refuses_the_api(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        index = client.get_model_repository_index()
        assert {r["name"] for r in index if r["state"] == "READY"} == {
            "simple",
            "simple_string",
            "image_classifier",
        }
        for call in (client.load_model, client.unload_model):
            with pytest.raises(InferenceServerException) as caught:
                call("simple")
            assert caught.value.message() == DISABLED
            assert caught.value.status() == "503"
        assert client.is_model_ready("simple")
        extensions = client.get_server_metadata()["extensions"]
        assert "model_repository(unload_dependents)" in extensions
    finally:
        client.close()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_addk(tmp_path / "repo", [1, 2])
    write_addk(tmp_path / "repo", [1], name="other")
    return tmp_path / "repo"


def addk(client: httpclient.InferenceServerClient, version: str = "") -> tuple[str, float]:
    result = client.infer(ADDK, addk_inputs(), model_version=version)
    return str(result.get_response()["model_version"]), float(result.as_numpy("OUTPUT0")[0, 0])


def test_explicit_mode_loads_only_what_it_is_told(repo: Path) -> None:
    extra = ["--model-control-mode=explicit", f"--load-model={ADDK}"]
    with running_server([repo], extra) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            assert client.is_model_ready(ADDK) and not client.is_model_ready("other")
            assert client.get_model_repository_index(query_params=None) == [
                {"name": ADDK, "version": "2", "state": "READY"},
                {"name": "other"},
            ]
            ready = httpx.post(f"{server.base_url}/v2/repository/index", json={"ready": True})
            assert [r["name"] for r in ready.json()] == [ADDK]
            client.load_model("other")
            assert client.is_model_ready("other")

            client.unload_model(ADDK)
            with pytest.raises(InferenceServerException) as caught:
                addk(client)
            assert caught.value.status() == "404"
            assert caught.value.message() == (
                "Request for unknown model: 'addk' has no available versions"
            )
            assert client.is_server_ready()
            # Unloading a model nobody knows does nothing, on both protocols, as in Triton.
            client.unload_model("unknown_model")
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            grpc.unload_model("unknown_model")
            grpc.close()
            names = [row["name"] for row in client.get_model_repository_index()]
            assert names == [ADDK, "other"]
            with pytest.raises(InferenceServerException, match="failed to poll"):
                client.load_model("missing")
            response = httpx.post(f"{server.base_url}/v2/repository/models/..%2F..%2Fx/load")
            assert response.status_code in (400, 404)
        finally:
            client.close()

    with running_server([repo], ["--model-control-mode=explicit", "--load-model=*"]) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready(ADDK) and client.is_model_ready("other")
        client.close()


CONFIG = {
    "name": ADDK,
    "backend": "onnxruntime",
    "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
}


@dataclass
class Explicit:
    """A server in explicit mode that has loaded `addk` from `root / "repo"`, its TMPDIR
    `root / "server-tmp"`."""

    server: ServerProcess
    root: Path

    @property
    def private(self) -> Path:
        return self.root / "server-tmp"


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Explicit]:
    root = tmp_path_factory.mktemp("explicit")
    write_addk(root / "repo", [1, 2])
    write_addk(root / "repo", [1], name="other")
    (root / "server-tmp").mkdir()
    extra = ["--model-control-mode=explicit", f"--load-model={ADDK}"]
    with running_server([root / "repo"], extra, env={"TMPDIR": str(root / "server-tmp")}) as proc:
        yield Explicit(proc, root)


@pytest.fixture
def explicit(explicit_server: Explicit) -> Iterator[Explicit]:
    """The module's explicit-mode server, shared by the tests that load and unload only
    `addk`: each leaves it served from the repository, and this puts it back so after a
    failed test too, so that one failure does not spill into the next test."""
    yield explicit_server
    httpx.post(f"{explicit_server.server.base_url}/v2/repository/models/{ADDK}/load")


def test_load_with_a_config_override_replaces_config_pbtxt(explicit: Explicit) -> None:
    server = explicit.server
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert addk(client) == ("2", 2.0)
        config = dict(CONFIG, version_policy={"specific": {"versions": [1]}})
        client.load_model(ADDK, config=json.dumps(config))
        assert addk(client) == ("1", 1.0)
        assert client.get_model_metadata(ADDK)["versions"] == ["1"]
        # A plain reload goes back to config.pbtxt.
        client.load_model(ADDK)
        assert addk(client) == ("2", 2.0)
        for text in ('{"max_batch_size": "many"}', "[]", '""'):
            with pytest.raises(InferenceServerException, match="not a valid JSON ModelConfig"):
                client.load_model(ADDK, config=text)
        bad = dict(CONFIG, name="someone_else")
        with pytest.raises(InferenceServerException, match="does not match"):
            client.load_model(ADDK, config=json.dumps(bad))
        assert addk(client) == ("2", 2.0)  # failed loads leave it serving
    finally:
        client.close()


def test_file_overrides_load_only_the_given_files_and_cannot_escape(
    explicit: Explicit,
) -> None:
    server, tmp_path, private = explicit.server, explicit.root, explicit.private
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        model = add_const_model(50.0).SerializeToString()
        client.load_model(ADDK, config=json.dumps(CONFIG), files={"file:5/model.onnx": model})
        assert addk(client) == ("5", 50.0)
        assert client.get_model_metadata(ADDK)["versions"] == ["5"]
        with pytest.raises(InferenceServerException):
            addk(client, "2")  # the repository's versions are not part of it
        (folder,) = private.glob("ge-serve-*")

        before = sorted(p for p in tmp_path.rglob("*"))
        for name in ("file:../../escaped.onnx", "file:/../tmp/escaped.onnx", "file:5/../../x"):
            with pytest.raises(InferenceServerException) as caught:
                client.load_model(ADDK, config=json.dumps(CONFIG), files={name: b"evil"})
            assert caught.value.status() == "400"
            assert "must be a relative path inside the model folder" in caught.value.message()
        # A path too deep to write or remove is named in a 400, not a 500.
        deep = "file:" + "a/" * 2000 + "x"
        with pytest.raises(InferenceServerException) as caught:
            client.load_model(ADDK, config=json.dumps(CONFIG), files={deep: b"x"})
        assert caught.value.status() == "400"
        assert f"'{deep}' has 2001 path components; at most 64" in caught.value.message()
        assert sorted(p for p in tmp_path.rglob("*")) == before
        assert not Path("/tmp/escaped.onnx").exists()
        assert addk(client) == ("5", 50.0)

        with pytest.raises(InferenceServerException, match="'config' parameter is required"):
            client.load_model(ADDK, files={"file:5/model.onnx": model})
        response = httpx.post(
            f"{server.base_url}/v2/repository/models/{ADDK}/load",
            json={"parameters": {"config": json.dumps(CONFIG), "file:5/model.onnx": "%%"}},
        )
        assert response.status_code == 400
        assert "not valid base64" in response.json()["error"]

        client.load_model(ADDK)  # back to the repository; the override folder goes
        assert addk(client) == ("2", 2.0)
        assert not folder.exists()
        assert list(private.glob("ge-serve-*")) == []
    finally:
        client.close()


def test_a_failed_file_override_load_does_not_show_the_server_temp_folder(
    explicit: Explicit,
) -> None:
    server, private = explicit.server, explicit.private
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        # Not loaded, as it is by a server that starts with no model (the fixture
        # loads it back): a failed load leaves its reason in the index.
        http.unload_model(ADDK)
        cases = {
            "file:1/model.onnx": "failed to parse ONNX file 'file:1/model.onnx'",
            "file:1/other.onnx": "model file 'file:1/model.onnx' does not exist",
        }
        for name, says in cases.items():
            for client in (http, grpc):
                with pytest.raises(InferenceServerException) as caught:
                    client.load_model(ADDK, config=json.dumps(CONFIG), files={name: b"junk"})
                message = str(caught.value.message())
                assert says in message, message
                assert str(private) not in message and "ge-serve-" not in message
        for row in http.get_model_repository_index():
            assert str(private) not in row.get("reason", ""), row
    finally:
        http.close()
        grpc.close()


def test_malformed_load_and_unload_bodies_are_clear_errors(explicit: Explicit) -> None:
    server = explicit.server
    base = f"{server.base_url}/v2/repository/models/{ADDK}"
    cases = [
        ("load", b"{not json", "failed to parse the load request JSON"),
        ("load", b'{"parameters": []}', "must be an object"),
        ("load", b'{"parameters": {"config": 5}}', "'config' must be a JSON string"),
        ("unload", b'{"parameters": {"unload_dependents": "yes"}}', "must be a boolean"),
    ]
    for action, body, message in cases:
        response = httpx.post(f"{base}/{action}", content=body)
        assert response.status_code == 400, body
        assert message in response.json()["error"]
    file_param = {"parameters": {"file:1/m.onnx": base64.b64encode(b"x").decode()}}
    assert httpx.post(f"{base}/load", json=file_param).status_code == 400
    assert httpx.get(f"{base}/load").status_code == 405


def test_a_wildcard_beside_other_startup_models_is_refused(repo: Path) -> None:
    """As Triton's core refuses it at server creation, the server exits with an error
    (a repeated '*' is one name, and starts)."""
    extra = ["--model-control-mode=explicit", "--load-model=*", f"--load-model={ADDK}"]
    server = start_server([repo], extra, wait_ready=False)
    try:
        assert server.process.wait(60) != 0
    finally:
        server.stop()
    log = server.log()
    assert "Wildcard model name '*' must be the ONLY startup model if specified at all." in log

    with running_server([repo], ["--model-control-mode=explicit", "--load-model=*"] * 2) as server:
        assert httpx.get(f"{server.base_url}/v2/models/other/ready").status_code == 200
