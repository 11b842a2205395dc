"""Every Triton datatype through the real server: identity models built at test time, with
configs auto-completed from the ONNX files, driven by tritonclient (binary and JSON)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from modelgen import ONNX_TYPES, identity_model, write_model
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# What tritonclient takes for each datatype (BF16 as ml_dtypes.bfloat16, since r26.06).
SAMPLES: dict[str, npt.NDArray[Any]] = {
    "BOOL": np.array([[True, False, True]]),
    "UINT8": np.array([[0, 7, 255]], np.uint8),
    "UINT16": np.array([[0, 7, 65535]], np.uint16),
    "UINT32": np.array([[0, 7, 2**32 - 1]], np.uint32),
    "UINT64": np.array([[0, 7, 2**64 - 1]], np.uint64),
    "INT8": np.array([[-128, 0, 127]], np.int8),
    "INT16": np.array([[-32768, 0, 32767]], np.int16),
    "INT32": np.array([[-(2**31), 0, 2**31 - 1]], np.int32),
    "INT64": np.array([[-(2**63), 0, 2**63 - 1]], np.int64),
    "FP16": np.array([[0.5, -1.25, 65504.0]], np.float16),
    "FP32": np.array([[0.1, -1.5, 3.4e38]], np.float32),
    "FP64": np.array([[0.1, -1.5, 1e300]], np.float64),
    "BF16": np.array([[0.5, -1.25, 2.0**100]], ml_dtypes.bfloat16),
    "BYTES": np.array([[b"", b"hello", "h\u00e9llo \u2713".encode()]], np.object_),
}
BINARY_ONLY = {"FP16", "BF16"}


def model_name(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


@pytest.fixture(scope="module")
def dtype_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("dtypes")
    for datatype, elem_type in ONNX_TYPES.items():
        # No config.pbtxt at all: the server fills it from the file.
        write_model(repo, model_name(datatype), identity_model(elem_type))
    with running_server([repo]) as proc:
        yield proc


@pytest.fixture
def client(dtype_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    triton = httpclient.InferenceServerClient(dtype_server.http_url)
    try:
        yield triton
    finally:
        triton.close()


# FP16 and BF16 travel only as binary.
CASES = [
    pytest.param(datatype, binary, id=f"{datatype}-{'binary' if binary else 'json'}")
    for datatype in sorted(SAMPLES)
    for binary in (True, False)
    if binary or datatype not in BINARY_ONLY
]


@pytest.mark.parametrize(("datatype", "binary"), CASES)
def test_identity(client: httpclient.InferenceServerClient, datatype: str, binary: bool) -> None:
    data = SAMPLES[datatype]
    inputs = [httpclient.InferInput("INPUT", list(data.shape), datatype)]
    inputs[0].set_data_from_numpy(data, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT", binary_data=binary)]
    result = client.infer(model_name(datatype), inputs, outputs=outputs)
    (output,) = result.get_response()["outputs"]
    assert output["datatype"] == datatype
    assert output["shape"] == [1, 3]
    got = result.as_numpy("OUTPUT")
    if datatype == "BYTES":
        got = np.array([[v if isinstance(v, bytes) else v.encode() for v in got[0]]], np.object_)
        assert got.tolist() == data.tolist()
    else:
        np.testing.assert_array_equal(got, data)
        assert got.dtype == data.dtype


def test_half_precision_outputs_are_binary_even_when_json_is_asked(
    client: httpclient.InferenceServerClient,
) -> None:
    data = SAMPLES["FP16"]
    inputs = [httpclient.InferInput("INPUT", [1, 3], "FP16")]
    inputs[0].set_data_from_numpy(data)
    outputs = [httpclient.InferRequestedOutput("OUTPUT", binary_data=False)]
    result = client.infer(model_name("FP16"), inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), data)


def test_autocompleted_metadata(dtype_server: ServerProcess) -> None:
    for datatype in SAMPLES:
        metadata = httpx.get(f"{dtype_server.base_url}/v2/models/{model_name(datatype)}").json()
        assert metadata["inputs"] == [{"name": "INPUT", "datatype": datatype, "shape": [-1, -1]}]
    config = httpx.get(f"{dtype_server.base_url}/v2/models/identity_bf16/config").json()
    assert config["max_batch_size"] == 4
    assert config["input"][0]["data_type"] == "TYPE_BF16"
    assert "dynamic_batching" in config


def test_variable_dims_and_batch(client: httpclient.InferenceServerClient) -> None:
    for shape in ([1, 1], [4, 7], [2, 0]):
        data = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
        inputs = [httpclient.InferInput("INPUT", shape, "INT32")]
        inputs[0].set_data_from_numpy(data)
        result = client.infer(model_name("INT32"), inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT").reshape(shape), data)


@pytest.mark.parametrize("datatype", sorted(SAMPLES))
def test_identity_grpc(dtype_server: ServerProcess, datatype: str) -> None:
    """The same tensors over gRPC (raw_input_contents / raw_output_contents)."""
    data = SAMPLES[datatype]
    triton = grpcclient.InferenceServerClient(dtype_server.grpc_url)
    try:
        inputs = [grpcclient.InferInput("INPUT", list(data.shape), datatype)]
        inputs[0].set_data_from_numpy(data)
        result = triton.infer(model_name(datatype), inputs)
    finally:
        triton.close()
    (output,) = result.get_response().outputs
    assert (output.datatype, list(output.shape)) == (datatype, [1, 3])
    got = result.as_numpy("OUTPUT")
    if datatype == "BYTES":
        assert got.tolist() == data.tolist()
    else:
        np.testing.assert_array_equal(got, data)
        assert got.dtype == data.dtype
