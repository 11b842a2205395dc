"""Device metrics on the simulated NPU are real figures: busy under load, memory = models."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from polling import poll
from promtext import Exposition, scrape
from serverproc import running_server


def _infer_until(url: str, stop: threading.Event, errors: list[str]) -> None:
    client = httpclient.InferenceServerClient(url)
    image = np.random.default_rng(0).standard_normal((4, 3, 64, 64)).astype(np.float32)
    request = httpclient.InferInput("image", list(image.shape), "FP32")
    request.set_data_from_numpy(image)
    try:
        while not stop.is_set():
            try:
                client.infer("image_classifier", [request])
            except Exception as exc:  # every failure is reported, none is fatal here
                errors.append(str(exc))
    finally:
        client.close()


def _sampled(url: str) -> Exposition | None:
    """A scrape that holds the device gauges: they appear with the sampler's first
    reading, which a loaded machine may not have taken when the server reports ready."""
    exposition = scrape(url)
    return exposition if exposition.find("ge_serve_device_memory_used_bytes") else None


def _device(exposition: Exposition, name: str) -> float:
    return exposition.value(name, device="sim0")


@pytest.mark.timeout(120)
def test_sim_device_busy_under_load_and_memory_matches_models() -> None:
    # A short sampling interval so the load shows in a scrape within the test.
    with running_server(extra=["--device", "sim", "--metrics-interval-ms", "100"]) as server:
        idle = poll(lambda: _sampled(server.metrics_url), 30, "the first device sample")
        assert idle is not None  # poll returns only what holds
        stop = threading.Event()
        errors: list[str] = []
        workers = [
            threading.Thread(target=_infer_until, args=(server.http_url, stop, errors))
            for _ in range(2)
        ]
        for worker in workers:
            worker.start()
        busy = 0.0
        deadline = time.monotonic() + 60
        try:
            while busy <= 0.0 and time.monotonic() < deadline:
                time.sleep(0.2)
                busy = _device(scrape(server.metrics_url), "ge_serve_device_utilization")
        finally:
            stop.set()
            for worker in workers:
                worker.join(30)
        assert errors == []
        assert busy > 0.0, "the simulated NPU reported no busy time under load"
        assert busy <= 1.0

        loaded = scrape(server.metrics_url)
        # Every byte the device holds belongs to a loaded model (weights and I/O buffers);
        # the models on the host CPU backend hold none of it.
        models = sum(
            value
            for labels, value in loaded.find("ge_serve_model_memory_bytes")
            if labels["model"] in ("simple", "image_classifier")
        )
        used = _device(loaded, "ge_serve_device_memory_used_bytes")
        assert used > 0
        assert used == models
        assert used == _device(idle, "ge_serve_device_memory_used_bytes")
        assert 0 < _device(loaded, "ge_serve_device_pool_bytes") < used
