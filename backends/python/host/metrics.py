"""Custom metrics of Python models (`pb_utils.MetricFamily` / `Metric`), kept in the server.

Every instance of every Python model is a process of its own, so the series live here:
instances that create the same family (name and kind) and a metric with the
same labels share one series, as they share one in Triton. A worker's metrics go when it
does (or when the model deletes them); a family goes with its last metric and owner.
/metrics shows them through `collect()`, next to Triton's own families.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
_KINDS = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
# The server's own families: a model's family of one of these names would give /metrics a
# second TYPE line for it, and Prometheus drops a scrape with one (every metric lost).
RESERVED_PREFIXES = ("nv_", "ge_serve_", "vllm:")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(slots=True)
class _Family:
    id: int
    name: str
    description: str
    kind: int
    owners: set[object] = field(default_factory=set)


@dataclass(slots=True)
class _Series:
    id: int
    family: _Family
    labels: tuple[tuple[str, str], ...]
    buckets: tuple[float, ...] = ()
    value: float = 0.0
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0
    owners: dict[object, int] = field(default_factory=dict)


class CustomMetrics:
    """Thread-safe: workers' reader threads update it, the metrics endpoint collects."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._family_ids: dict[int, _Family] = {}
        self._series: dict[int, _Series] = {}
        self._by_key: dict[tuple[int, tuple[tuple[str, str], ...]], _Series] = {}
        self._next = 1

    def family(self, owner: object, name: str, description: str, kind: int) -> int:
        if not _NAME.match(name):
            raise ValueError(f"'{name}' is not a valid metric name")
        if name.startswith(RESERVED_PREFIXES):
            raise ValueError(
                f"'{name}' is reserved: metric names starting with "
                f"{', '.join(RESERVED_PREFIXES)} are the server's own"
            )
        if kind not in _KINDS:
            raise ValueError(f"unknown metric kind {kind}")
        with self._lock:
            found = self._families.get(name)
            if found is not None:
                # Another description gets the family as it is, as Triton's registry
                # merges families by name (its first description stays).
                if found.kind != kind:
                    raise ValueError(
                        f"a metric family named '{name}' already exists with another kind"
                    )
            else:
                found = _Family(self._take_id(), name, description, kind)
                self._families[name] = found
                self._family_ids[found.id] = found
            found.owners.add(owner)
            return found.id

    def metric(
        self,
        owner: object,
        family_id: int,
        labels: list[tuple[str, str]],
        buckets: list[float],
    ) -> int:
        with self._lock:
            family = self._family_ids.get(family_id)
            if family is None:
                raise ValueError("the metric family no longer exists")
            for key, _ in labels:
                if not _LABEL.match(key) or key.startswith("__"):
                    raise ValueError(f"'{key}' is not a valid label name")
            pairs = tuple((str(k), str(v)) for k, v in labels)
            series = self._by_key.get((family.id, pairs))
            if series is None:
                bounds = tuple(float(b) for b in buckets)
                series = _Series(self._take_id(), family, pairs, bounds)
                series.counts = [0] * len(bounds)
                self._series[series.id] = series
                self._by_key[(family.id, pairs)] = series
            elif family.kind == HISTOGRAM and tuple(float(b) for b in buckets) != series.buckets:
                raise ValueError("a histogram metric with these labels has other buckets")
            series.owners[owner] = series.owners.get(owner, 0) + 1
            return series.id

    def update(self, metric_id: int, op: str, value: float) -> None:
        with self._lock:
            series = self._series.get(metric_id)
            if series is None:
                return
            if op == "increment":
                series.value += value
            elif op == "set":
                series.value = value
            elif op == "observe":
                series.total += value
                series.count += 1
                for index, bound in enumerate(series.buckets):
                    if value <= bound:
                        series.counts[index] += 1

    def value(self, metric_id: int) -> float:
        with self._lock:
            series = self._series.get(metric_id)
            if series is None:
                raise ValueError("the metric no longer exists")
            return series.value

    def delete(self, owner: object, metric_id: int) -> None:
        with self._lock:
            series = self._series.get(metric_id)
            if series is None or owner not in series.owners:
                return
            series.owners[owner] -= 1
            if series.owners[owner] <= 0:
                del series.owners[owner]
            self._drop_unowned()

    def release(self, owner: object) -> None:
        """Everything a worker held (it ended)."""
        with self._lock:
            for series in self._series.values():
                series.owners.pop(owner, None)
            for family in self._families.values():
                family.owners.discard(owner)
            self._drop_unowned()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            families = []
            for family in self._families.values():
                metric = Metric(family.name, family.description, _KINDS[family.kind])
                for series in self._series.values():
                    if series.family is family:
                        _samples(metric, series)
                families.append(metric)
        yield from families

    def _take_id(self) -> int:
        found = self._next
        self._next += 1
        return found

    def _drop_unowned(self) -> None:
        for series in [s for s in self._series.values() if not s.owners]:
            del self._series[series.id]
            del self._by_key[(series.family.id, series.labels)]
        used = {s.family.id for s in self._series.values()}
        for family in [f for f in self._families.values() if not f.owners and f.id not in used]:
            del self._families[family.name]
            del self._family_ids[family.id]


def _samples(metric: Metric, series: _Series) -> None:
    labels = dict(series.labels)
    name = series.family.name
    if series.family.kind != HISTOGRAM:
        metric.add_sample(name, labels, series.value)
        return
    for bound, count in zip(series.buckets, series.counts, strict=True):
        metric.add_sample(f"{name}_bucket", {**labels, "le": _bound(bound)}, count)
    metric.add_sample(f"{name}_bucket", {**labels, "le": "+Inf"}, series.count)
    metric.add_sample(f"{name}_count", labels, series.count)
    metric.add_sample(f"{name}_sum", labels, series.total)


def _bound(value: float) -> str:
    """A bucket's `le` as Triton's (prometheus-cpp's) exposition writes it: the shortest
    round-trip form, with no ".0" on a whole number (`le="1"`, `le="2.5"`)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text
