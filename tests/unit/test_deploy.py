"""deploy/ stays consistent with the server: every command line in it parses with ge-serve's
own CLI, the ports agree with the flags, and Prometheus scrapes the metrics port."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from ge_serve.server.cli import parse_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    spec = doc["spec"]
    containers = (
        spec["template"]["spec"]["containers"] if "template" in spec else spec["containers"]
    )
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def test_deployment_and_service() -> None:
    docs = {doc["kind"]: doc for doc in _documents(DEPLOY / "k8s" / "ge-serve.yaml")}
    assert set(docs) == {"Deployment", "Service"}
    deployment, service = docs["Deployment"], docs["Service"]
    container = _container(deployment)
    settings = parse_settings(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "http": settings.http_port,
        "grpc": settings.grpc_port,
        "metrics": settings.metrics_port,
    }
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(settings.metrics_port)
    assert annotations["prometheus.io/path"] == "/metrics"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    mounts = {m["name"] for m in container["volumeMounts"]}
    assert mounts == {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}


def test_kserve_serving_runtime() -> None:
    docs = {doc["kind"]: doc for doc in _documents(DEPLOY / "k8s" / "servingruntime.yaml")}
    runtime = docs["ServingRuntime"]
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    container = _container(runtime)
    assert container["name"] == "kserve-container"
    assert container["command"] == ["ge-serve"]
    settings = parse_settings(container["args"])
    assert settings.model_repositories == (Path("/mnt/models"),)
    assert [p["containerPort"] for p in container["ports"]] == [settings.http_port]
    assert runtime["spec"]["annotations"]["prometheus.kserve.io/port"] == str(settings.metrics_port)
    assert {"v2", "grpc-v2"} <= set(runtime["spec"]["protocolVersions"])
    service = docs["InferenceService"]["spec"]["predictor"]["model"]
    assert service["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert service["modelFormat"]["name"] in formats


def test_prometheus_scrapes_the_metrics_port() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    static = jobs["ge-serve"]
    assert static["metrics_path"] == "/metrics"
    targets = [t for group in static["static_configs"] for t in group["targets"]]
    assert targets and all(t.endswith(":8002") for t in targets)
    assert "ge-serve-pods" in jobs


def test_dockerfile_command_parses() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
    command = json.loads(re.search(r"^CMD (.*)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert entrypoint == ["ge-serve"]
    settings = parse_settings(command)
    exposed = re.search(r"^EXPOSE (.*)$", text, re.M)
    assert exposed is not None
    assert exposed.group(1).split() == [
        str(settings.http_port),
        str(settings.grpc_port),
        str(settings.metrics_port),
    ]
    for folder in ("server", "scheduler", "backends", "protos"):
        assert f"COPY {folder} ./{folder}" in text
