"""Optional inputs of ONNX models, as Triton's onnxruntime backend takes them.

Triton's qa/L0_initializer_as_input: an initializer that is also a graph input (an
overridable initializer) may be listed as an `optional` input; a request without it
uses the stored value, a request with it the sent value. An optional input that the
model requires, or any optional input of a batching model, is refused at load with
Triton's reason (onnxruntime_backend ValidateInputs), not loaded to fail requests.
The GE backend compiles initializers into the graph, so it refuses such an input.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from modelgen import write_model
from onnx import TensorProto, helper, numpy_helper
from serverproc import ServerProcess, running_server, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

FP32 = TensorProto.FLOAT

# Triton's qa/L0_initializer_as_input config.pbtxt, less its platform line.
INITIALIZER_IO = """
input [
  { name: "INPUT" data_type: TYPE_FP32 dims: [ 5, 5 ] },
  { name: "INITIALIZER" data_type: TYPE_FP32 dims: [ 5, 5 ] optional: true }
]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 5, 5 ] } ]
"""


def add_with_initializer(shape: Sequence[int | str], stored: tuple[int, ...]) -> onnx.ModelProto:
    """OUTPUT = INPUT + INITIALIZER, INITIALIZER a graph input stored as all ones (Triton's
    qa/L0_initializer_as_input generate_test_model.py, with shapes to choose)."""
    value = helper.make_tensor("INITIALIZER", FP32, stored, np.ones(stored).flatten().tolist())
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT", "INITIALIZER"], ["OUTPUT"])],
        "init_input",
        [
            helper.make_tensor_value_info("INPUT", FP32, shape),
            helper.make_tensor_value_info("INITIALIZER", FP32, stored),
        ],
        [helper.make_tensor_value_info("OUTPUT", FP32, shape)],
        initializer=[value],
    )
    return helper.make_model(graph, producer_name="triton")


def add_two(dims: list[int | str], stored: bool = False) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1 (+ INITIALIZER, a stored [16] of ones, when `stored`)."""
    inputs = [helper.make_tensor_value_info(n, FP32, dims) for n in ("INPUT0", "INPUT1")]
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["SUM" if stored else "OUTPUT0"])]
    initializers = []
    if stored:
        nodes.append(helper.make_node("Add", ["SUM", "INITIALIZER"], ["OUTPUT0"]))
        inputs.append(helper.make_tensor_value_info("INITIALIZER", FP32, [16]))
        initializers.append(helper.make_tensor("INITIALIZER", FP32, [16], [1.0] * 16))
    graph = helper.make_graph(
        nodes,
        "add_two",
        inputs,
        [helper.make_tensor_value_info("OUTPUT0", FP32, dims)],
        initializer=initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def add_two_config(max_batch_size: int, optional: str, extra: str = "") -> str:
    inputs = [
        f'{{ name: "{name}" data_type: TYPE_FP32 dims: [ 16 ]'
        f"{' optional: true' if name == optional else ''} }}"
        for name in ("INPUT0", "INPUT1")
    ]
    return (
        f'platform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {', '.join(inputs)}{extra} ]\n"
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
    )


def string_initializer() -> onnx.ModelProto:
    """OUTPUT = INITIALIZER, a BYTES graph input stored as "stored"; ECHO = INPUT."""
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["INITIALIZER"], ["OUTPUT"]),
            helper.make_node("Identity", ["INPUT"], ["ECHO"]),
        ],
        "string_initializer",
        [
            helper.make_tensor_value_info(n, TensorProto.STRING, [1])
            for n in ("INPUT", "INITIALIZER")
        ],
        [helper.make_tensor_value_info(n, TensorProto.STRING, [1]) for n in ("OUTPUT", "ECHO")],
        initializer=[numpy_helper.from_array(np.array([b"stored"], dtype=object), "INITIALIZER")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


STRING_CONFIG = """platform: "onnxruntime_onnx"
input [
  { name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "INITIALIZER" data_type: TYPE_STRING dims: [ 1 ] optional: true }
]
output [
  { name: "OUTPUT" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "ECHO" data_type: TYPE_STRING dims: [ 1 ] }
]
"""


# model name -> its load error, exactly
REFUSED = {
    # Triton does not count optional inputs among those the model must take.
    "opt_nobatch": "unable to load model 'opt_nobatch', configuration expects 1 inputs, "
    "model provides 2",
    "opt_batch": "unable to load model 'opt_batch', configuration expects 1 inputs, "
    "model provides 2",
    "initializer_batch": "unable to load model 'initializer_batch', optional input "
    "'INITIALIZER' is not supported for models that support batching",
    # Triton's count passes (the initializer listed as required makes it up) and every
    # request without INPUT1 would fail in onnxruntime: ge-serve refuses it.
    "optional_required": "unable to load model 'optional_required', optional input(s) "
    "['INPUT1'] are required by the model: only an overridable initializer may be optional",
    "ge_initializer": "unable to load model 'ge_initializer', input 'INITIALIZER' is an "
    "initializer of the model, which the GE backend compiles into the graph as a constant "
    "and cannot take from a request; remove it from the config's inputs (the stored value "
    "is used), or serve the model with the onnxruntime backend",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("optional")
    square = add_with_initializer((5, 5), (5, 5))
    write_model(repo, "add_with_initializer", square, 'platform: "onnxruntime_onnx"\n'
                'max_batch_size: 0\n' + INITIALIZER_IO)  # fmt: skip
    write_model(repo, "ge_initializer", square, 'backend: "npu_ge"\n' + INITIALIZER_IO)
    write_model(repo, "opt_nobatch", add_two([16]), add_two_config(0, "INPUT1"))
    write_model(repo, "opt_batch", add_two(["N", 16]), add_two_config(8, "INPUT1"))
    batching = INITIALIZER_IO.replace("[ 5, 5 ]", "[ 5 ]")
    write_model(repo, "initializer_batch", add_with_initializer(("N", 5), (1, 5)),
                'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n' + batching)  # fmt: skip
    stored = ', { name: "INITIALIZER" data_type: TYPE_FP32 dims: [ 16 ] }'
    write_model(repo, "optional_required", add_two([16], stored=True),
                add_two_config(0, "INPUT1", stored))  # fmt: skip
    write_model(repo, "string_initializer", string_initializer(), STRING_CONFIG)
    extra = ["--exit-on-error=false", "--strict-readiness=false", "--device", "sim"]
    extra += ["--model-control-mode=explicit", "--load-model=*"]
    with running_server([repo], extra, wait_ready=False) as proc:
        wait_for(proc, "/v2/health/ready", 60)
        yield proc


def infer_http(server: ServerProcess, *initializer: float) -> list[float]:
    data = np.zeros((5, 5), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT", [5, 5], "FP32")]
    inputs[0].set_data_from_numpy(data, binary_data=False)
    for value in initializer:
        inputs.append(httpclient.InferInput("INITIALIZER", [5, 5], "FP32"))
        inputs[-1].set_data_from_numpy(np.full((5, 5), value, np.float32), binary_data=False)
    client = httpclient.InferenceServerClient(server.http_url)
    result = client.infer("add_with_initializer", inputs).as_numpy("OUTPUT")
    assert result is not None
    return sorted(set(result.flatten().tolist()))


def test_a_request_without_the_initializer_uses_the_stored_value(server: ServerProcess) -> None:
    assert infer_http(server) == [1.0]  # 0 + the stored ones


def test_a_request_with_the_initializer_uses_the_sent_value(server: ServerProcess) -> None:
    assert infer_http(server, 7.0) == [7.0]


def test_grpc_sends_the_initializer_too(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = [grpcclient.InferInput(name, [5, 5], "FP32") for name in ("INPUT", "INITIALIZER")]
    inputs[0].set_data_from_numpy(np.full((5, 5), 2.0, np.float32))
    inputs[1].set_data_from_numpy(np.full((5, 5), 3.0, np.float32))
    result = client.infer("add_with_initializer", inputs).as_numpy("OUTPUT")
    assert result is not None
    np.testing.assert_array_equal(result, np.full((5, 5), 5.0, np.float32))
    only = client.infer("add_with_initializer", inputs[:1]).as_numpy("OUTPUT")
    assert only is not None
    np.testing.assert_array_equal(only, np.full((5, 5), 3.0, np.float32))


def test_a_bytes_initializer_arrives_as_sent(server: ServerProcess) -> None:
    def infer(*sent: str) -> list[str]:
        inputs = [{"name": "INPUT", "shape": [1], "datatype": "BYTES", "data": ["in"]}]
        for text in sent:
            inputs.append(
                {"name": "INITIALIZER", "shape": [1], "datatype": "BYTES", "data": [text]}
            )
        url = server.base_url + "/v2/models/string_initializer/infer"
        response = httpx.post(url, json={"inputs": inputs}, timeout=30)
        assert response.status_code == 200, response.text
        outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
        return [*outputs["OUTPUT"], *outputs["ECHO"]]

    assert infer() == ["stored", "in"]
    assert infer("sent") == ["sent", "in"]


@pytest.mark.parametrize("name", list(REFUSED))
def test_an_optional_input_the_model_cannot_leave_out_fails_the_load(
    server: ServerProcess, name: str
) -> None:
    rows = httpx.post(server.base_url + "/v2/repository/index", timeout=10).json()
    (row,) = [row for row in rows if row["name"] == name]
    assert (row["state"], row.get("reason")) == ("UNAVAILABLE", REFUSED[name]), row
    # The load API answers with the same reason, as a 400.
    response = httpx.post(server.base_url + f"/v2/repository/models/{name}/load", timeout=30)
    assert response.status_code == 400, response.text
    assert REFUSED[name] in response.json()["error"]
