"""Classification's limits, as Triton words them (server src/classification.cc; qa
L0_parameters class_count_test): an output of more than 1,000,000 elements per batch
item, or one of a type Triton does not rank (BYTES, BOOL, FP16, BF16), is refused 400 /
INVALID_ARGUMENT. Integers rank in their own type."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from modelgen import identity_model, write_model
from onnx import TensorProto
from serverproc import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CONFIG = """
name: "{name}"
backend: "onnxruntime"
max_batch_size: {batch}
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""
LIMIT = 1_000_000
TYPED = """
name: "{name}"
backend: "onnxruntime"
input [ {{ name: "INPUT" data_type: TYPE_{kind} dims: [ 3 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_{kind} dims: [ 3 ] }} ]
"""
# Model name -> (ONNX type, config type, numpy type).
TYPES = {
    "bool": (TensorProto.BOOL, "BOOL", np.bool_),
    "half": (TensorProto.FLOAT16, "FP16", np.float16),
    "int64": (TensorProto.INT64, "INT64", np.int64),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("models")
    write_model(
        repo, "flat", identity_model(TensorProto.FLOAT, [None]), CONFIG.format(name="flat", batch=0)
    )
    write_model(
        repo, "batched", identity_model(TensorProto.FLOAT), CONFIG.format(name="batched", batch=2)
    )
    for name, (onnx_type, kind, _) in TYPES.items():
        write_model(repo, name, identity_model(onnx_type, [3]), TYPED.format(name=name, kind=kind))
    with running_server([repo]) as proc:
        yield proc


def top(server: ServerProcess, module: object, model: str, shape: tuple[int, ...]) -> object:
    url = server.http_url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    tensor = module.InferInput("INPUT", list(shape), "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.ones(shape, np.float32))
    output = module.InferRequestedOutput("OUTPUT", class_count=2)  # type: ignore[attr-defined]
    try:
        return client.infer(model, [tensor], outputs=[output]).as_numpy("OUTPUT")
    finally:
        client.close()


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_an_output_past_a_million_elements_is_refused(
    server: ServerProcess, module: object
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        top(server, module, "flat", (LIMIT + 1,))
    assert caught.value.message() == "classification output tensor too large"
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_the_limit_is_per_batch_item(server: ServerProcess, module: object) -> None:
    assert top(server, module, "flat", (LIMIT,)).shape == (2,)  # type: ignore[attr-defined]
    # 1,200,000 in all, 600,000 per item.
    assert top(server, module, "batched", (2, 600_000)).shape == (2, 2)  # type: ignore[attr-defined]


def top_typed(server: ServerProcess, module: object, model: str, values: list[object]) -> object:
    url = server.http_url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    _, kind, dtype = TYPES[model]
    tensor = module.InferInput("INPUT", [3], kind)  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.array(values, dtype=dtype))
    output = module.InferRequestedOutput("OUTPUT", class_count=2)  # type: ignore[attr-defined]
    try:
        return client.infer(model, [tensor], outputs=[output]).as_numpy("OUTPUT")
    finally:
        client.close()


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
@pytest.mark.parametrize(("model", "kind"), [("bool", "BOOL"), ("half", "FP16")])
def test_an_output_triton_does_not_rank_is_refused(
    server: ServerProcess, module: object, model: str, kind: str
) -> None:
    with pytest.raises(InferenceServerException) as caught:
        top_typed(server, module, model, [1, 0, 1])
    expected = f"class result not available for output due to unsupported type '{kind}'"
    assert caught.value.message() == expected
    assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_int64_ranks_past_float_precision(server: ServerProcess, module: object) -> None:
    # Through float64 these three are one number.
    values = [2**60, 2**60 + 1, 2**60 + 3]
    top = top_typed(server, module, "int64", list(values))
    assert list(top) == [f"{values[2]}:2".encode(), f"{values[1]}:1".encode()]  # type: ignore[call-overload]
