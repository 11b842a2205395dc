"""Huge `priority_levels` load and serve, over HTTP and gRPC.

Triton's qa loads a model with `priority_levels: 18446744073709551615` and
`default_priority_level: 4294967296`. Levels are sparse in ge-serve (scheduler/queue.py),
so the load costs what two levels cost and any level in range is served.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from modelgen import batch_probe_model
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

MODEL = "huge_levels"
CONFIG = f"""name: "{MODEL}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }},
  {{ name: "BATCH" data_type: TYPE_FP32 dims: [ 1 ] }}
]
dynamic_batching {{
  priority_levels: 18446744073709551615
  default_priority_level: 4294967296
}}
"""
# A hang here would be the old one queue per level; a load never takes this long.
LOAD_BOUND_S = 30.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("levels-repo")
    (repo / MODEL / "1").mkdir(parents=True)
    onnx.save(batch_probe_model(), str(repo / MODEL / "1" / "model.onnx"))
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    with running_server([repo], ["--model-control-mode=explicit"]) as proc:
        yield proc


def test_the_model_loads_and_serves_priorities_1_and_2_pow_32(server: ServerProcess) -> None:
    started = time.monotonic()
    loaded = httpx.post(
        server.base_url + f"/v2/repository/models/{MODEL}/load", timeout=LOAD_BOUND_S
    )
    load_s = time.monotonic() - started
    assert loaded.status_code == 200, loaded.text
    print(f"load took {load_s:.3f} s")
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert http.is_model_ready(MODEL)
        for priority in (1, 2**32, 0, 2**64 - 1):
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(data)
            result = http.infer(MODEL, [tensor], priority=priority)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
            gtensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            gtensor.set_data_from_numpy(data)
            gresult = grpc.infer(MODEL, [gtensor], priority=priority)
            np.testing.assert_array_equal(gresult.as_numpy("OUTPUT0"), data)
    finally:
        http.close()
        grpc.close()
