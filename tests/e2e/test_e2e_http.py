"""The HTTP front end end to end: the real server on examples/models, driven by
tritonclient.http (sync and aio) and raw httpx."""

from __future__ import annotations

import asyncio
import gzip
import socket
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import orjson
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from serverproc import EXAMPLE_MODELS, ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LABELS = (EXAMPLE_MODELS / "image_classifier" / "labels.txt").read_text().splitlines()


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(server.http_url)
    try:
        yield triton
    finally:
        triton.close()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30.0) as session:
        yield session


def simple_inputs(
    module: Any, a: npt.NDArray[np.int32], b: npt.NDArray[np.int32], binary: bool
) -> list[Any]:
    inputs = [
        module.InferInput("INPUT0", list(a.shape), "INT32"),
        module.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


def operands(batch: int, seed: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-(2**20), 2**20, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-(2**20), 2**20, size=(batch, 16), dtype=np.int32)
    return a, b


# --- simple, sync and aio, binary and JSON --------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_simple_sync(client: httpclient.InferenceServerClient, binary: bool, batch: int) -> None:
    a, b = operands(batch, batch)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer(
        "simple", simple_inputs(httpclient, a, b, binary), outputs=outputs, request_id="r1"
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response["id"] == "r1"
    assert response["model_name"] == "simple" and response["model_version"] == "1"
    for output in response["outputs"]:
        # Only binary_data_size, as Triton: the request's output parameters are not echoed.
        expected = {"parameters": {"binary_data_size": 4 * a.size}} if binary else {}
        assert {k: v for k, v in output.items() if k == "parameters"} == expected
        assert ("data" in output) is not binary


def test_simple_sync_default_outputs(client: httpclient.InferenceServerClient) -> None:
    a, b = operands(2, 7)
    result = client.infer("simple", simple_inputs(httpclient, a, b, True))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_simple_sync_one_output_and_versioned(client: httpclient.InferenceServerClient) -> None:
    a, b = operands(1, 3)
    outputs = [httpclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer(
        "simple", simple_inputs(httpclient, a, b, True), model_version="1", outputs=outputs
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.as_numpy("OUTPUT0") is None


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
async def test_simple_aio(server: ServerProcess, binary: bool) -> None:
    async with aioclient.InferenceServerClient(server.http_url) as triton:
        assert await triton.is_server_live()
        assert await triton.is_server_ready()
        assert await triton.is_model_ready("simple")
        pairs = [operands(1 + i % 4, 100 + i) for i in range(6)]
        outputs = [
            aioclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
            aioclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
        ]
        for (a, b), result in zip(
            pairs,
            [
                await triton.infer(
                    "simple", simple_inputs(aioclient, a, b, binary), outputs=outputs
                )
                for a, b in pairs
            ],
            strict=True,
        ):
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


async def test_simple_aio_concurrent(server: ServerProcess) -> None:
    async with aioclient.InferenceServerClient(server.http_url) as triton:
        pairs = [operands(2, 200 + i) for i in range(12)]
        results = await asyncio.gather(
            *(triton.infer("simple", simple_inputs(aioclient, a, b, True)) for a, b in pairs)
        )
        for (a, b), result in zip(pairs, results, strict=True):
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


async def test_aio_metadata_and_config(server: ServerProcess) -> None:
    async with aioclient.InferenceServerClient(server.http_url) as triton:
        metadata = await triton.get_model_metadata("simple")
        assert metadata["name"] == "simple"
        config = await triton.get_model_config("simple")
        assert config["max_batch_size"] == 8
        server_metadata = await triton.get_server_metadata()
        assert "binary_tensor_data" in server_metadata["extensions"]


# --- simple_string (BYTES) ------------------------------------------------------------------------


def string_operands(batch: int) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.object_], Any]:
    a = np.arange(batch * 16).reshape(batch, 16) - 7
    b = np.full((batch, 16), 1000)
    as_bytes = np.vectorize(lambda v: str(v).encode(), otypes=[object])
    return as_bytes(a), as_bytes(b), (a, b)


def to_ints(array: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    values = np.vectorize(lambda v: int(v.decode() if isinstance(v, bytes) else v))(array)
    return np.asarray(values, dtype=np.int64)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_simple_string_sync(client: httpclient.InferenceServerClient, binary: bool) -> None:
    sa, sb, (a, b) = string_operands(2)
    inputs = [
        httpclient.InferInput("INPUT0", [2, 16], "BYTES"),
        httpclient.InferInput("INPUT1", [2, 16], "BYTES"),
    ]
    inputs[0].set_data_from_numpy(sa, binary_data=binary)
    inputs[1].set_data_from_numpy(sb, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer("simple_string", inputs, outputs=outputs)
    np.testing.assert_array_equal(to_ints(result.as_numpy("OUTPUT0")), a + b)
    np.testing.assert_array_equal(to_ints(result.as_numpy("OUTPUT1")), a - b)


async def test_simple_string_aio(server: ServerProcess) -> None:
    sa, sb, (a, b) = string_operands(1)
    inputs = [
        aioclient.InferInput("INPUT0", [1, 16], "BYTES"),
        aioclient.InferInput("INPUT1", [1, 16], "BYTES"),
    ]
    inputs[0].set_data_from_numpy(sa)
    inputs[1].set_data_from_numpy(sb)
    async with aioclient.InferenceServerClient(server.http_url) as triton:
        result = await triton.infer("simple_string", inputs)
    np.testing.assert_array_equal(to_ints(result.as_numpy("OUTPUT0")), a + b)
    np.testing.assert_array_equal(to_ints(result.as_numpy("OUTPUT1")), a - b)


def test_simple_string_raw_json(http: httpx.Client) -> None:
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "BYTES", "data": ["5"] * 16},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "BYTES", "data": [["3"] * 16]},
        ]
    }
    response = http.post("/v2/models/simple_string/infer", json=body)
    assert response.status_code == 200, response.text
    outputs = {o["name"]: o for o in response.json()["outputs"]}
    assert outputs["OUTPUT0"] == {
        "name": "OUTPUT0", "datatype": "BYTES", "shape": [1, 16], "data": ["8"] * 16,
    }  # fmt: skip
    assert outputs["OUTPUT1"]["data"] == ["2"] * 16


