"""Custom metrics as Triton's qa/python_models/custom_metrics asserts them, against the real
server: a family of a known name and kind is the first one whatever its description, a
histogram's buckets rise strictly (an empty list is only +Inf), a Metric whose
MetricFamily object is gone refuses every operation, and `le` is written as
prometheus-cpp writes it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pymodels
import pytest
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

# OUT: what each case gave, as JSON: "ok" or the exception's type and message.
METRICS_MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils

DELETED = "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."


def outcome(call):
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "ok"


class TritonPythonModel:
    def initialize(self, args):
        self.keep = []

    def execute(self, requests):
        seen = {}
        first = pb_utils.MetricFamily(
            name="qa_desc", description="first description", kind=pb_utils.MetricFamily.COUNTER
        )
        second = pb_utils.MetricFamily(
            name="qa_desc", description="second description", kind=pb_utils.MetricFamily.COUNTER
        )
        counter = second.Metric(labels={"k": "v"})
        counter.increment(2)
        self.keep += [first, second, counter]
        seen["other_kind"] = outcome(
            lambda: pb_utils.MetricFamily(
                name="qa_desc", description="x", kind=pb_utils.MetricFamily.GAUGE
            )
        )
        histogram = pb_utils.MetricFamily(
            name="qa_hist", description="histogram", kind=pb_utils.MetricFamily.HISTOGRAM
        )
        self.keep.append(histogram)
        seen["no_buckets"] = outcome(lambda: histogram.Metric(labels={}))
        seen["unsorted"] = outcome(lambda: histogram.Metric(labels={}, buckets=[2.5, 0.1]))
        seen["duplicate"] = outcome(lambda: histogram.Metric(labels={}, buckets=[1, 1, 2, 5, 5]))
        empty = lambda: self.keep.append(histogram.Metric(labels={"e": "1"}, buckets=[]))
        seen["empty"] = outcome(empty)
        observed = histogram.Metric(labels={"h": "1"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
        observed.observe(2.0)
        self.keep.append(observed)
        gone = pb_utils.MetricFamily(
            name="qa_gone", description="deleted", kind=pb_utils.MetricFamily.GAUGE
        )
        orphan = gone.Metric(labels={})
        del gone
        seen["orphan_set"] = outcome(lambda: orphan.set(1))
        seen["orphan_increment"] = outcome(lambda: orphan.increment(1))
        seen["orphan_value"] = outcome(orphan.value)
        out = pb_utils.Tensor("OUT", np.array([json.dumps(seen).encode()], np.object_))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""

CONFIG = """
name: "qa_metrics"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

DELETED = (
    "TritonModelException: Invalid metric operation as the corresponding 'MetricFamily' has "
    "been deleted."
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("qa-metrics")
    pymodels.write_model(repo, "qa_metrics", METRICS_MODEL, CONFIG)
    with running_server([repo]) as proc:
        yield proc


def test_custom_metrics_behave_as_tritons_qa_asserts(server: ServerProcess) -> None:
    body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1], "data": [1]}]}
    answer = httpx.post(f"{server.base_url}/v2/models/qa_metrics/infer", json=body, timeout=20)
    assert answer.status_code == 200, answer.text
    seen = json.loads(answer.json()["outputs"][0]["data"][0])
    assert seen["other_kind"].startswith("TritonModelException: ")
    assert seen["no_buckets"].startswith("TritonModelException: ")
    assert seen["unsorted"].startswith("TritonModelException: ")
    assert seen["duplicate"].startswith("TritonModelException: ")
    assert seen["empty"] == "ok"
    assert seen["orphan_set"] == DELETED
    assert seen["orphan_increment"] == DELETED
    assert seen["orphan_value"] == DELETED

    text = httpx.get(server.metrics_url, timeout=20).text
    # The first description stays; the counter both families name is one series.
    assert "# HELP qa_desc first description" in text
    assert "second description" not in text
    assert 'qa_desc{k="v"} 2.0' in text
    for le in ("0.1", "1", "2.5", "5", "10"):
        assert f'qa_hist_bucket{{h="1",le="{le}"}}' in text
    assert 'qa_hist_bucket{e="1",le="+Inf"} 0.0' in text
