"""The run's summary: latency per window, RSS growth, reloads, the verdict and the markdown."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .outcomes import EXPECTED, SERVER_ERROR, UNEXPECTED, Tally, classify_grpc, classify_http


def percentile_ms(latencies_s: Sequence[float], q: float) -> float | None:
    if not len(latencies_s):
        return None
    return float(np.percentile(np.asarray(latencies_s), q)) * 1000.0


def longest_silence(finished_s: Sequence[float]) -> float | None:
    if not len(finished_s):
        return None
    times = np.sort(np.concatenate([[0.0], np.asarray(finished_s)]))
    return float(np.diff(times).max())


@dataclass(frozen=True, slots=True)
class Window:
    """The valid requests that finished in [start_s, start_s + width)."""

    start_s: float
    ok: int
    p99_ms: float | None
    max_ms: float | None
    # How many clients got an answer: none in a window means every client was stuck at once.
    clients: int = 0


def timeline(
    finished_s: Sequence[float],
    latencies_s: Sequence[float],
    width_s: float,
    clients: Sequence[int] | None = None,
) -> list[Window]:
    """Latency per window of the run, to tell a stall (a reload's?) from a slow run."""
    if not len(finished_s):
        return []
    at = np.asarray(finished_s)
    latencies = np.asarray(latencies_s)
    who = np.asarray(clients if clients is not None else np.zeros(len(at), np.int32))
    index = np.floor(at / width_s).astype(np.int64)
    windows = []
    for i in range(int(index.max()) + 1):
        mask = index == i
        chosen = latencies[mask].tolist()
        windows.append(
            Window(
                start_s=i * width_s,
                ok=len(chosen),
                p99_ms=percentile_ms(chosen, 99),
                max_ms=percentile_ms(chosen, 100),
                clients=len(np.unique(who[mask])),
            )
        )
    return windows


@dataclass(frozen=True, slots=True)
class ProtocolSummary:
    protocol: str
    valid_ok: int
    valid_failed: int
    failed_during_reload: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    invalid_expected: int
    invalid_server_error: int
    invalid_unexpected: int
    failures: list[str]
    cases: dict[str, dict[str, int]]
    timeline: list[Window] = field(default_factory=list)
    # The longest time from the run's start or one valid answer to the next.
    longest_silence_s: float | None = None

    @classmethod
    def of(cls, protocol: str, tally: Tally, window_s: float = 5.0) -> ProtocolSummary:
        return cls(
            protocol=protocol,
            valid_ok=tally.valid_ok,
            valid_failed=tally.valid_failed,
            failed_during_reload=tally.failed_during_reload,
            p50_ms=percentile_ms(tally.latencies_s, 50),
            p99_ms=percentile_ms(tally.latencies_s, 99),
            max_ms=percentile_ms(tally.latencies_s, 100),
            invalid_expected=tally.invalid[EXPECTED],
            invalid_server_error=tally.invalid[SERVER_ERROR],
            invalid_unexpected=tally.invalid[UNEXPECTED],
            failures=list(tally.failures),
            cases={case: dict(sorted(c.items())) for case, c in sorted(tally.cases.items())},
            timeline=timeline(tally.finished_s, tally.latencies_s, window_s, tally.clients),
            longest_silence_s=longest_silence(tally.finished_s),
        )

    def worst_window(self) -> Window | None:
        timed = [w for w in self.timeline if w.p99_ms is not None]
        return max(timed, key=lambda w: w.p99_ms or 0.0, default=None)

    @property
    def sent(self) -> int:
        invalid = self.invalid_expected + self.invalid_server_error + self.invalid_unexpected
        return self.valid_ok + self.valid_failed + invalid


@dataclass(frozen=True, slots=True)
class RssSummary:
    start_bytes: int | None
    end_bytes: int | None
    peak_bytes: int | None
    growth_pct: float | None
    samples: int
    # (s into the run, bytes) about every 10 s, to tell warm-up from a steady leak.
    series: list[tuple[float, int]] = field(default_factory=list)


def rss_windows(duration_s: float, rss_every_s: float) -> tuple[float, float]:
    """(warm-up, averaging window) in seconds for a run of `duration_s`."""
    warmup = min(20.0, 0.1 * duration_s)
    window = max(2.0 * rss_every_s, min(20.0, 0.05 * duration_s))
    return warmup, window


def summarise_rss(
    samples: Sequence[tuple[float, int]], warmup_s: float, window_s: float
) -> RssSummary:
    """Median RSS of the first window after the warm-up and of the last window of samples."""
    after = [(t, rss) for t, rss in samples if t >= warmup_s]
    if not after:
        return RssSummary(None, None, None, None, len(samples))
    first_t, last_t = after[0][0], after[-1][0]
    start = int(np.median([rss for t, rss in after if t <= first_t + window_s]))
    end = int(np.median([rss for t, rss in after if t >= last_t - window_s]))
    peak = max(rss for _, rss in after)
    growth = 100.0 * (end - start) / start if start > 0 else None
    series: list[tuple[float, int]] = []
    for t, rss in samples:
        if not series or t >= series[-1][0] + 10.0:
            series.append((round(t, 1), rss))
    return RssSummary(start, end, peak, growth, len(samples), series)


@dataclass(frozen=True, slots=True)
class ReloadSummary:
    done: int
    failed: int
    max_s: float | None
    failures: list[str]
    # (s into the run, how long it took) of each reload that succeeded
    times: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SoakReport:
    duration_s: float
    http_clients: int
    grpc_clients: int
    invalid_fraction: float
    reload_every_s: float
    protocols: list[ProtocolSummary]
    reloads: ReloadSummary
    rss: RssSummary
    server_exit_code: int | None = None
    server_tracebacks: int = 0
    # Old versions of simple retired before shutdown (the server log): reloads were real.
    retired_versions: int = 0
    # CPU seconds used during the run, to see how much of the machine the load took.
    client_cpu_s: float | None = None
    server_cpu_s: float | None = None

    @property
    def requests_per_s(self) -> float:
        sent = sum(p.sent for p in self.protocols)
        return sent / self.duration_s if self.duration_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "requests_per_s": self.requests_per_s}


