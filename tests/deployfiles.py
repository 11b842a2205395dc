"""Load and validate what deploy/ holds: Kubernetes manifests against the Kubernetes schemas
(kubernetes-validate) or a CRD's OpenAPI schema (vendored in tests/schemas), the Helm chart
rendered by Helm's own engine (helm-python-sdk, Helm's Go SDK in a wheel), and the compose
file against the compose specification's JSON schema."""

from __future__ import annotations

import copy
import gzip
import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "ge-serve"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest that
# kubernetes-validate ships schemas for.
KUBE_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())

# apiVersion group -> vendored CRD extracts (tests/schemas/README.md says where from).
CRD_FILES = {
    "serving.kserve.io": (
        "kserve",
        ("servingruntimes", "clusterservingruntimes", "inferenceservices"),
    ),
    "monitoring.coreos.com": ("prometheus-operator", ("servicemonitors", "podmonitors")),
}

_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

Doc = dict[str, Any]


def documents(text: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def load_documents(path: Path) -> list[Doc]:
    return documents(path.read_text())


@cache
def _crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    """(apiVersion, kind) -> a validator for the CRD's openAPIV3Schema, made strict like the
    API server's strict field validation: an object that lists its properties accepts no
    others. Built once: checking the InferenceService schema itself takes seconds."""
    found: dict[tuple[str, str], jsonschema.Draft7Validator] = {}
    for folder, names in CRD_FILES.values():
        for name in names:
            with gzip.open(SCHEMAS / folder / f"{name}.json.gz") as handle:
                crd = json.load(handle)
            for version, schema in crd["versions"].items():
                strict = _strict(schema)
                jsonschema.Draft7Validator.check_schema(strict)
                found[(f"{crd['group']}/{version}", crd["kind"])] = jsonschema.Draft7Validator(
                    strict
                )
    return found


def _strict(schema: Any) -> Any:
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def _check_metadata(doc: Doc) -> None:
    metadata = doc.get("metadata") or {}
    name = metadata.get("name", "")
    assert _DNS_1123.match(name) and len(name) <= 253, f"{doc['kind']}: bad name {name!r}"
    for key in ("labels", "annotations"):
        for k, v in (metadata.get(key) or {}).items():
            assert isinstance(v, str), f"{doc['kind']} {name}: {key} {k} is not a string"


def validate_resource(doc: Doc) -> str:
    """Validate one resource; returns which validator did. Raises on any error."""
    api_version, kind = doc["apiVersion"], doc["kind"]
    group = api_version.split("/")[0] if "/" in api_version else ""
    if group in CRD_FILES:
        validator = _crd_validators().get((api_version, kind))
        assert validator is not None, f"no CRD schema for {api_version} {kind}"
        _check_metadata(doc)
        body = {k: v for k, v in doc.items() if k != "metadata"}
        error = jsonschema.exceptions.best_match(validator.iter_errors(body))
        if error is not None:
            raise error
        return f"CRD schema {api_version}/{kind}"
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)
    return f"kubernetes-validate {'/'.join(KUBE_VERSIONS)} strict"


def manifest_files() -> Iterator[Path]:
    """Every plain Kubernetes manifest in deploy/ (the chart's templates are rendered)."""
    for folder in ("k8s", "kserve"):
        yield from sorted((DEPLOY / folder).glob("*.yaml"))


def render_chart(values: dict[str, Any] | None = None, namespace: str = "ml") -> list[Doc]:
    """The chart rendered by Helm's engine with `values` over values.yaml."""
    import helm_python

    with helm_python.Chart.load(str(CHART)) as chart:
        rendered = chart.render(values or {}, name="ge", namespace=namespace, is_install=True)
    docs: list[Doc] = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            docs += documents(text)
    return docs


def compose_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(
        (SCHEMAS / "compose-spec" / "compose-spec.json").read_text()
    )
    return schema


def container_args(container: Doc, env: dict[str, str] | None = None) -> list[str]:
    """A container's args with $(VAR) expanded as the kubelet does."""
    env = env or {}
    return [
        re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a)
        for a in container.get("args", [])
    ]
