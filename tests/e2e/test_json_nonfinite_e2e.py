"""NaN, Infinity and -Infinity in JSON tensors, as Triton's TritonJson writes and reads
them (rapidjson's kWriteNanAndInfFlag and kParseNanAndInfFlag): a JSON output carries
the literals, which tritonclient's parser (Python's json) reads back exactly, and a JSON
input may hold them. On /v2 infer, served in the server process and by an HTTP worker,
and on /generate.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.http as httpclient
from modelgen import identity_model, write_model
from onnx import TensorProto
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CONFIG = """name: "{name}"
backend: "onnxruntime"
max_batch_size: 0
input [ {{ name: "INPUT" data_type: {datatype} dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT" data_type: {datatype} dims: [ -1 ] }} ]
"""
MODELS = {"fp32": ("TYPE_FP32", TensorProto.FLOAT), "fp64": ("TYPE_FP64", TensorProto.DOUBLE)}
DTYPES: dict[str, tuple[type[np.floating[Any]], str]] = {
    "fp32": (np.float32, "FP32"),
    "fp64": (np.float64, "FP64"),
}
VALUES = [math.nan, math.inf, -math.inf, 1.5]
LITERALS = "[NaN,Infinity,-Infinity,1.5]"


@pytest.fixture(scope="module", params=["server", "worker"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("models")
    for name, (datatype, elem_type) in MODELS.items():
        config = CONFIG.format(name=name, datatype=datatype)
        write_model(repo, name, identity_model(elem_type, dims=(None,)), config)
    flags = ["--http-workers=1"] if request.param == "worker" else []
    with running_server([repo], flags) as proc:
        yield proc


def same(got: npt.NDArray[Any], dtype: type[np.floating[Any]]) -> bool:
    """`got` is VALUES exactly (NaN where NaN is), in `dtype`."""
    return got.dtype == dtype and np.array_equal(got, np.array(VALUES, dtype), equal_nan=True)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_json_output_writes_the_literals_and_the_client_reads_them_back(
    server: ServerProcess, model: str
) -> None:
    dtype, datatype = DTYPES[model]
    tensor = httpclient.InferInput("INPUT", [4], datatype)
    tensor.set_data_from_numpy(np.array(VALUES, dtype), binary_data=True)
    wanted = [httpclient.InferRequestedOutput("OUTPUT", binary_data=False)]
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer(model, [tensor], outputs=wanted)
    assert same(result.as_numpy("OUTPUT"), dtype)
    # The text a client reads: the literals, where each value was written as null before.
    header = (
        f'{{"inputs":[{{"name":"INPUT","datatype":"{datatype}","shape":[4],'
        f'"parameters":{{"binary_data_size":{4 * np.dtype(dtype).itemsize}}}}}]}}'
    ).encode()
    answer = httpx.post(
        f"{server.base_url}/v2/models/{model}/infer",
        content=header + np.array(VALUES, dtype).tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert answer.status_code == 200, answer.text
    assert f'"data":{LITERALS}' in answer.text


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_json_body_with_the_literals_is_read_and_answered_with_them(
    server: ServerProcess, model: str
) -> None:
    _, datatype = DTYPES[model]
    body = (
        f'{{"inputs":[{{"name":"INPUT","datatype":"{datatype}","shape":[4],"data":{LITERALS}}}]}}'
    )
    answer = httpx.post(f"{server.base_url}/v2/models/{model}/infer", content=body)
    assert answer.status_code == 200, answer.text
    assert f'"data":{LITERALS}' in answer.text


def test_tritonclient_json_input_and_output_keep_every_value(server: ServerProcess) -> None:
    tensor = httpclient.InferInput("INPUT", [4], "FP32")
    tensor.set_data_from_numpy(np.array(VALUES, np.float32), binary_data=False)
    wanted = [httpclient.InferRequestedOutput("OUTPUT", binary_data=False)]
    with httpclient.InferenceServerClient(server.http_url) as client:
        result = client.infer("fp32", [tensor], outputs=wanted)
    assert same(result.as_numpy("OUTPUT"), np.float32)


def test_generate_reads_and_writes_the_literals(server: ServerProcess) -> None:
    answer = httpx.post(
        f"{server.base_url}/v2/models/fp64/generate", content=f'{{"INPUT":{LITERALS}}}'
    )
    assert answer.status_code == 200, answer.text
    assert f'"OUTPUT":{LITERALS}' in answer.text
    # One element is a scalar.
    answer = httpx.post(f"{server.base_url}/v2/models/fp32/generate", content='{"INPUT":-Infinity}')
    assert answer.status_code == 200, answer.text
    assert '"OUTPUT":-Infinity' in answer.text
