"""Ragged batching end to end with tritonclient: requests of different lengths run in one
execution (the server's statistics say so) and each gets its own output back."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from modelgen import write_model
from onnx import TensorProto, helper
from polling import poll
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CONFIG = """
name: "ragged"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_FP32
    source_input: "x" }
]
batch_output [ { target_name: "y" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "x" } ]
dynamic_batching { }
"""
LENGTHS = (3, 5, 2)


def ragged_model() -> onnx.ModelProto:
    """Takes the batch as one flat x and the end offsets INDEX (both 1-D FP32); each
    element of y is x plus the number of requests in the batch (len(INDEX))."""
    nodes = [
        helper.make_node("Shape", ["INDEX"], ["count_i"]),
        helper.make_node("Cast", ["count_i"], ["count"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "count"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ragged",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["total"]),
            helper.make_tensor_value_info("INDEX", TensorProto.FLOAT, ["requests"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["total"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("ragged-repo")
    write_model(repo, "ragged", ragged_model(), CONFIG)
    # Triton's test hook: the batcher holds until this many requests are queued, so the
    # three requests below are certain to be batched however the host schedules them.
    env = {"TRITONSERVER_DELAY_SCHEDULER": str(len(LENGTHS))}
    with running_server([repo], env=env) as server:
        yield server


def test_requests_of_different_lengths_run_together_and_each_gets_its_own_output(
    ragged_server: ServerProcess,
) -> None:
    client = httpclient.InferenceServerClient(ragged_server.http_url, concurrency=len(LENGTHS))
    try:
        pending = []
        for index, length in enumerate(LENGTHS):
            data = np.arange(length, dtype=np.float32)[None, :] + 10 * index
            tensor = httpclient.InferInput("x", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            pending.append((data, client.async_infer("ragged", [tensor])))
        for data, future in pending:
            # Its own slice, in its own shape: x + 3, the batch's request count.
            np.testing.assert_array_equal(future.get_result().as_numpy("y"), data + len(LENGTHS))
        stats = client.get_inference_statistics("ragged")["model_stats"][0]
    finally:
        client.close()
    assert stats["inference_count"] == len(LENGTHS)
    assert stats["execution_count"] == 1
    (batch,) = stats["batch_stats"]
    assert batch["batch_size"] == len(LENGTHS)


def test_grpc_clients_get_their_own_slices_too(ragged_server: ServerProcess) -> None:
    # As many requests as the delay hook waits for, so the test stands on its own.
    client = grpcclient.InferenceServerClient(ragged_server.grpc_url)
    results: list[object] = []
    try:
        sent = []
        for length in (7, 1, 4):
            data = np.full((1, length), float(length), dtype=np.float32)
            tensor = grpcclient.InferInput("x", [1, length], "FP32")
            tensor.set_data_from_numpy(data)
            sent.append(data)
            client.async_infer(
                "ragged", [tensor], lambda result, error: results.append(result or error)
            )
        poll(lambda: len(results) == len(sent), 30, "three gRPC answers")
        by_length = {r.as_numpy("y").shape[1]: r.as_numpy("y") for r in results}  # type: ignore[attr-defined]
        for data in sent:
            # Run together or not, each answer is its own slice: x + its batch's count.
            y = by_length[data.shape[1]]
            assert y.shape == data.shape and (y - data).min() >= 1
    finally:
        client.close()
