"""The autoscaling queries in deploy/ read only metric names that a live ge-serve exports:
the prometheus-adapter rules the chart ships (and so the HPA's metrics), and the KEDA
Prometheus query of the KServe example. The Grafana dashboard has the same check in
test_metrics.py."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
import yaml
from deployfiles import CHART, DEPLOY, load_documents
from promtext import promql_metric_names, scrape
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def exported() -> Iterator[set[str]]:
    server: ServerProcess
    with running_server() as server:
        body = {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
                for n in ("INPUT0", "INPUT1")
            ]
        }
        response = httpx.post(f"{server.base_url}/v2/models/simple/infer", json=body, timeout=10)
        assert response.status_code == 200, response.text
        yield scrape(server.metrics_url).names


def _adapter_queries() -> list[tuple[str, str]]:
    config = yaml.safe_load((CHART / "files" / "prometheus-adapter-values.yaml").read_text())
    found: list[tuple[str, str]] = []
    for rule in config["rules"]["custom"]:
        series = rule["seriesQuery"]
        name = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", series)
        assert name, series
        # The adapter fills the template per query: the series' name, the pod's label
        # matchers, the grouping labels.
        query = (
            rule["metricsQuery"]
            .replace("<<.Series>>", name.group(1))
            .replace("<<.LabelMatchers>>", 'namespace="ml",pod="p"')
            .replace("<<.GroupBy>>", "pod")
        )
        assert "<<" not in query, query
        found += [(rule["name"]["as"], series), (rule["name"]["as"], query)]
    return found


def _keda_queries() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for doc in load_documents(DEPLOY / "kserve" / "inferenceservice.yaml"):
        scaling = doc["spec"]["predictor"].get("autoScaling", {})
        for metric in scaling.get("metrics", []):
            external = metric["external"]["metric"]
            assert external["backend"] == "prometheus"
            found.append((doc["metadata"]["name"], external["query"]))
    assert found
    return found


@pytest.mark.parametrize(
    ("where", "query"), _adapter_queries() + _keda_queries(), ids=lambda v: str(v)[:60]
)
def test_scaling_query_reads_exported_names(exported: set[str], where: str, query: str) -> None:
    names = promql_metric_names(query)
    assert names, (where, query)
    missing = names - exported
    assert not missing, f"{where}: {query!r} reads {missing}, which ge-serve does not export"


def test_the_check_can_fail(exported: set[str]) -> None:
    assert promql_metric_names("sum(nv_inference_pending_requests{pod='x'})") - exported