def verdict(report: SoakReport, max_rss_growth_pct: float) -> list[str]:
    """Why the run failed; empty when it passed."""
    problems = []
    failed = sum(p.valid_failed for p in report.protocols)
    if failed:
        problems.append(f"{failed} valid request(s) failed")
    server_errors = sum(p.invalid_server_error for p in report.protocols)
    if server_errors:
        problems.append(f"{server_errors} invalid request(s) got a 5xx / INTERNAL answer")
    if report.reloads.failed:
        problems.append(f"{report.reloads.failed} reload(s) failed")
    growth = report.rss.growth_pct
    if growth is None:
        problems.append("no RSS samples after the warm-up")
    elif growth > max_rss_growth_pct:
        problems.append(f"RSS grew {growth:.1f} % (limit {max_rss_growth_pct:g} %)")
    return problems


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def markdown(report: SoakReport, problems: Sequence[str] = ()) -> str:
    rows = [
        "| protocol | valid ok | failed valid | p50 ms | p99 ms | max ms "
        "| invalid: expected | invalid: 5xx/INTERNAL | invalid: unexpected |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in report.protocols:
        rows.append(
            f"| {p.protocol} | {p.valid_ok} | {p.valid_failed} | {_ms(p.p50_ms)} "
            f"| {_ms(p.p99_ms)} | {_ms(p.max_ms)} | {p.invalid_expected} "
            f"| {p.invalid_server_error} | {p.invalid_unexpected} |"
        )
    rss = report.rss
    growth = "-" if rss.growth_pct is None else f"{rss.growth_pct:+.2f} %"
    reload_max = "-" if report.reloads.max_s is None else f"{report.reloads.max_s:.2f} s"
    worst = []
    for p in report.protocols:
        w = p.worst_window()
        if w is not None:
            worst.append(f"{p.protocol} {_ms(w.p99_ms)} ms at t={w.start_s:.0f} s")
    width = next((p.timeline[1].start_s for p in report.protocols if len(p.timeline) > 1), None)
    width_text = "" if width is None else f"{width:g} s "
    silences = ", ".join(f"{p.protocol} {_secs(p.longest_silence_s)} s" for p in report.protocols)
    lines = [
        f"Soak: {report.duration_s:.0f} s, {report.http_clients} HTTP + {report.grpc_clients} "
        f"gRPC clients, {100 * report.invalid_fraction:g} % invalid, "
        f"{report.requests_per_s:.0f} requests/s",
        "",
        *rows,
        "",
        "| measure | value |",
        "|---|---|",
        f"| reloads of simple (every {report.reload_every_s:g} s) | {report.reloads.done} done, "
        f"{report.reloads.failed} failed, slowest {reload_max} |",
        f"| old versions retired (server log) | {report.retired_versions} |",
        f"| RSS start / end / peak (MiB) | {_mib(rss.start_bytes)} / {_mib(rss.end_bytes)} "
        f"/ {_mib(rss.peak_bytes)} ({rss.samples} samples) |",
        f"| RSS growth | {growth} |",
        f"| worst {width_text}window p99 | {', '.join(worst) or '-'} |",
        f"| longest time without a valid answer | {silences} |",
        f"| CPU s, load generator / server | {_secs(report.client_cpu_s)} "
        f"/ {_secs(report.server_cpu_s)} |",
        f"| failed valid during a reload | "
        f"{sum(p.failed_during_reload for p in report.protocols)} |",
        f"| server exit code / tracebacks in its log | {report.server_exit_code} "
        f"/ {report.server_tracebacks} |",
        f"| verdict | {'PASS' if not problems else 'FAIL: ' + '; '.join(problems)} |",
    ]
    odd = [
        f"| {p.protocol} | {case} | "
        + ", ".join(f"{answer} x{n}" for answer, n in answers.items())
        + " |"
        for p in report.protocols
        for case, answers in p.cases.items()
        if any(_outcome_of(p.protocol, a) != EXPECTED for a in answers)
    ]
    if odd:
        lines += ["", "| protocol | invalid case | answers |", "|---|---|---|", *odd]
    failures = [f"- {p.protocol}: {f}" for p in report.protocols for f in p.failures]
    failures += [f"- reload: {f}" for f in report.reloads.failures]
    if failures:
        lines += ["", "First failures:", *failures]
    return "\n".join(lines) + "\n"


def _outcome_of(protocol: str, answer: str) -> str:
    if protocol == "http":
        return classify_http(int(answer)) if answer.isdigit() else UNEXPECTED
    return classify_grpc(answer)