# --- image_classifier and classification --------------------------------------------------------


def images(batch: int, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).random((batch, 3, 64, 64)).astype(np.float32)


def probabilities(client: httpclient.InferenceServerClient, x: npt.NDArray[np.float32]) -> Any:
    inputs = [httpclient.InferInput("image", list(x.shape), "FP32")]
    inputs[0].set_data_from_numpy(x)
    return client.infer("image_classifier", inputs).as_numpy("probabilities")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_image_classifier_class_count(
    client: httpclient.InferenceServerClient, binary: bool
) -> None:
    x = images(3)
    full = probabilities(client, x)
    assert full.shape == (3, 10)
    np.testing.assert_allclose(full.sum(axis=1), 1.0, atol=1e-5)
    inputs = [httpclient.InferInput("image", [3, 3, 64, 64], "FP32")]
    inputs[0].set_data_from_numpy(x, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("probabilities", binary_data=binary, class_count=3)]
    top = client.infer("image_classifier", inputs, outputs=outputs).as_numpy("probabilities")
    assert top.shape == (3, 3)
    for row, probs in zip(top, full, strict=True):
        entries = [(v.decode() if isinstance(v, bytes) else v).split(":") for v in row]
        indices = [int(index) for _, index, _ in entries]
        assert indices == list(np.argsort(-probs, kind="stable")[:3])
        for score, index, label in entries:
            assert label == LABELS[int(index)]
            assert float(score) == pytest.approx(float(probs[int(index)]), abs=1e-6)


