"""Everything in deploy/ passes a real validator, and the validators reject what is wrong.

- Plain manifests (deploy/k8s, deploy/kserve) and the Helm chart's rendered output:
  kubernetes-validate in strict mode for the built-in kinds, at the oldest Kubernetes the
  chart supports and the newest the validator knows; KServe's and prometheus-operator's
  CRD OpenAPI schemas (vendored in tests/schemas, made strict) for theirs.
- The chart is rendered by Helm's own engine (helm-python-sdk wraps Helm's Go SDK, so no
  helm binary is needed) and linted. Where that wheel cannot be installed, those tests
  skip and `test_chart_templates_read_only_defined_values` still checks the raw
  templates against values.yaml.
- The compose file: the compose specification's JSON schema, with jsonschema.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from deployfiles import (
    CHART,
    DEPLOY,
    Doc,
    compose_schema,
    container_args,
    load_documents,
    manifest_files,
    render_chart,
    validate_resource,
)

from ge_serve.server.cli import parse_settings

helm_python: ModuleType | None
try:
    import helm_python
except (ImportError, OSError):  # no wheel for this platform, or its library fails to load
    helm_python = None

needs_helm = pytest.mark.skipif(
    helm_python is None,
    reason="helm-python-sdk (Helm's engine, the `test` extra) is not installed here",
)

ADAPTER_VALUES = CHART / "files" / "prometheus-adapter-values.yaml"

# Value sets the chart is rendered with: the defaults, and each feature switched on.
EVERYTHING: dict[str, Any] = {
    "npu": {"enabled": True},
    "autoscaling": {"enabled": True},
    "metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
    "server": {
        "restrictedApi": {"enabled": True, "existingSecret": "ge-serve-admin"},
        "modelControlMode": "explicit",
        "loadModels": ["simple", "densenet"],
        "adaptiveBatching": True,
        "extraArgs": ["--metrics-config=summary_latencies=false"],
    },
    "modelRepository": {"source": "initContainer"},
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
        }
    ],
}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "everything": EVERYTHING,
    "queue-time-hpa-pvc-created-poll-sim": {
        "autoscaling": {"enabled": True, "metric": "queueTime"},
        "modelRepository": {"pvc": {"create": True, "subPath": "repo"}},
        "server": {"modelControlMode": "poll", "device": "sim", "simDevices": 2},
        "podDisruptionBudget": {"minAvailable": 1},
        "npu": {"enabled": True, "resourceName": "huawei.com/Ascend310P", "count": 2},
        "replicaCount": 3,
    },
}


# --- plain manifests -------------------------------------------------------------------


def _all_manifests() -> list[tuple[str, Doc]]:
    return [
        (f"{path.parent.name}/{path.name}:{doc['kind']}", doc)
        for path in manifest_files()
        for doc in load_documents(path)
    ]


@pytest.mark.parametrize(
    ("where", "doc"), _all_manifests(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_manifest_is_valid(where: str, doc: Doc) -> None:
    validate_resource(doc)


def test_every_manifest_kind_has_a_validator() -> None:
    kinds = {doc["kind"] for _, doc in _all_manifests()}
    assert kinds == {
        "Deployment",
        "Service",
        "ServingRuntime",
        "ClusterServingRuntime",
        "InferenceService",
    }


# The validators must be able to fail: each of these is one mistake in a real manifest.
def _broken(path: str, kind: str, change: str) -> Doc:
    doc = next(d for d in load_documents(DEPLOY / path) if d["kind"] == kind)
    doc = copy.deepcopy(doc)
    if change == "unknown-field":
        doc["spec"]["replicaz"] = 2
    elif change == "wrong-type":
        doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "forty"
    elif change == "isvc-typo":
        doc["spec"]["predictor"]["model"]["runtim"] = "ge-serve"
    elif change == "runtime-port-type":
        doc["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    elif change == "bad-name":
        doc["metadata"]["name"] = "Ge_Serve"
    return doc


@pytest.mark.parametrize(
    ("path", "kind", "change"),
    [
        ("k8s/ge-serve.yaml", "Deployment", "unknown-field"),
        ("k8s/ge-serve.yaml", "Deployment", "wrong-type"),
        ("kserve/inferenceservice.yaml", "InferenceService", "isvc-typo"),
        ("kserve/servingruntime.yaml", "ServingRuntime", "runtime-port-type"),
        ("kserve/servingruntime.yaml", "ServingRuntime", "bad-name"),
    ],
)
def test_validators_reject_mistakes(path: str, kind: str, change: str) -> None:
    with pytest.raises(
        (kubernetes_validate.ValidationError, jsonschema.ValidationError, AssertionError)
    ):
        validate_resource(_broken(path, kind, change))


# --- the Helm chart --------------------------------------------------------------------


@needs_helm
def test_chart_lints_clean() -> None:
    assert helm_python is not None
    for values in VALUE_SETS.values():
        report = helm_python.lint(str(CHART), values, strict=True, kube_version="v1.25.0")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not problems and not report["errors"], report


@needs_helm
@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_rendered_chart_is_valid(case: str) -> None:
    docs = render_chart(VALUE_SETS[case])
    assert docs
    for doc in docs:
        validate_resource(doc)


def _by_kind(docs: list[Doc]) -> dict[str, Doc]:
    found = {doc["kind"]: doc for doc in docs}
    assert len(found) == len(docs), "one resource of each kind"
    return found


@needs_helm
@pytest.mark.parametrize("case", sorted(VALUE_SETS))
def test_rendered_chart_fits_together(case: str) -> None:
    values = _merged_values(VALUE_SETS[case])
    docs = _by_kind(render_chart(VALUE_SETS[case]))
    deployment, service = docs["Deployment"], docs["Service"]
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]

    # The command line parses with ge-serve's own CLI and agrees with the ports.
    settings = parse_settings(container_args(container, {"GE_SERVE_RESTRICTED_KEY": "k"}))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {
        "http": settings.http_port,
        "grpc": settings.grpc_port,
        "metrics": settings.metrics_port,
    }
    assert settings.model_repositories == (Path(values["modelRepository"]["mountPath"]),)
    assert settings.model_control_mode == values["server"]["modelControlMode"]
    assert settings.adaptive_batching == values["server"]["adaptiveBatching"]
    assert settings.exit_timeout_secs == values["server"]["exitTimeoutSecs"]

    # Rolling updates lose nothing: preStop sleep, then the drain, inside the grace period.
    sleep = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert sleep == values["shutdown"]["preStopSleepSecs"]
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace == sleep + settings.exit_timeout_secs + values["shutdown"]["marginSecs"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live"

    # Selectors, ports and volumes point at things that exist.
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounted = [m["name"] for c in pod["spec"].get("initContainers", []) for m in c["volumeMounts"]]
    mounted += [m["name"] for m in container["volumeMounts"]]
    assert set(mounted) == set(volumes)
    pdb = docs["PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()

    # The model repository: a read-only PVC, or an emptyDir an init container fills.
    models = volumes["models"]
    if values["modelRepository"]["source"] == "pvc":
        assert (
            models["persistentVolumeClaim"]["claimName"]
            == values["modelRepository"]["pvc"]["claimName"]
        )
        assert ("PersistentVolumeClaim" in docs) == values["modelRepository"]["pvc"]["create"]
    else:
        assert "emptyDir" in models
        assert pod["spec"]["initContainers"][0]["volumeMounts"][0]["name"] == "models"

    # Ascend NPUs: the device plugin's resource and the driver's host mounts.
    npu = values["npu"]
    resources = container["resources"]
    if npu["enabled"]:
        assert settings.device in ("npu", "sim")
        assert resources["limits"][npu["resourceName"]] == npu["count"]
        host_paths = {v["hostPath"]["path"] for v in volumes.values() if "hostPath" in v}
        assert {"/usr/local/Ascend/driver", "/usr/local/sbin/npu-smi"} <= host_paths
    else:
        assert not any(k.startswith("huawei.com/") for k in resources.get("limits", {}))

    # The restricted-API key comes from a Secret, never from the values.
    restricted = values["server"]["restrictedApi"]
    env = {e["name"]: e for e in container.get("env", [])}
    if restricted["enabled"]:
        ref = env["GE_SERVE_RESTRICTED_KEY"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": restricted["existingSecret"], "key": restricted["secretKey"]}
        # (category, header, value) per category, the same for both protocols.
        rules = settings.http_restricted_api
        assert rules == settings.grpc_restricted_protocol
        assert {category for category, _, _ in rules} == set(restricted["categories"])
        assert {(header, value) for _, header, value in rules} == {(restricted["header"], "k")}
    else:
        assert not settings.http_restricted_api and "GE_SERVE_RESTRICTED_KEY" not in env

    # Monitoring: what scrapes the metrics port.
    for kind, key, endpoints in (
        ("ServiceMonitor", "serviceMonitor", "endpoints"),
        ("PodMonitor", "podMonitor", "podMetricsEndpoints"),
    ):
        assert (kind in docs) == values["metrics"][key]["enabled"]
        if kind in docs:
            monitor = docs[kind]
            assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
            assert monitor["spec"][endpoints][0]["port"] == "metrics"

    # Autoscaling: the HPA scales this Deployment on a metric the adapter rules serve.
    assert ("HorizontalPodAutoscaler" in docs) == values["autoscaling"]["enabled"]
    if "HorizontalPodAutoscaler" in docs:
        hpa = docs["HorizontalPodAutoscaler"]
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert "replicas" not in deployment["spec"]
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "Pods"
        assert metric["pods"]["metric"]["name"] in _adapter_metric_names()
    else:
        assert deployment["spec"]["replicas"] == values["replicaCount"]


@needs_helm
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"server": {"restrictedApi": {"enabled": True}}}, "existingSecret"),
        (
            {
                "server": {
                    "restrictedApi": {
                        "enabled": True,
                        "existingSecret": "s",
                        "categories": ["health"],
                    }
                }
            },
            "probes",
        ),
        ({"server": {"modelControlMode": "sometimes"}}, "modelControlMode"),
        # ge-serve, as Triton, refuses --load-model outside explicit mode: the pod would
        # crash-loop.
        ({"server": {"loadModels": ["m"]}}, "server.loadModels: needs"),
        ({"modelRepository": {"source": "s3"}}, "modelRepository.source"),
        ({"autoscaling": {"metric": "cpu"}}, "autoscaling.metric"),
    ],
)
def test_chart_refuses_broken_values(values: dict[str, Any], message: str) -> None:
    assert helm_python is not None
    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        render_chart(values)


def test_chart_templates_read_only_defined_values() -> None:
    """Without Helm: every .Values path the raw templates read is defined in values.yaml,
    and every top-level key there carries a comment (the documentation)."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    read: set[str] = set()
    for template in (CHART / "templates").iterdir():
        read |= set(re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", template.read_text()))
    assert read
    for path in sorted(read):
        node: Any = values
        for part in path.strip(".").split("."):
            assert isinstance(node, dict) and part in node, f"templates read .Values{path}"
            node = node[part]
    lines = (CHART / "values.yaml").read_text().splitlines()
    for index, line in enumerate(lines):
        if re.match(r"^[A-Za-z]\w*:", line):
            before = lines[index - 1] if index else ""
            assert before.startswith("#"), f"values.yaml: {line} has no comment"


def _merged_values(overrides: dict[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())

    def merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
        for key, value in extra.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    merge(merged, copy.deepcopy(overrides))
    return merged


def _adapter_metric_names() -> set[str]:
    rules = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    return {rule["name"]["as"] for rule in rules}


def test_adapter_rules_are_well_formed() -> None:
    config = yaml.safe_load(ADAPTER_VALUES.read_text())
    assert config["rules"]["default"] is False
    for rule in config["rules"]["custom"]:
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }
        series = re.match(r"^([a-z_:][a-z0-9_:]*)\{", rule["seriesQuery"])
        assert series, rule["seriesQuery"]
        assert re.match(rule["name"]["matches"], series.group(1))
        assert (
            "<<.Series>>" in rule["metricsQuery"] and "<<.LabelMatchers>>" in rule["metricsQuery"]
        )
        assert "by (<<.GroupBy>>)" in rule["metricsQuery"]
    assert _adapter_metric_names() == {
        "ge_serve_pending_requests",
        "ge_serve_queue_time_us_per_request",
    }


# --- compose ---------------------------------------------------------------------------

COMPOSE_DIR = DEPLOY / "compose"


def _compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load((COMPOSE_DIR / "compose.yaml").read_text())
    return compose


def test_compose_file_matches_the_compose_spec() -> None:
    jsonschema.validate(_compose(), compose_schema(), cls=jsonschema.Draft7Validator)


def test_compose_schema_rejects_mistakes() -> None:
    broken = _compose()
    broken["services"]["lb"]["depends_on"]["ge-serve-1"]["condition"] = "service_happy"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, compose_schema(), cls=jsonschema.Draft7Validator)
    broken = _compose()
    broken["services"]["grafana"]["portz"] = ["3000:3000"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, compose_schema(), cls=jsonschema.Draft7Validator)


