"""A model name to load is checked as Triton checks it (core model_repository_manager.cc
ValidateModelName; qa L0_input_validation ModelNameValidationTest): trimmed of whitespace,
an empty name and one that could leave the repository are refused INVALID_ARGUMENT / 400 in
Triton's words, over gRPC and HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import tritonclient.grpc as grpcclient
from serverproc import ServerProcess, running_server
from swapmodels import ADDK, write_addk
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

EMPTY = "Model name cannot be empty. Please enter a valid name to deploy."
TRAVERSAL = "invalid model name '{}', model name must not contain path traversal characters"
CASES = [
    ("", EMPTY),
    (" ", EMPTY),
    ("\t", EMPTY),
    ("..", TRAVERSAL.format("..")),
    (" ..", TRAVERSAL.format(" ..")),
    (".. ", TRAVERSAL.format(".. ")),
    ("../etc", TRAVERSAL.format("../etc")),
    ("model/", TRAVERSAL.format("model/")),
    ("/etc/passwd", TRAVERSAL.format("/etc/passwd")),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("models")
    write_addk(repo, [1])
    with running_server([repo], ["--model-control-mode=explicit"]) as proc:
        yield proc


@pytest.mark.parametrize(("name", "message"), CASES)
def test_grpc_load_refuses_the_name(server: ServerProcess, name: str, message: str) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as caught:
            client.load_model(name)
    finally:
        client.close()
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert caught.value.message() == message


@pytest.mark.parametrize(("name", "message"), [(" ", EMPTY), ("..", TRAVERSAL.format(".."))])
def test_http_load_refuses_the_name(server: ServerProcess, name: str, message: str) -> None:
    # Every byte percent-encoded, so that no client normalizes the path ('..').
    encoded = "".join(f"%{byte:02X}" for byte in name.encode())
    url = httpx.URL(f"http://{server.http_url}/")
    quoted = url.copy_with(raw_path=f"/v2/repository/models/{encoded}/load".encode())
    answer = httpx.post(quoted)
    assert (answer.status_code, answer.json()) == (400, {"error": message})


def test_a_valid_name_still_loads(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.load_model(ADDK)
        assert client.is_model_ready(ADDK)
    finally:
        client.close()
