"""The data plane end to end, on both protocols: the real server process and the real
tritonclient (http and grpc, sync and aio), through the `client` fixture."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.http as httpclient
from protocols import Triton, as_ints, decimal_strings
from serverproc import EXAMPLE_MODELS, ServerProcess
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LABELS = (EXAMPLE_MODELS / "image_classifier" / "labels.txt").read_text().split()


def test_health_and_server_metadata(client: Triton) -> None:
    assert client.client.is_server_live()
    assert client.client.is_server_ready()
    assert client.client.is_model_ready("simple")
    assert not client.client.is_model_ready("no_such_model")
    metadata = client.client.get_server_metadata()
    if client.protocol == "grpc":
        name, extensions = metadata.name, list(metadata.extensions)
    else:
        name, extensions = metadata["name"], metadata["extensions"]
    assert name == "triton"
    assert "binary_tensor_data" in extensions and "classification" in extensions


def test_model_metadata_and_config(client: Triton) -> None:
    metadata = client.client.get_model_metadata("simple")
    config = client.client.get_model_config("simple")
    if client.protocol == "grpc":
        inputs = [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs]
        platform, versions = metadata.platform, list(metadata.versions)
        max_batch_size = config.config.max_batch_size
        config_inputs = [i.name for i in config.config.input]
    else:
        inputs = [(t["name"], t["datatype"], t["shape"]) for t in metadata["inputs"]]
        platform, versions = metadata["platform"], metadata["versions"]
        max_batch_size = config["max_batch_size"]
        config_inputs = [i["name"] for i in config["input"]]
    assert inputs == [("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    assert platform == "npu_ge"  # GE (the simulated NPU here) is the default for ONNX
    assert versions == ["1"]
    assert max_batch_size == 8
    assert config_inputs == ["INPUT0", "INPUT1"]


@pytest.mark.parametrize("batch", [1, 3])
def test_simple(client: Triton, batch: int) -> None:
    a = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    b = np.full((batch, 16), 7, dtype=np.int32)
    result = client.infer(
        "simple", {"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"], request_id="r-7"
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    response_id = response.id if client.protocol == "grpc" else response["id"]
    assert response_id == "r-7"


def test_simple_all_outputs_by_default(client: Triton) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = client.infer("simple", {"INPUT0": a, "INPUT1": a})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros_like(a))


def test_simple_http_json_tensors(server: ServerProcess) -> None:
    """HTTP only: tensors as JSON `data` both ways, not binary."""
    http = httpclient.InferenceServerClient(server.http_url)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=False)
    inputs[1].set_data_from_numpy(b, binary_data=False)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=False),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=False),
    ]
    result = http.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    http.close()


def test_simple_string(client: Triton) -> None:
    numbers0 = list(range(32))
    numbers1 = [3] * 32
    result = client.infer(
        "simple_string",
        {
            "INPUT0": decimal_strings(numbers0, (2, 16)),
            "INPUT1": decimal_strings(numbers1, (2, 16)),
        },
        ["OUTPUT0", "OUTPUT1"],
    )
    assert result.as_numpy("OUTPUT0").shape == (2, 16)
    assert as_ints(result.as_numpy("OUTPUT0")) == [
        a + b for a, b in zip(numbers0, numbers1, strict=True)
    ]
    assert as_ints(result.as_numpy("OUTPUT1")) == [
        a - b for a, b in zip(numbers0, numbers1, strict=True)
    ]


def test_classification(client: Triton) -> None:
    rng = np.random.default_rng(5)
    image = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
    plain = client.infer("image_classifier", {"image": image}, ["probabilities"])
    probabilities = plain.as_numpy("probabilities")
    assert probabilities.shape == (2, 10)

    top = client.infer("image_classifier", {"image": image}, ["probabilities"], class_count=3)
    classes = top.as_numpy("probabilities")
    assert classes.shape == (2, 3)
    for row, entries in zip(probabilities, classes, strict=True):
        expected = np.argsort(-row.astype(np.float64), kind="stable")[:3]
        parsed = [entry.decode().split(":") for entry in entries]
        assert [int(index) for _, index, _ in parsed] == [int(i) for i in expected]
        assert [label for _, _, label in parsed] == [LABELS[i] for i in expected]
        for (value, _, _), index in zip(parsed, expected, strict=True):
            assert float(value) == pytest.approx(float(row[index]), rel=1e-5)


def test_unknown_model(client: Triton) -> None:
    a = np.zeros((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("no_such_model", {"INPUT0": a, "INPUT1": a})
    client.expect_error(info.value, "NOT_FOUND", "Request for unknown model: 'no_such_model'")
    assert client.client.is_server_live()


def test_wrong_shape(client: Triton) -> None:
    a = np.zeros((1, 15), dtype=np.int32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("simple", {"INPUT0": a, "INPUT1": a})
    client.expect_error(info.value, "INVALID_ARGUMENT", "unexpected shape for input 'INPUT0'")
    assert client.client.is_server_live()


async def test_simple_aio_concurrent(client: Triton) -> None:
    aio = client.aio_client()
    try:
        requests = []
        for i in range(20):
            a = np.full((1, 16), i, dtype=np.int32)
            b = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = client.inputs({"INPUT0": a, "INPUT1": b})
            requests.append(aio.infer("simple", inputs, request_id=str(i)))
        results = await asyncio.gather(*requests)
        for i, result in enumerate(results):
            b = np.arange(16, dtype=np.int32).reshape(1, 16)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), i + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), i - b)
    finally:
        await aio.close()
