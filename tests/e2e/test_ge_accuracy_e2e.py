"""Conversion accuracy at load through the real `ge-serve`: on a simulated NPU that
perturbs its results (--sim-perturb), a model without a tolerance loads and shows its
errors in the log, its config (HTTP and gRPC) and the metrics; one with
`accuracy_tolerance` fails its load, naming the output."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from ge_helpers import EXAMPLES, make_model, params
from polling import poll
from serverproc import running_server, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
CLASSIFIER = EXAMPLES / "image_classifier" / "1" / "model.onnx"
BODY = """backend: "npu_ge"
max_batch_size: 4
input [ { name: "image" data_type: TYPE_FP32 dims: [ 3, 64, 64 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]
"""


def test_a_perturbed_conversion_is_reported_and_a_tolerance_fails_the_load(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    make_model(repo, "loose", BODY, CLASSIFIER)
    make_model(repo, "strict", BODY + params(accuracy_tolerance="1e-3"), CLASSIFIER)
    flags = ["--device", "sim", "--sim-perturb", "0.01", "--exit-on-error", "false"]
    with running_server([repo], flags, wait_ready=False) as server:
        wait_for(server, "/v2/health/live", 60)
        poll(lambda: "strict" in server.log() and "loose" in server.log(), 60, "both loads")
        poll(lambda: "Started HTTPService" in server.log(), 60, "the HTTP front end")
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("loose")
        assert not client.is_model_ready("strict")
        log = server.log()
        assert re.search(
            r"strict.*probabilities max abs \S+, max rel \S+ past accuracy_tolerance", log
        )
        assert (
            "model 'loose' version 1: conversion accuracy against onnxruntime on 2 generated" in log
        )
        found = json.loads(
            client.get_model_config("loose")["parameters"]["conversion_accuracy.1"]["string_value"]
        )
        assert found["outputs"]["probabilities"]["max_abs_error"] > 0.01
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        config = grpc.get_model_config("loose", as_json=True)["config"]
        assert "conversion_accuracy.1" in config["parameters"]
        metrics = httpx.get(server.metrics_url, timeout=10).text
        found_metric = re.search(r"ge_serve_conversion_max_abs_error\{([^}]*)\} (\S+)", metrics)
        assert found_metric, metrics
        labels = found_metric.group(1)
        assert 'model="loose"' in labels and 'output="probabilities"' in labels
        assert 'version="1"' in labels and float(found_metric.group(2)) > 0.01
        assert 'ge_serve_conversion_max_rel_error{model="loose"' in metrics
