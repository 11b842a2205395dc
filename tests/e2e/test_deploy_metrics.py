"""The autoscaling queries in deploy/ read only metric names that a live ge-serve exports:
the prometheus-adapter rules the chart ships (and so the HPA's metrics), and the KEDA
Prometheus query of the KServe example. The Grafana dashboard has the same check in
test_metrics.py. And the other way round: every family a live ge-serve exports is in
deploy/README.md's tables, which the README names as the list of every metric."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from deployfiles import CHART, DEPLOY, load_documents
from ge_helpers import EXAMPLES, SIMPLE_IO, make_model
from metricdocs import documented, undocumented
from polling import poll
from promtext import Exposition, promql_metric_names, scrape
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def exposition() -> Iterator[Exposition]:
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
        yield scrape(server.metrics_url)


@pytest.fixture(scope="module")
def exported(exposition: Exposition) -> set[str]:
    return exposition.names


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


def test_every_exported_family_is_documented(exposition: Exposition) -> None:
    assert {"nv_inference_count", "ge_serve_queue_depth"} <= set(exposition.types)
    missing = undocumented(exposition, documented(DEPLOY / "README.md"))
    assert not missing, f"exported, but not in deploy/README.md: {missing}"


def test_every_family_of_a_ge_model_is_documented(tmp_path: Path) -> None:
    """The device families (utilization, memory, pool, executions, simulated timing) and
    the conversion accuracy gauges, from a GE model on the simulated NPU."""
    repo = tmp_path / "repo"
    make_model(
        repo,
        "ge_simple",
        "max_batch_size: 8\n" + SIMPLE_IO,
        EXAMPLES / "simple" / "1" / "model.onnx",
    )
    flags = ["--device", "sim", "--sim-cost", "launch_us=10,per_sample_us=1"]
    flags += ["--metrics-interval-ms", "50"]
    wanted = {
        "ge_serve_device_executions_total",
        "ge_serve_device_pool_bytes",
        "ge_serve_device_simulated_timing",
        "ge_serve_conversion_max_abs_error",
    }
    with running_server([repo], flags) as server:

        def exported_wanted() -> bool:
            return wanted <= set(scrape(server.metrics_url).types)

        # The device families come with the sampler's first pass after the load.
        assert poll(exported_wanted, 30, "the GE families", interval=0.2)
        exposition = scrape(server.metrics_url)
    missing = undocumented(exposition, documented(DEPLOY / "README.md"))
    assert not missing, f"exported, but not in deploy/README.md: {missing}"
