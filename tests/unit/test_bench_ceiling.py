"""The ceiling suite's bare server (bench/lib/bare.py) answers `simple` correctly: a
measuring stick that computed nothing would measure nothing."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.suites.ceiling import bare_server, summarise

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


def _inputs(module: object, binary: bool) -> list[object]:
    inputs = [module.InferInput(name, [1, 16], "INT32") for name in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
    for tensor, data in zip(inputs, (A, B), strict=True):
        if binary:
            tensor.set_data_from_numpy(data)
        else:
            tensor.set_data_from_numpy(data, binary_data=False)
    return inputs


@pytest.mark.timeout(60)
@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bare_server_adds_and_subtracts_over_http_and_grpc(binary: bool) -> None:
    with bare_server() as (http_url, grpc_url, _):
        http = httpclient.InferenceServerClient(http_url)
        assert http.get_model_metadata("simple")["name"] == "simple"
        result = http.infer("simple", _inputs(httpclient, binary))
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
        grpc = grpcclient.InferenceServerClient(grpc_url)
        assert grpc.get_model_config("simple").config.max_batch_size == 8
        answer = grpc.infer("simple", _inputs(grpcclient, True))
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), A + B)
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT1"), A - B)


def test_summary_takes_medians_of_each_rounds_ratio() -> None:
    runs = [
        {"ge": {"grpc/c16": (100.0, 2.0)}, "bare": {"grpc/c16": (200.0, 1.0)}},
        {"ge": {"grpc/c16": (150.0, 2.0)}, "bare": {"grpc/c16": (150.0, 1.0)}},
        {"ge": {"grpc/c16": (90.0, 3.0)}, "bare": {"grpc/c16": (300.0, 1.0)}},
    ]
    [row] = summarise(runs, [("grpc", 16)])
    assert row["ge_ips"] == 100.0 and row["bare_ips"] == 200.0
    assert row["ips_ratio"] == 0.5  # of 0.5, 1.0, 0.3
    assert row["p50_ratio"] == 2.0
