"""The GE backend through the real `ge-serve` process and the real tritonclient.

- the example repository serves through GE on the simulated device, and says so;
- npu_ge-style configs (device_ids, device_exec_blocks, graph.ge.*, static_model) load
  unchanged and serve on 2 simulated devices;
- load failures (out of device memory, an OM on the simulated device) are clear;
- a failing execution fails only its request;
- with the fake pyACL and fake atc, `--device npu` serves through the real ACL shim.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from ge_helpers import (
    EXAMPLES,
    FAKE_ACL_SITE,
    FAKE_ATC_BIN,
    SIMPLE_IO,
    make_model,
    params,
)
from modelgen import gather_model, weights_model
from serverproc import ServerProcess, running_server, server_command
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CLASSIFIER = EXAMPLES / "image_classifier" / "1" / "model.onnx"
SIMPLE = EXAMPLES / "simple" / "1" / "model.onnx"


def infer_simple(
    client: httpclient.InferenceServerClient, model: str, batch: int, seed: int = 0
) -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32)
    inputs = [
        httpclient.InferInput("INPUT0", list(a.shape), "INT32"),
        httpclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def infer_classifier(client: httpclient.InferenceServerClient, model: str, batch: int) -> None:
    images = np.random.default_rng(batch).random((batch, 3, 64, 64), dtype=np.float32)
    request = httpclient.InferInput("image", list(images.shape), "FP32")
    request.set_data_from_numpy(images)
    result = client.infer(model, [request])
    session = ort.InferenceSession(str(CLASSIFIER), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"image": images})
    got = result.as_numpy("probabilities")
    assert got.shape == (batch, 10)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# --- the example repository --------------------------------------------------------------


def test_examples_serve_through_ge_on_the_simulated_device(server: ServerProcess) -> None:
    log = server.log()
    assert "GE backend: simulated NPU (1 device(s)" in log
    assert "chosen by --device auto: pyACL is not available" in log
    assert "model 'simple' version 1 on sim: 1 slot(s) on NPU 0, gears [1, 2, 4, 8]" in log
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.get_model_metadata("simple")["platform"] == "npu_ge"
    assert client.get_model_metadata("image_classifier")["platform"] == "npu_ge"
    # String tensors cannot live on an NPU: that model stays on the host CPU.
    assert client.get_model_metadata("simple_string")["platform"] == "onnxruntime_onnx"
    config = client.get_model_config("simple")
    assert config["backend"] == "ge"
    assert config["instance_group"][0]["kind"] == "KIND_MODEL"  # the backend places it
    for batch in (1, 3, 8):
        infer_simple(client, "simple", batch, seed=batch)
        infer_classifier(client, "image_classifier", batch)
    client.close()


def test_examples_through_ge_over_grpc(server: ServerProcess) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_server_live(client_timeout=3)
    images = np.random.default_rng(5).random((3, 3, 64, 64), dtype=np.float32)
    request = grpcclient.InferInput("image", [3, 3, 64, 64], "FP32")
    request.set_data_from_numpy(images)
    got = client.infer("image_classifier", [request]).as_numpy("probabilities")
    session = ort.InferenceSession(str(CLASSIFIER), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"image": images})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    a = np.arange(48, dtype=np.int32).reshape(3, 16)
    inputs = [grpcclient.InferInput("INPUT0", [3, 16], "INT32"),
              grpcclient.InferInput("INPUT1", [3, 16], "INT32")]  # fmt: skip
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a)
    client.close()


# --- npu_ge configs on 2 simulated devices -----------------------------------------------

NPU_GE_CLASSIFIER = """backend: "npu_ge"
max_batch_size: 8
input [ { name: "image" data_type: TYPE_FP32 dims: [ 3, 64, 64 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]
instance_group [ { count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 100 preferred_batch_size: [ 4, 8 ] }
""" + params(
    device_ids="0,1",
    device_exec_blocks="2",
    graph__dot__ge__dot__inputShape="image:-1,3,64,64",
    graph__dot__ge__dot__dynamicDims="1;2;4;8",
    graph__dot__ge__dot__dynamicNodeType="1",
)

NPU_GE_STATIC = (
    'backend: "npu_ge"\n'
    + SIMPLE_IO.replace("dims: [ 16 ]", "dims: [ 2, 16 ]")
    + "instance_group [ { count: 2 } ]\n"
    + params(static_model="1", device_ids="1")
)

GATHER = """backend: "npu_ge"
max_batch_size: 4
input [ { name: "DATA" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "INDEX" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

WARMED = (
    "max_batch_size: 8\n"
    + SIMPLE_IO
    + """model_warmup [ {
  name: "zeros" batch_size: 3
  inputs { key: "INPUT0" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } }
  inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 16 ] zero_data: true } }
} ]
"""
)


@pytest.fixture(scope="module")
def npu_ge_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("npu_ge_repo")
    make_model(repo, "classifier", NPU_GE_CLASSIFIER, CLASSIFIER)
    make_model(repo, "simple_static", NPU_GE_STATIC, SIMPLE)
    make_model(repo, "gather", GATHER, onnx_model=gather_model())
    make_model(repo, "warmed", WARMED, SIMPLE)
    with running_server([repo], ["--sim-devices", "2"]) as proc:
        yield proc


def test_npu_ge_config_loads_unchanged_and_serves(npu_ge_server: ServerProcess) -> None:
    log = npu_ge_server.log()
    assert "model 'classifier' version 1 on sim: 4 slot(s) on NPU 0,1, gears [1, 2, 4, 8]" in log
    client = httpclient.InferenceServerClient(npu_ge_server.http_url)
    assert client.get_model_metadata("classifier")["platform"] == "npu_ge"
    for batch in (1, 3, 5, 8):
        infer_classifier(client, "classifier", batch)
    client.close()


def test_static_model_serves(npu_ge_server: ServerProcess) -> None:
    # Not batching (max_batch_size 0): the fixed shape as it is, no loop.
    assert "model 'simple_static' version 1 on sim: 2 slot(s) on NPU 1, no batch gears" in (
        npu_ge_server.log()
    )
    client = httpclient.InferenceServerClient(npu_ge_server.http_url)
    infer_simple(client, "simple_static", 2)
    client.close()


def test_warmup_ran_before_ready(npu_ge_server: ServerProcess) -> None:
    log = npu_ge_server.log()
    warmed = log.index("model 'warmed' version 1: 1 warmup sample(s) ran on 1 slot(s)")
    assert warmed < log.index("Started HTTPService")
    client = httpclient.InferenceServerClient(npu_ge_server.http_url)
    assert client.is_model_ready("warmed")
    infer_simple(client, "warmed", 3)
    client.close()


def test_failing_execution_fails_only_its_request(npu_ge_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(npu_ge_server.http_url)
    data = np.arange(8, dtype=np.float32).reshape(2, 4)

    def gather(index: list[list[int]]) -> np.ndarray:
        inputs = [
            httpclient.InferInput("DATA", [2, 4], "FP32"),
            httpclient.InferInput("INDEX", [2, 1], "INT64"),
        ]
        inputs[0].set_data_from_numpy(data)
        inputs[1].set_data_from_numpy(np.array(index, dtype=np.int64))
        return client.infer("gather", inputs).as_numpy("OUT")  # type: ignore[no-any-return]

    with pytest.raises(InferenceServerException) as raised:
        gather([[9], [0]])
    assert "BackendError" in str(raised.value) and "model execution failed" in str(raised.value)
    assert raised.value.status() == "500"
    assert gather([[1], [3]]).tolist() == [[1.0], [7.0]]
    infer_simple(client, "warmed", 2)
    client.close()


# --- load failures -----------------------------------------------------------------------


def test_out_of_memory_and_om_on_sim_fail_their_loads(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    body = """max_batch_size: 1
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1048576 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1048576 ] } ]
"""
    make_model(repo, "heavy", body, onnx_model=weights_model(4))
    om_config = 'backend: "npu_ge"\ndefault_model_filename: "model.om"\nmax_batch_size: 8\n'
    offline = make_model(repo, "offline", om_config + SIMPLE_IO)
    (offline / "1" / "model.om").write_bytes(b"an offline model")
    make_model(repo, "simple", "max_batch_size: 8\n" + SIMPLE_IO, SIMPLE)
    extra = ["--exit-on-error", "false", "--strict-readiness", "false"]
    extra += ["--sim-device-memory", "3MiB", "--device", "sim"]
    with running_server([repo], extra) as proc:
        index = httpx.post(proc.base_url + "/v2/repository/index", json={}).json()
        reasons = {row["name"]: row for row in index}
        assert reasons["heavy"]["state"] == "UNAVAILABLE"
        assert (
            "out of memory: simulated NPU 0 cannot fit the weights of model 'model.onnx' (4.0 MiB)"
            in reasons["heavy"]["reason"]
        )
        assert "--sim-device-memory" in reasons["heavy"]["reason"]
        assert reasons["offline"]["state"] == "UNAVAILABLE"
        assert "only an Ascend NPU can run" in reasons["offline"]["reason"]
        assert reasons["simple"]["state"] == "READY"
        client = httpclient.InferenceServerClient(proc.http_url)
        infer_simple(client, "simple", 4)
        client.close()
        assert "GE backend: simulated NPU (1 device(s), 3.0 MiB each" in proc.log()
        assert "chosen by --device sim" in proc.log()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--device", "npu"], "--device npu: pyACL cannot be imported (No module named 'acl')"),
        (["--sim-devices", "0"], "--sim-devices must be at least 1, not 0"),
    ],
)
def test_an_impossible_device_exits_with_a_clear_error(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    cmd = server_command([EXAMPLES], flags, (0, 0, 0))
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert done.returncode == 1
    assert message in done.stderr
    assert "Traceback" not in done.stderr


# --- the real ACL shim under the server, on the fake pyACL and fake atc ------------------


def test_device_npu_serves_through_pyacl(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLES / "simple", repo / "simple")
    make_model(repo, "classifier", NPU_GE_CLASSIFIER.replace('"0,1"', '"0"'), CLASSIFIER)
    atc_log = tmp_path / "atc.log"
    env = {
        "PYTHONPATH": os.pathsep.join([str(FAKE_ACL_SITE), os.environ.get("PYTHONPATH", "")]),
        "PATH": f"{FAKE_ATC_BIN}{os.pathsep}{os.environ['PATH']}",
        "FAKE_ATC_LOG": str(atc_log),
        "FAKE_ACL_DEVICES": "1",
    }
    extra = ["--device", "npu", "--atc-cache-dir", str(tmp_path / "om")]
    with running_server([repo], extra, env=env) as proc:
        log = proc.log()
        assert "GE backend: Ascend NPU via pyACL (1 device(s), SoC Ascend310P3)" in log
        assert "chosen by --device npu: pyACL reports 1 NPU device(s)" in log
        assert "model 'simple' version 1 on npu: 1 slot(s) on NPU 0" in log
        assert "compiled by atc" in log
        client = httpclient.InferenceServerClient(proc.http_url)
        for batch in (1, 3, 8):
            infer_simple(client, "simple", batch, seed=batch)
            infer_classifier(client, "classifier", batch)
        client.close()
        # At exit every slot released its pyACL resources: the fake's acl.finalize, which
        # fails while anything is held, succeeded.
        assert proc.stop() == 0
        assert "closing backend 'ge' failed" not in proc.log()
        assert "stopped" in proc.log()
    assert len(atc_log.read_text().splitlines()) == 2