def test_compose_stack_fits_together() -> None:
    compose = _compose()
    services = compose["services"]
    replicas = [name for name in services if name.startswith("ge-serve-")]
    assert replicas == ["ge-serve-1", "ge-serve-2"]
    for name in replicas:
        replica = services[name]
        settings = parse_settings(replica["command"])
        assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8000, 8001, 8002)
        # docker stop waits longer than the drain.
        assert int(replica["stop_grace_period"].rstrip("s")) > settings.exit_timeout_secs
        assert "/v2/health/ready" in " ".join(replica["healthcheck"]["test"])
        build = replica["build"]
        assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).is_file()
    # HAProxy gets every variable its config reads, pointing at the replicas' ports.
    lb = services["lb"]
    config = (COMPOSE_DIR / "haproxy.cfg").read_text()
    used = set(re.findall(r"\$\{(\w+)\}", config))
    assert used == set(lb["environment"])
    env = lb["environment"]
    assert {env["GE1_HOST"], env["GE2_HOST"]} == set(replicas)
    assert (env["GE1_HTTP_PORT"], env["GE1_GRPC_PORT"]) == ("8000", "8001")
    assert {c["condition"] for c in lb["depends_on"].values()} == {"service_healthy"}
    assert "/usr/local/etc/haproxy/haproxy.cfg" in lb["volumes"][0]
    # Prometheus scrapes both replicas' metrics ports; Grafana gets the dashboard.
    prometheus = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    targets = {
        t
        for job in prometheus["scrape_configs"]
        for g in job["static_configs"]
        for t in g["targets"]
    }
    assert targets == {f"{name}:8002" for name in replicas}
    for volume in services["grafana"]["volumes"] + services["prometheus"]["volumes"]:
        source = volume.split(":")[0]
        assert (COMPOSE_DIR / source).exists(), source
    assert any(v.startswith("../grafana/ge-serve.json:") for v in services["grafana"]["volumes"])
    provisioning = COMPOSE_DIR / "grafana" / "provisioning"
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    dashboards = yaml.safe_load((provisioning / "dashboards" / "ge-serve.yaml").read_text())
    assert dashboards["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
