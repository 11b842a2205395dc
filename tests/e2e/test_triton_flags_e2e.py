"""The Triton flags that ge-serve honours, seen from outside: the log file and format, the
server id, custom model configs, gRPC TLS with response compression, the rate limiter,
auto-complete's default-max-batch-size and the one warning for flags that do nothing here."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from certs import make_tls_files
from modelgen import add_sub_model, write_model
from serverproc import running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CONFIG = """
name: "add_sub"
backend: "onnxruntime"
max_batch_size: {mbs}
input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }},
        {{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }},
         {{ name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU
  rate_limiter {{ resources [ {{ name: "R1" count: 2 }} ] priority: 1 }} }} ]
"""


def test_a_triton_launch_line_is_honoured(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    folder = write_model(repo, "add_sub", add_sub_model(), CONFIG.format(mbs=8))
    (folder / "configs").mkdir()
    (folder / "configs" / "small.pbtxt").write_text(CONFIG.format(mbs=2))
    # More of R1 than the limit gives: it could never run, so it must not load.
    hungry = CONFIG.format(mbs=8).replace("add_sub", "hungry").replace("count: 2", "count: 3")
    write_model(repo, "hungry", add_sub_model(), hungry)
    # R1 both per device and global: Triton refuses the load; the others serve on.
    split = hungry.replace("hungry", "split").replace("count: 3", "count: 1")
    split = split.replace(
        "priority: 1 } } ]",
        "priority: 1 } },\n  { count: 1 kind: KIND_CPU\n"
        '  rate_limiter { resources [ { name: "R1" global: true count: 1 } ] } } ]',
    )
    write_model(repo, "split", add_sub_model(), split)
    # Auto-completed: its max_batch_size is the backend's default-max-batch-size.
    write_model(repo, "auto", add_sub_model(), 'backend: "onnxruntime"\n')
    tls = make_tls_files(tmp_path)
    log_file = tmp_path / "server.log"
    flags = [
        f"--log-file={log_file}",
        "--log-format=ISO8601",
        "--id=edge-triton",
        "--model-config-name=small",
        "--model-load-thread-count=1",
        "--grpc-use-ssl=true",
        f"--grpc-server-cert={tls.cert}",
        f"--grpc-server-key={tls.key}",
        "--grpc-infer-response-compression-level=high",
        "--rate-limit=execution_count",
        "--rate-limit-resource=R1:2",
        "--exit-on-error=false",
        "--strict-readiness=false",
        "--pinned-memory-pool-byte-size=268435456",
        "--backend-directory=/opt/tritonserver/backends",
        "--backend-config=default-max-batch-size=6",
        "--backend-config=onnxruntime,default-max-batch-size=3",
    ]
    with running_server([repo], flags) as server:
        http = httpclient.InferenceServerClient(server.http_url)
        assert http.get_server_metadata()["name"] == "edge-triton"
        assert http.get_model_config("add_sub")["max_batch_size"] == 2, "configs/small.pbtxt"
        auto = http.get_model_config("auto")
        assert auto["max_batch_size"] == 3 and "dynamic_batching" in auto
        index = {m["name"]: m for m in http.get_model_repository_index()}
        assert index["hungry"]["state"] == "UNAVAILABLE"
        assert (
            'Resource count for "r1" is limited to 2 which will prevent scheduling of one or '
            "more model instances, the minimum required count is 3"
        ) in index["hungry"]["reason"]
        assert index["split"]["state"] == "UNAVAILABLE"
        assert (
            'Resource "r1" is present as both global and device-specific resource in the '
            "model configuration."
        ) in index["split"]["reason"]

        secure = grpcclient.InferenceServerClient(
            server.grpc_url, ssl=True, root_certificates=str(tls.ca)
        )
        a = np.arange(8, dtype=np.float32).reshape(2, 4)
        inputs = []
        for name in ("A", "B"):
            tensor = grpcclient.InferInput(name, [2, 4], "FP32")
            tensor.set_data_from_numpy(a)
            inputs.append(tensor)
        result = secure.infer("add_sub", inputs)
        np.testing.assert_array_equal(result.as_numpy("SUM"), a * 2)
        secure.close()

        plain = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
        plain.close()
        http.close()
    text = log_file.read_text()
    assert re.search(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", text, re.M), text[:500]
    warnings = [line for line in text.splitlines() if "Triton compatibility" in line]
    assert len(warnings) == 1
    assert "--pinned-memory-pool-byte-size" in warnings[0]
    assert "--backend-directory" not in warnings[0], "honoured (Python-based backends)"