def test_raw_binary_request(client: httpclient.InferenceServerClient, http: httpx.Client) -> None:
    x = images(1, seed=5)
    response = http.post(
        "/v2/models/image_classifier/infer",
        content=x.tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert response.status_code == 200, response.text
    # Triton's answer to a raw-binary request: binary outputs after the JSON header.
    length = int(response.headers["inference-header-content-length"])
    (output,) = orjson.loads(response.content[:length])["outputs"]
    assert output["name"] == "probabilities" and output["shape"] == [1, 10]
    data = np.frombuffer(response.content[length:], dtype=np.float32)
    np.testing.assert_allclose(data, probabilities(client, x)[0], rtol=1e-6)


# --- compression ----------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_tritonclient_compression(client: httpclient.InferenceServerClient, algorithm: str) -> None:
    a, b = operands(4, 11)
    result = client.infer(
        "simple",
        simple_inputs(httpclient, a, b, True),
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


SIMPLE_JSON = {
    "inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
    ]
}


@pytest.mark.parametrize(
    ("encoding", "compress", "decompress"),
    [
        ("gzip", gzip.compress, gzip.decompress),
        ("deflate", zlib.compress, zlib.decompress),
    ],
)
def test_raw_compression_both_ways(
    server: ServerProcess, encoding: str, compress: Any, decompress: Any
) -> None:
    body = compress(orjson.dumps(SIMPLE_JSON))
    headers = {"Content-Encoding": encoding, "Accept-Encoding": f"{encoding}, identity;q=0.5"}
    # A bare socket-level client, so nothing decodes the response behind our back.
    with httpx.Client(base_url=server.base_url, timeout=30.0) as session:
        request = session.build_request(
            "POST", "/v2/models/simple/infer", content=body, headers=headers
        )
        response = session.send(request, stream=True)
        raw = b"".join(response.iter_raw())
    assert response.status_code == 200
    assert response.headers["content-encoding"] == encoding
    outputs = orjson.loads(decompress(raw))["outputs"]
    assert outputs[0]["data"] == list(range(1, 17))
    assert outputs[1]["data"] == list(range(-1, 15))


def test_no_compression_unless_asked(http: httpx.Client) -> None:
    response = http.post(
        "/v2/models/simple/infer", json=SIMPLE_JSON, headers={"Accept-Encoding": "identity"}
    )
    assert response.status_code == 200
    assert "content-encoding" not in response.headers


def raw_exchange(server: ServerProcess, request: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    """A bare socket-level exchange (the request asks for the close): status, headers by
    lower-case name, and every byte after the head."""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines)
    return int(status.split()[1]), headers, rest


@pytest.mark.parametrize(
    ("path", "change"),
    [
        ("/v2/logging", {"log_verbose_level": 3}),
        ("/v2/trace/setting", {"trace_rate": "7"}),
        ("/v2/models/simple/trace/setting", {"trace_count": "9"}),
    ],
)
def test_head_on_a_settings_route_answers_as_get_and_changes_nothing(
    http: httpx.Client, server: ServerProcess, path: str, change: dict[str, Any]
) -> None:
    # HEAD with a body was taken for the POST that changes the settings.
    before = http.get(path)
    assert before.status_code == 200
    body = orjson.dumps(change)
    request = (
        f"HEAD {path} HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    status, headers, rest = raw_exchange(server, request)
    assert (status, rest) == (200, b"")
    assert headers[b"content-length"] == str(len(before.content)).encode()
    assert http.get(path).json() == before.json()


# --- health, metadata, config, routes -------------------------------------------------------------


def test_health(http: httpx.Client, client: httpclient.InferenceServerClient) -> None:
    assert http.get("/v2/health/live").status_code == 200
    assert http.get("/v2/health/ready").status_code == 200
    assert client.is_server_live() and client.is_server_ready()


def test_server_metadata(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert metadata["name"] == "triton"
    assert isinstance(metadata["version"], str) and metadata["version"]
    extensions = metadata["extensions"]
    for extension in (
        "classification",
        "binary_tensor_data",
        "model_configuration",
        "model_repository",
        "schedule_policy",
        "statistics",
        "logging",
        "parameters",
        "system_shared_memory",
        "trace",
        "sequence",
    ):
        assert extension in extensions
    # Only what is implemented is claimed.
    assert "cuda_shared_memory" not in extensions


@pytest.mark.parametrize("path", ["/v2/models/simple", "/v2/models/simple/versions/1"])
def test_model_metadata(http: httpx.Client, path: str) -> None:
    response = http.get(path)
    assert response.status_code == 200
    assert response.json() == {
        "name": "simple",
        "versions": ["1"],
        "platform": "npu_ge",  # GE (the simulated NPU here) is the default for ONNX
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
        "outputs": [
            {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
            {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]},
        ],
    }


def test_model_metadata_bytes(client: httpclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("simple_string")
    assert [i["datatype"] for i in metadata["inputs"]] == ["BYTES", "BYTES"]


@pytest.mark.parametrize("suffix", ["", "/versions/1"])
def test_model_ready(http: httpx.Client, suffix: str) -> None:
    assert http.get(f"/v2/models/simple{suffix}/ready").status_code == 200
    # Triton's GetModel answers a model or version it does not serve NOT_FOUND: 404.
    assert http.get(f"/v2/models/nope{suffix}/ready").status_code == 404
    assert http.get("/v2/models/simple/versions/9/ready").status_code == 404


@pytest.mark.parametrize("suffix", ["", "/versions/1"])
def test_model_config(http: httpx.Client, suffix: str) -> None:
    response = http.get(f"/v2/models/image_classifier{suffix}/config")
    assert response.status_code == 200
    config = response.json()
    assert config["name"] == "image_classifier"
    assert config["max_batch_size"] == 8
    assert config["input"][0]["dims"] == [3, 64, 64]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["output"][0]["label_filename"] == "labels.txt"
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert config["instance_group"][0]["kind"] == "KIND_MODEL"  # GE places its NPU slots
    assert config["backend"] == "ge"


def test_model_config_with_tritonclient(client: httpclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple")
    assert config["name"] == "simple" and config["max_batch_size"] == 8
    # Its config lists inputs and outputs, so auto-complete adds no dynamic batcher, as
    # Triton's onnxruntime backend adds none.
    assert "dynamic_batching" not in config


def test_repository_index(http: httpx.Client) -> None:
    for body in (None, {"ready": True}, {"ready": False}):
        response = http.post("/v2/repository/index", json=body)
        assert response.status_code == 200
        assert response.json() == [
            {"name": name, "version": "1", "state": "READY"}
            for name in sorted(p.name for p in EXAMPLE_MODELS.iterdir() if p.is_dir())
        ]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/models/simple/infer/"),
        ("GET", "/v2/models/simple/"),
        ("GET", "/v2/health/ready/"),
        ("GET", "/v2/logging/"),
        ("GET", "/v1/models/"),
    ],
)
def test_a_trailing_slash_is_not_found_not_redirected(
    http: httpx.Client, method: str, path: str
) -> None:
    # As Triton, whose routes match whole paths; starlette redirected to the path without
    # the slash, on the host the client's Host header named.
    response = http.request(method, path, headers={"Host": "evil.example"}, content=b"{}")
    assert response.status_code == 404 and "location" not in response.headers
    error = response.json()["error"]
    if path.startswith("/v1/"):  # OpenAI's error object
        error = error["message"]
    assert error == f"Not Found: no route for {method} {path}"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v2/nothing/here", 404),
        ("GET", "/v3/health/live", 404),
        ("POST", "/v2/models/simple/versions/1/extra", 404),
        # Near misses of the infer shortcut's pattern fall through to the route table.
        ("POST", "/v2/models/simple/infer/extra", 404),
        ("POST", "/v2/models/simple/versions/1/2/infer", 404),
        ("POST", "/v2/models//infer", 404),
        ("GET", "/v2/models/simple/infer", 405),
        ("POST", "/v2/health/live", 405),
        ("DELETE", "/v2/models/simple", 405),
        ("GET", "/v2/repository/index", 405),
    ],
)
def test_unknown_route_and_wrong_method(
    http: httpx.Client, method: str, path: str, status: int
) -> None:
    response = http.request(method, path)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert path in error
    assert ("Not Found" if status == 404 else "Method Not Allowed") in error


def test_health_bodies_and_model_ready_reasons(http: httpx.Client) -> None:
    """Health answers Triton's status with the Open Inference Protocol's body, which
    KServe's REST client reads; a model that is not ready gets Triton's reason."""
    for kind in ("live", "ready"):
        reply = http.get(f"/v2/health/{kind}")
        assert reply.status_code == 200 and reply.json() == {kind: True}
    assert http.get("/v2/models/simple/ready").status_code == 200
    # A model or version that is not served: the lookup's answer, as model metadata's.
    for model in ("nosuch", "simple/versions/7", "simple/versions/-1"):
        reply, metadata = http.get(f"/v2/models/{model}/ready"), http.get(f"/v2/models/{model}")
        assert reply.status_code == metadata.status_code >= 400
        assert reply.json() == metadata.json()
    assert "Request for unknown model: 'nosuch'" in http.get("/v2/models/nosuch/ready").text
