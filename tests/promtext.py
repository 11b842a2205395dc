"""A small reader for the Prometheus text format, for tests that check exact values."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import httpx

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


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
    out = Exposition()
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                out.types[parts[2]] = parts[3]
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        out.samples.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return out


def scrape(url: str) -> Exposition:
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)
