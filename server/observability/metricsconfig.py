"""`--metrics-config key=value` settings, parsed on their own so the command line can check
them without loading the metrics machinery (prometheus_client, numpy)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ge_serve.backends.text_bool import parse_bool

DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)


def _flag(key: str, value: str) -> bool:
    try:
        return parse_bool(value)
    except ValueError as exc:
        raise ValueError(f"--metrics-config {key}: {exc}") from None


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """`--metrics-config key=value` settings (Triton's keys, plus our histograms)."""

    counter_latencies: bool = True
    # Off by default in Triton; on here, because users asked for p50/p95/p99.
    summary_latencies: bool = True
    summary_quantiles: tuple[float, ...] = DEFAULT_QUANTILES
    summary_max_age_s: float = 60.0
    # Off by default in Triton too; on here for the dashboard's aggregatable quantiles
    # (docs/reference.md, deliberate differences).
    histogram_latencies: bool = True

    @classmethod
    def parse(cls, pairs: Iterable[tuple[str, str]]) -> MetricsConfig:
        values: dict[str, object] = {}
        for key, value in pairs:
            if key in ("counter_latencies", "summary_latencies", "histogram_latencies"):
                values[key] = _flag(key, value)
            elif key == "summary_quantiles":
                values[key] = _quantiles(value)
            elif key == "summary_max_age_secs":
                try:
                    age = float(value)
                except ValueError:
                    age = -1.0
                if not (age > 0 and math.isfinite(age)):
                    raise ValueError(
                        f"--metrics-config summary_max_age_secs: expected finite seconds > 0, "
                        f"got '{value}'"
                    )
                values["summary_max_age_s"] = age
            else:
                raise ValueError(
                    f"--metrics-config: unknown key '{key}' (known: counter_latencies, "
                    "summary_latencies, summary_quantiles, summary_max_age_secs, "
                    "histogram_latencies)"
                )
        return cls(**values)  # type: ignore[arg-type]


def _quantiles(text: str) -> tuple[float, ...]:
    """Triton's `<quantile>:<error>,...`; the error part is accepted and unused."""
    found: list[float] = []
    for part in text.split(","):
        head = part.split(":", 1)[0].strip()
        try:
            q = float(head)
        except ValueError:
            q = -1.0
        if not 0.0 <= q <= 1.0:
            raise ValueError(
                f"--metrics-config summary_quantiles: expected <quantile>:<error>,... with "
                f"quantiles in [0, 1], got '{text}'"
            )
        found.append(q)
    return tuple(sorted(set(found)))
