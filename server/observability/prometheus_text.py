"""Prometheus text exposition (format 0.0.4) for the metric families /metrics serves."""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric


def render_text(families: Iterable[Metric]) -> bytes:
    """Prometheus text format 0.0.4, naming counters as they are named.

    prometheus_client's `generate_latest` renames a counter family to `<name>_total`;
    Triton's counters (and the dashboards written for them) have no such suffix. Labels
    come in Triton's order (`_label_order`).
    """
    out: list[str] = []
    for family in families:
        name = family.name
        if family.type == "counter" and any(s.name == name + "_total" for s in family.samples):
            name += "_total"  # a prometheus_client Counter registered by someone else
        kind = {"unknown": "untyped", "info": "gauge", "stateset": "gauge"}.get(
            family.type, family.type
        )
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            if sample.labels:
                pairs = ",".join(
                    f'{key}="{_escape(value)}"'
                    for key, value in sorted(sample.labels.items(), key=_label_order)
                )
                out.append(f"{sample.name}{{{pairs}}} {format_number(sample.value)}\n")
            else:
                out.append(f"{sample.name} {format_number(sample.value)}\n")
    return "".join(out).encode()


def format_number(value: float) -> str:
    """A sample value (or a bucket bound) as the text format writes it."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _label_order(pair: tuple[str, str]) -> tuple[bool, str]:
    """Triton's order: labels by name (prometheus-cpp keeps them in a sorted map), then a
    bucket's `le` or a summary's `quantile`, which its serializer appends. Scrapers that
    match a sample's text, as Triton's own tests do, depend on it."""
    return (pair[0] in _TRAILING, pair[0])


_TRAILING = frozenset({"le", "quantile"})


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
