"""npu_ge's meanings through the real `ge-serve` on the simulated NPU with its cost profile:
GE dynamic shape (a BERT-like encoder with -1 sequence dims and no gears loads on GE
whether its config names npu_ge or no backend at all, serves lengths 5 to 200, and the
log names the mode), and `instance_exec_blocks: 2`, which the device metrics show as two
graph executions per batch."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from dynamic_models import dynamic_encoder_folder
from ge_helpers import (
    EXAMPLES,
    FAKE_ACL_SITE,
    FAKE_ATC_BIN,
    SIMPLE_IO,
    make_model,
    params,
    simple_inputs,
)
from polling import poll
from serverproc import running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_a_bert_with_minus_one_lengths_serves_on_ge_named_or_not(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    named = dynamic_encoder_folder(repo, "bert_npu_ge")
    dynamic_encoder_folder(repo, "bert_plain", backend=False)
    session = ort.InferenceSession(str(named / "1" / "model.onnx"))
    flags = ["--device", "sim", "--sim-cost", "default"]
    with running_server([repo], flags) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        for model in ("bert_npu_ge", "bert_plain"):
            for length in (5, 37, 128, 200):
                ids = (np.arange(2 * length, dtype=np.int64).reshape(2, length) * 7) % 64
                mask = np.ones_like(ids)
                inputs = []
                for name, array in (("INPUT_IDS", ids), ("ATTENTION_MASK", mask)):
                    tensor = httpclient.InferInput(name, list(array.shape), "INT64")
                    tensor.set_data_from_numpy(array)
                    inputs.append(tensor)
                result = client.infer(model, inputs)
                hidden, embedding = session.run(None, {"INPUT_IDS": ids, "ATTENTION_MASK": mask})
                np.testing.assert_allclose(result.as_numpy("LAST_HIDDEN"), hidden, rtol=1e-6)
                np.testing.assert_allclose(result.as_numpy("EMBEDDING"), embedding, rtol=1e-6)
            config = client.get_model_config(model)
            assert config["backend"] in ("ge", "npu_ge")
        log = server.log()
        assert "host CPU" not in log
        for model in ("bert_npu_ge", "bert_plain"):
            line = next(x for x in log.splitlines() if f"model '{model}' version 1 on sim" in x)
            assert "mode: GE dynamic shape (INPUT_IDS:1~8,-1;ATTENTION_MASK:1~8,-1)" in line
            assert "simulated timing 'npu_ge_resnet50'" in line


def test_instance_exec_blocks_runs_two_graph_executions_per_batch(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    # On its own simulated device, so the device's executions are this model's alone.
    body = "max_batch_size: 8\n" + SIMPLE_IO
    body += params(instance_exec_blocks="2", device_ids="1")
    make_model(repo, "blocks", body, EXAMPLES / "simple" / "1" / "model.onnx")
    flags = ["--device", "sim", "--sim-devices", "2", "--metrics-interval-ms", "50"]
    with running_server([repo], flags) as server:
        client = httpclient.InferenceServerClient(server.http_url)

        def executions() -> float | None:
            text = httpx.get(server.metrics_url, timeout=10).text
            found = re.search(r'ge_serve_device_executions_total\{device="sim1"\} (\S+)', text)
            return float(found.group(1)) if found else None

        # The load's accuracy check ran its two batch-1 inputs (one graph each) already.
        assert poll(lambda: executions() == 2.0, 30, "the accuracy check's executions")
        feeds = simple_inputs(4)
        inputs = []
        for name, array in feeds.items():
            tensor = httpclient.InferInput(name, list(array.shape), "INT32")
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        result = client.infer("blocks", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), feeds["INPUT0"] + feeds["INPUT1"])
        # One batch of 4: two graph executions of 2 rows each.
        assert poll(lambda: executions() == 4.0, 30, "two graph executions on sim1")
        assert "1 slot(s) of 2 graphs each (instance_exec_blocks)" in server.log()


def test_on_pyacl_a_bert_naming_no_backend_compiles_as_ge_dynamic_shape(tmp_path: Path) -> None:
    # The real ACL shim under the server, on the fake pyACL and fake atc.
    repo = tmp_path / "repo"
    folder = dynamic_encoder_folder(repo, "bert_plain", backend=False)
    session = ort.InferenceSession(str(folder / "1" / "model.onnx"))
    atc_log = tmp_path / "atc.log"
    env = {
        "PYTHONPATH": os.pathsep.join([str(FAKE_ACL_SITE), os.environ.get("PYTHONPATH", "")]),
        "PATH": f"{FAKE_ATC_BIN}{os.pathsep}{os.environ['PATH']}",
        "FAKE_ATC_LOG": str(atc_log),
    }
    extra = ["--device", "npu", "--atc-cache-dir", str(tmp_path / "om")]
    with running_server([repo], extra, env=env) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        for length in (5, 200):
            ids = (np.arange(length, dtype=np.int64).reshape(1, length) * 3) % 64
            inputs = []
            for name, array in (("INPUT_IDS", ids), ("ATTENTION_MASK", np.ones_like(ids))):
                tensor = httpclient.InferInput(name, list(array.shape), "INT64")
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            got = client.infer("bert_plain", inputs).as_numpy("LAST_HIDDEN")
            expected = session.run(None, {"INPUT_IDS": ids, "ATTENTION_MASK": np.ones_like(ids)})
            np.testing.assert_allclose(got, expected[0], rtol=1e-6)
        log = server.log()
        assert "model 'bert_plain' version 1 on npu" in log
        assert "mode: GE dynamic shape (INPUT_IDS:1~8,-1;ATTENTION_MASK:1~8,-1)" in log
        assert server.stop() == 0  # every pyACL resource released (the fake's finalize)
    (argv,) = [json.loads(line) for line in atc_log.read_text().splitlines()]
    assert "--input_shape=INPUT_IDS:1~8,-1;ATTENTION_MASK:1~8,-1" in argv
