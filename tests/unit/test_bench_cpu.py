"""The cpu-per-request suite's arithmetic: CPU time per inference from /proc and the
server's statistics, medians and ratios over rounds, and the report's tables."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from polling import poll

from bench.suites.cpu_per_request import (
    Point,
    answered_count,
    cpu_split,
    point_of,
    report,
    summarise,
)


def test_answered_count_sums_the_success_counts_of_a_statistics_answer() -> None:
    stats = {
        "model_stats": [
            {"name": "simple", "inference_stats": {"success": {"count": 7, "ns": 1}}},
            {"name": "simple", "inference_stats": {"success": {"count": 5, "ns": 1}}},
        ]
    }
    assert answered_count(stats) == 12


def test_a_point_is_cpu_time_per_inference_with_the_main_process_share() -> None:
    point = point_of((3_000_000, 750_000), 1000, 950.0, 1.5)
    assert point.cpu_us == 3.0
    assert point.main_share == 0.25
    with pytest.raises(RuntimeError, match="no inference"):
        point_of((1000, 1000), 0, 1.0, 1.0)


@pytest.mark.timeout(30)
def test_cpu_split_counts_children_apart_from_the_main_process() -> None:
    # A parent that sleeps, with a child that spins: the tree's CPU time grows, the
    # parent's own share of it stays small. Polled, as a busy machine gives the child
    # less than its wall time.
    spin = "import time\nt = time.monotonic() + 4.0\nwhile time.monotonic() < t: pass"
    code = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])"
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.3)
        first = cpu_split(parent.pid)
        second = poll(
            lambda: split if (split := cpu_split(parent.pid))[0] - first[0] > 0.1e9 else None,
            timeout=3.5,
            what="the child's CPU time",
        )
    finally:
        parent.wait(15)
    tree = second[0] - first[0]
    main = second[1] - first[1]
    assert tree > 0.1e9
    assert main < tree / 4


def _p(cpu: float, ips: float, p50: float = 1.0) -> Point:
    return Point(cpu, 1.0, ips, p50, 100)


def test_summarise_takes_medians_and_ratios_of_the_rounds() -> None:
    rounds = [
        {"ge": {"grpc/c16": _p(300, 1000)}, "triton": {"grpc/c16": _p(200, 2000)}},
        {"ge": {"grpc/c16": _p(200, 1000)}, "triton": {"grpc/c16": _p(200, 1000)}},
        {"ge": {"grpc/c16": _p(400, 900)}, "triton": {"grpc/c16": _p(100, 900)}},
    ]
    (row,) = summarise(rounds, ["ge", "triton"])
    assert row["point"] == "grpc/c16"
    assert row["ge"]["cpu_us"] == 300
    assert row["triton"]["ips"] == 1000
    # The median of the rounds' ratios (1.5, 1.0, 4.0), not the ratio of the medians.
    assert row["ge/triton"]["cpu_us"] == 1.5
    assert row["ge/triton"]["ips"] == 1.0


def test_the_report_has_each_server_and_each_ratio_and_marks_what_is_missing() -> None:
    rounds = [{"ge": {"json/c1": _p(150, 500)}, "bare": {}}]
    text = report(summarise(rounds, ["ge", "bare"]), ["ge", "bare"], "# t")
    assert "| json/c1 | 150 | 500 | 1.00 | - | - | - | 1.00 |" in text
    assert "CPU/req ÷ bare" in text
    assert "| json/c1 | - | - | - |" in text
