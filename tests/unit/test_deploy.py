"""deploy/ stays consistent with the server: every command line in it parses with ge-serve's
own CLI, the ports agree with the flags, and Prometheus scrapes the metrics port."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

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
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > sleep + settings.exit_timeout_secs
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    mounts = {m["name"] for m in container["volumeMounts"]}
    assert mounts == {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}


def test_kserve_runtimes() -> None:
    runtimes = [
        doc
        for name in ("servingruntime.yaml", "clusterservingruntime.yaml")
        for doc in _documents(DEPLOY / "kserve" / name)
    ]
    assert {r["kind"] for r in runtimes} == {"ServingRuntime", "ClusterServingRuntime"}
    for runtime in runtimes:
        assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
        container = _container(runtime)
        assert container["name"] == "kserve-container"
        settings = parse_settings(container["args"])
        assert settings.model_repositories == (Path("/mnt/models"),)
        # KServe routes REST to 8080 and grpc-v2 to 9000.
        assert (settings.http_port, settings.grpc_port) == (8080, 9000)
        assert [p["containerPort"] for p in container["ports"]] == [settings.http_port]
        assert container["readinessProbe"]["httpGet"]["port"] == settings.http_port
        annotations = runtime["spec"]["annotations"]
        assert annotations["prometheus.kserve.io/port"] == str(settings.metrics_port)
        assert {"v2", "grpc-v2"} <= set(runtime["spec"]["protocolVersions"])
        formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
        assert formats == {"triton", "onnx", "npu_ge"}
        assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    npu = next(r for r in runtimes if r["kind"] == "ClusterServingRuntime")
    container = _container(npu)
    assert parse_settings(container["args"]).device == "npu"
    assert container["resources"]["limits"]["huawei.com/Ascend910"] == "1"
    mounts = {m["name"] for m in container["volumeMounts"]}
    assert mounts == {v["name"] for v in npu["spec"]["volumes"]}
    assert "/usr/local/Ascend/driver" in {v["hostPath"]["path"] for v in npu["spec"]["volumes"]}


def test_kserve_inference_services() -> None:
    runtimes = {
        doc["metadata"]["name"]: doc
        for name in ("servingruntime.yaml", "clusterservingruntime.yaml")
        for doc in _documents(DEPLOY / "kserve" / name)
    }
    services = _documents(DEPLOY / "kserve" / "inferenceservice.yaml")
    assert len(services) == 2
    for service in services:
        predictor = service["spec"]["predictor"]
        model = predictor["model"]
        runtime = runtimes[model["runtime"]]
        formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
        assert model["modelFormat"]["name"] in formats
        assert predictor["minReplicas"] < predictor["maxReplicas"]
        # preStop sleep + --exit-timeout-secs must fit in the grace period.
        args = parse_settings(_container(runtime)["args"])
        sleep = int(_container(runtime)["lifecycle"]["preStop"]["exec"]["command"][1])
        assert predictor["terminationGracePeriodSeconds"] > sleep + args.exit_timeout_secs
    annotations = {s["metadata"]["name"]: s["metadata"]["annotations"] for s in services}
    assert annotations["simple"]["serving.kserve.io/autoscalerClass"] == "keda"
    assert annotations["simple-grpc"]["autoscaling.knative.dev/metric"] == "concurrency"
    grpc = next(s for s in services if s["metadata"]["name"] == "simple-grpc")
    model = grpc["spec"]["predictor"]["model"]
    assert model["protocolVersion"] == "grpc-v2"
    assert model["ports"] == [{"name": "h2c", "containerPort": 9000, "protocol": "TCP"}]


def test_prometheus_scrapes_the_metrics_port() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    static = jobs["ge-serve"]
    assert static["metrics_path"] == "/metrics"
    targets = [t for group in static["static_configs"] for t in group["targets"]]
    assert targets and all(t.endswith(":8002") for t in targets)
    assert "ge-serve-pods" in jobs


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.npu"])
def test_dockerfile(name: str) -> None:
    text = (DEPLOY / "docker" / name).read_text()
    entrypoint = json.loads(_instruction(text, "ENTRYPOINT"))
    command = json.loads(_instruction(text, "CMD"))
    assert entrypoint == (["ge-serve"] if name == "Dockerfile" else ["ge-serve-npu"])
    settings = parse_settings(command)
    assert _instruction(text, "EXPOSE").split() == [
        str(settings.http_port),
        str(settings.grpc_port),
        str(settings.metrics_port),
    ]
    # Every folder the package installs from (pyproject's package-dir).
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    folders = set(project["tool"]["setuptools"]["package-dir"].values())
    assert folders >= {"server", "scheduler", "backends", "link", "protos"}
    for folder in sorted(folders):
        assert f"COPY {folder} ./{folder}" in text
    # Pinned: dependencies come from the constraints file, and only from it.
    assert "COPY deploy/docker/constraints.txt ./constraints.txt" in text
    assert "-r constraints.txt" in text and "--no-deps -c constraints.txt ." in text
    # Not root, and healthy only when ready.
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1].split(":")[0] == "1000"
    health = _instruction(text, "HEALTHCHECK")
    assert f"127.0.0.1:{settings.http_port}/v2/health/ready" in health
    # Everything the image copies gets past its .dockerignore.
    ignore = (DEPLOY / "docker" / f"{name}.dockerignore").read_text().split()
    for source in re.findall(r"^COPY (?!--from)(?:--chmod=\S+ )?(\S+) ", text, re.M):
        assert f"!{source.rstrip('/')}" in ignore or f"!{source.rstrip('/')}/" in ignore, source


def test_npu_image_names_its_cann_base_and_devices() -> None:
    text = (DEPLOY / "docker" / "Dockerfile.npu").read_text()
    assert re.search(r"^ARG CANN_IMAGE=ascendai/cann:[\w.]+-910b-ubuntu22\.04-py3\.11$", text, re.M)
    assert "FROM ${CANN_IMAGE}" in text
    for device in ("/dev/davinci0", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"):
        assert f"--device={device}" in text
    for mount in ("/usr/local/Ascend/driver", "/usr/local/sbin/npu-smi", "/usr/local/dcmi"):
        assert f"-v {mount}:{mount}:ro" in text
    entry = (DEPLOY / "docker" / "npu-entrypoint.sh").read_text()
    assert "/usr/local/Ascend/ascend-toolkit/set_env.sh" in entry
    assert 'exec ge-serve "$@"' in entry


def test_constraints_pin_every_runtime_dependency() -> None:
    """deploy/docker/constraints.txt (deploy/docker/lock.sh) must be re-made whenever
    pyproject's dependencies change: every one pinned, each pin inside its range."""
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())["project"]
    pins: dict[str, Version] = {}
    for line in (DEPLOY / "docker" / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    assert len(pins) > len(project["dependencies"])  # transitive ones too
    for spec in project["dependencies"]:
        requirement = Requirement(spec)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is not pinned: run deploy/docker/lock.sh"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is outside {requirement.specifier}: run deploy/docker/lock.sh"
        )


def _instruction(text: str, keyword: str) -> str:
    """The last instruction's argument, with its continuation lines."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = re.findall(rf"^{keyword} (.*)$", joined, re.M)
    assert found, keyword
    value: str = found[-1]
    if keyword == "HEALTHCHECK":
        return value
    return value.strip()
