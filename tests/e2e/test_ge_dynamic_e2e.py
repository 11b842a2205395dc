"""Models whose other dims vary, through the real `ge-serve` on the simulated NPU.

The MiniLM-, OCR-recognition- and OCR-detection-like stand-ins load on GE (not the host
CPU) and answer variable shapes correctly; a shape the model cannot run is a 400 that says
what it accepts; with --sim-cost the timing is modelled and the metrics say so.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from dynamic_models import det_folder, encoder_folder, rec_folder
from serverproc import running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def infer(
    client: httpclient.InferenceServerClient, model: str, feeds: dict[str, np.ndarray]
) -> httpclient.InferResult:
    inputs = []
    for name, array in feeds.items():
        tensor = httpclient.InferInput(
            name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT64"
        )
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return client.infer(model, inputs)


def expected(folder: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    # onnxruntime's run() is untyped; with no output names it returns every output's array.
    outputs: list[np.ndarray] = ort.InferenceSession(str(folder / "1" / "model.onnx")).run(
        None, feeds
    )
    return outputs


def test_variable_shape_models_serve_on_ge_through_the_server(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    encoder, rec, det = encoder_folder(repo), rec_folder(repo), det_folder(repo)
    flags = ["--device", "sim", "--sim-cost", "launch_us=200,per_sample_us=50"]
    with running_server([repo], flags) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        ids = np.arange(64, dtype=np.int64).reshape(4, 16) % 64
        feeds = {"INPUT_IDS": ids, "ATTENTION_MASK": np.ones((4, 16), np.int64)}
        result = infer(client, "encoder", feeds)
        np.testing.assert_allclose(
            result.as_numpy("EMBEDDING"), expected(encoder, feeds)[1], rtol=1e-6
        )
        for width in (40, 200):
            image = np.random.default_rng(width).random((2, 3, 32, width), np.float32)
            got = infer(client, "ocr_rec", {"X": image}).as_numpy("PROBS")
            np.testing.assert_allclose(got, expected(rec, {"X": image})[0], rtol=1e-5)
        image = np.random.default_rng(0).random((1, 3, 96, 128), np.float32)
        got = infer(client, "ocr_det", {"X": image}).as_numpy("MAP")
        np.testing.assert_allclose(got, expected(det, {"X": image})[0], rtol=1e-5)

        # A request between gears is padded up to one (seq 8 fits the (8, 8) gear); one
        # that fits none is refused, naming the gears as the scheduler's buckets.
        short = {"INPUT_IDS": ids[:, :5], "ATTENTION_MASK": np.ones((4, 5), np.int64)}
        got = infer(client, "encoder", short).as_numpy("EMBEDDING")
        np.testing.assert_allclose(got, expected(encoder, short)[1], rtol=1e-6)
        long = np.ones((1, 17), np.int64)
        with pytest.raises(
            InferenceServerException, match=r"fits none of its shape buckets.*INPUT_IDS\[16\]"
        ):
            infer(client, "encoder", {"INPUT_IDS": long, "ATTENTION_MASK": long})
        with pytest.raises(InferenceServerException, match=r"outside the model's shape range"):
            infer(client, "ocr_rec", {"X": np.zeros((1, 3, 32, 400), np.float32)})
        response = httpx.post(
            f"{server.base_url}/v2/models/ocr_rec/infer",
            json={
                "inputs": [
                    {
                        "name": "X",
                        "shape": [1, 3, 32, 400],
                        "datatype": "FP32",
                        "data": [0.0] * (3 * 32 * 400),
                    }
                ]
            },
            timeout=30,
        )
        assert response.status_code == 400
        assert "1~4, 3, 32, 32~320" in response.json()["error"]

        log = server.log()
        assert "host CPU" not in log
        assert "simulated timing 'custom'" in log
        metrics = httpx.get(server.metrics_url, timeout=10).text
        assert 'ge_serve_device_simulated_timing{device="sim0",profile="custom"} 1.0' in metrics
