"""Scrape and look up Prometheus samples, for tests that check exact values."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Exposition:
    # family name -> type, from "# TYPE" lines
    types: dict[str, str] = field(default_factory=dict)
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    @property
    def names(self) -> set[str]:
        """Every family and sample name exported (histogram buckets, summary parts...)."""
        return set(self.types) | {name for name, _, _ in self.samples}

    def find(self, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
        return [
            (sample_labels, value)
            for sample_name, sample_labels, value in self.samples
            if sample_name == name and all(sample_labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, name: str, **labels: str) -> float:
        found = self.find(name, **labels)
        assert len(found) == 1, f"expected one {name}{labels}, found {found}"
        return found[0][1]


def parse(text: str) -> Exposition:
    """Parse with prometheus-client's own text-format parser, which raises on malformed
    exposition, so every scrape also checks that the server's text is valid.

    The parser reports counter samples as `<name>_total` whether or not the wire had the
    suffix; Triton's counters (`nv_inference_count`) have none, and dashboards query the
    names as exposed, so samples and families keep the names the wire used."""
    lines = text.splitlines()
    exposed = {line.split("{", 1)[0].split(" ", 1)[0] for line in lines if line[:1] != "#"}
    typed = {line.split()[2] for line in lines if line.startswith("# TYPE ")}
    out = Exposition()
    for family in text_string_to_metric_families(text):
        family_name = family.name if family.name in typed else family.name + "_total"
        out.types[family_name] = family.type
        for sample in family.samples:
            name = sample.name
            if name not in exposed and name.removesuffix("_total") in exposed:
                name = name.removesuffix("_total")
            out.samples.append((name, dict(sample.labels), float(sample.value)))
    return out


def scrape(url: str) -> Exposition:
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)


# --- names a PromQL expression reads (dashboards, adapter rules, scaler queries) ---------

_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
_PROMQL_WORDS |= {"and", "or", "unless", "offset"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression reads: not functions, keywords, labels or strings."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", "", text)  # grouping labels
    names: set[str] = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group() in _PROMQL_WORDS:
            continue  # a function or a keyword
        names.add(match.group())
    return names
