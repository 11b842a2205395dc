"""The autoscaling queries in deploy/ read only metric names that a live ge-serve exports:
the prometheus-adapter rules the chart ships (and so the HPA's metrics), and the KEDA
Prometheus query of the KServe example. The Grafana dashboard has the same check in
test_metrics.py. And the other way round: every family a live ge-serve exports is in
deploy/README.md's tables, which the README names as the list of every metric."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
import yaml
from deployfiles import CHART, DEPLOY, load_documents
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


def _documented() -> set[str]:
    """The metric names in deploy/README.md's tables: each row's first cell, its code spans,
    with `a_{b,c}_d` expanded to a_b_d and a_c_d."""
    names: set[str] = set()
    for line in (DEPLOY / "README.md").read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        for span in re.findall(r"`([^`]+)`", line.split(" | ", 1)[0]):
            names |= _expand(span)
    return names


def _expand(span: str) -> set[str]:
    """a_{b,c}_d -> {a_b_d, a_c_d}; a label selector (`name{reason}`) is dropped."""
    match = re.search(r"\{([^}]*)\}", span)
    if match is None:
        return {span}
    if "," not in match.group(1):
        return {span[: match.start()]}
    head, tail = span[: match.start()], span[match.end() :]
    return {name for part in match.group(1).split(",") for name in _expand(head + part + tail)}


def test_every_exported_family_is_documented(exposition: Exposition) -> None:
    documented = _documented()
    undocumented = {
        family
        for family in exposition.types
        if family not in documented and family + "_total" not in documented
    }
    assert not undocumented, f"exported, but not in deploy/README.md: {sorted(undocumented)}"


def test_documented_names_are_read_as_names() -> None:
    documented = _documented()
    # Expanded, and with label selectors dropped: the check above compares real names.
    for name in (
        "nv_inference_queue_duration_us",
        "nv_inference_queue_summary_us",
        "nv_inference_request_failure",
        "nv_cache_miss_duration_per_model",
        "ge_serve_device_pool_bytes",
    ):
        assert name in documented
    assert not {name for name in documented if "{" in name or "," in name}
