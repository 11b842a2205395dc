"""BYTES elements carry arbitrary bytes: 0x80-0xFF (not UTF-8) round-trip through an
onnxruntime string identity model over HTTP's binary extension and gRPC; a JSON response
refuses them (400, naming the output); UTF-8 text reaches the model as the same bytes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from modelgen import identity_model, write_model
from onnx import TensorProto
from serverproc import ServerProcess, running_server
from tritonclient.utils import InferenceServerException

from ge_serve.backends.onnxruntime import OrtSession, rows_are_requests
from ge_serve.backends.ort_options import session_options
from ge_serve.protos import model_config_pb2

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HIGH = bytes(range(0x80, 0x100))
# Each high byte alone, the whole run, text, and an empty element.
ELEMENTS = [bytes([b]) for b in HIGH] + [HIGH, "héllo €".encode(), b"", b"\x00\xff\x00"]


def elements() -> npt.NDArray[np.object_]:
    array = np.empty((1, len(ELEMENTS)), dtype=object)
    array[0, :] = ELEMENTS
    return array


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("models")
    write_model(repo, "strings", identity_model(TensorProto.STRING))
    with running_server([repo]) as proc:
        yield proc


def test_http_binary(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    data = elements()
    tensor = httpclient.InferInput("INPUT", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data, binary_data=True)
    out = httpclient.InferRequestedOutput("OUTPUT", binary_data=True)
    result = client.infer("strings", [tensor], outputs=[out])
    assert result.as_numpy("OUTPUT").tolist() == data.tolist()
    client.close()


def test_http_json_request_and_response(server: ServerProcess) -> None:
    """JSON strings are Unicode: U+0080-U+00FF travel as their UTF-8 and come back as the
    same characters."""
    text = [chr(b) for b in HIGH] + ["héllo €", ""]
    body = {
        "inputs": [{"name": "INPUT", "shape": [1, len(text)], "datatype": "BYTES", "data": text}],
        "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": False}}],
    }
    reply = httpx.post(f"{server.base_url}/v2/models/strings/infer", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == text


REFUSED = (
    "output 'OUTPUT' holds BYTES that are not valid UTF-8, which a JSON response cannot "
    'carry; request it as binary data ("binary_data": true on the output, or '
    '"binary_data_output": true on the request)'
)


@pytest.mark.parametrize("how", ["binary_data=false", "no binary parameter"])
def test_http_json_response_refuses_bytes_that_are_not_utf8(
    server: ServerProcess, how: str
) -> None:
    """Raw high bytes sent binary and asked back as JSON: JSON cannot hold them, so the
    request is refused, naming the output and the binary extension (Triton refuses to
    put them in JSON too)."""
    data = elements()
    raw = b"".join(len(e).to_bytes(4, "little") + e for e in ELEMENTS)
    head: dict[str, object] = {
        "inputs": [
            {
                "name": "INPUT",
                "shape": list(data.shape),
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
    }
    if how == "binary_data=false":
        head["outputs"] = [{"name": "OUTPUT", "parameters": {"binary_data": False}}]
    header = json.dumps(head).encode()
    reply = httpx.post(
        f"{server.base_url}/v2/models/strings/infer",
        content=header + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=30,
    )
    assert reply.status_code == 400, reply.text
    assert reply.json() == {"error": REFUSED}
    # tritonclient's JSON output request meets the same refusal.
    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("INPUT", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data, binary_data=True)
    out = httpclient.InferRequestedOutput("OUTPUT", binary_data=False)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("strings", [tensor], outputs=[out])
    assert caught.value.message() == REFUSED
    # Asked for as binary, on the output or the request, the same bytes come back.
    for outputs in ([httpclient.InferRequestedOutput("OUTPUT", binary_data=True)], None):
        result = client.infer("strings", [tensor], outputs=outputs)
        assert result.as_numpy("OUTPUT").tolist() == data.tolist()
    client.close()


def test_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    data = elements()
    tensor = grpcclient.InferInput("INPUT", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    result = client.infer("strings", [tensor])
    assert result.as_numpy("OUTPUT").tolist() == data.tolist()
    client.close()


def _session(tmp_path: Path, model: bytes, rows_apart: bool = False) -> OrtSession:
    path = tmp_path / "model.onnx"
    path.write_bytes(model)
    return OrtSession(path, session_options(model_config_pb2.ModelConfig(), 1), rows_apart)


def _labels_model() -> bytes:
    """A LabelEncoder keyed by UTF-8 text: "héllo" is 1, "plain" 2, anything else -1."""
    from onnx import helper

    node = helper.make_node(
        "LabelEncoder",
        ["IN"],
        ["OUT"],
        domain="ai.onnx.ml",
        keys_strings=["héllo", "plain"],
        values_int64s=[1, 2],
        default_int64=-1,
    )
    graph = helper.make_graph(
        [node],
        "labels",
        [helper.make_tensor_value_info("IN", TensorProto.STRING, [None])],
        [helper.make_tensor_value_info("OUT", TensorProto.INT64, [None])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 2)],
    )
    model.ir_version = 8
    return model.SerializeToString()


def _strings(*values: bytes) -> npt.NDArray[np.object_]:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def test_utf8_text_reaches_string_ops_byte_for_byte(tmp_path: Path) -> None:
    """A LabelEncoder keyed by UTF-8 text matches text sent as UTF-8 bytes; a latin-1
    reading of all strings would miss the key."""
    session = _session(tmp_path, _labels_model())
    words = _strings("héllo".encode(), b"plain", b"other")
    assert session.run({"IN": words})["OUT"].tolist() == [1, 2, -1]


def test_one_rows_bytes_do_not_change_how_other_rows_are_read(tmp_path: Path) -> None:
    """Rows of a batching model are other clients' requests once batched: a row that is
    not UTF-8 runs apart, and the text beside it still matches its key."""
    session = _session(tmp_path, _labels_model(), rows_apart=True)
    words = _strings("héllo".encode(), b"\xff", b"plain")
    assert session.run({"IN": words})["OUT"].tolist() == [1, -1, 2]
    # A pass-through returns every row's bytes, in row order.
    model = identity_model(TensorProto.STRING).SerializeToString()
    identity = _session(tmp_path, model, rows_apart=True)
    rows = np.empty((3, 2), dtype=object)
    rows[:] = [[b"\xff", b"a"], ["é".encode(), b"b"], [b"\x80\x81", HIGH]]
    assert identity.run({"INPUT": rows})["OUTPUT"].tolist() == rows.tolist()


def test_rows_whose_outputs_cannot_fit_together_run_as_one(tmp_path: Path) -> None:
    """A split's output width depends on its data: the rows' two executions give widths 3
    and 2, so the execution runs once instead, read as latin-1, and answers."""
    from onnx import helper

    node = helper.make_node("StringSplit", ["X"], ["Y", "N"], delimiter=" ")
    graph = helper.make_graph(
        [node],
        "split",
        [helper.make_tensor_value_info("X", TensorProto.STRING, [None])],
        [
            helper.make_tensor_value_info("Y", TensorProto.STRING, [None, None]),
            helper.make_tensor_value_info("N", TensorProto.INT64, [None]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    session = _session(tmp_path, model.SerializeToString(), rows_apart=True)
    out = session.run({"X": _strings(b"a b c", b"\xff x")})
    assert out["Y"].tolist() == [[b"a", b"b", b"c"], [b"\xff", b"x", b""]]
    assert out["N"].tolist() == [3, 2]


def test_rows_run_apart_only_where_each_row_is_one_requests() -> None:
    config = model_config_pb2.ModelConfig(max_batch_size=8)
    assert rows_are_requests(config)
    config.input.add(name="IN", allow_ragged_batch=True)
    assert not rows_are_requests(config)
    assert not rows_are_requests(model_config_pb2.ModelConfig(max_batch_size=0))
