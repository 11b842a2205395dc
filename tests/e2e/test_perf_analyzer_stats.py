"""perf_analyzer against ge-serve prints its server-side breakdown, read from the statistics
extension: queue, compute input, compute infer, compute output.

perf_analyzer comes from the tritonclient 2.51.0 wheel, set up by
bench/setup_perf_analyzer.sh. The test finds it there, or through $PERF_ANALYZER or PATH,
and is skipped, saying why, only when no runnable binary is found.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from serverproc import ServerProcess

from bench.lib import perfa

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def _library_path() -> str:
    """perf_analyzer loads libcudart.so.12 (never uses a GPU); the PyPI wheel provides it."""
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    try:
        import nvidia.cuda_runtime as cuda_runtime

        paths += [str(Path(p) / "lib") for p in cuda_runtime.__path__]
    except ImportError:
        pass
    return ":".join(paths)


def find_perf_analyzer() -> tuple[str, dict[str, str]]:
    """bench/setup_perf_analyzer.sh's cached setup first (never installing from a test),
    then $PERF_ANALYZER, PATH and the Python scripts folder."""
    try:
        return perfa.find_perf_analyzer(install=False)
    except perfa.PerfAnalyzerUnavailable as exc:
        setup_said = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    candidates = [
        os.environ.get("PERF_ANALYZER", ""),
        shutil.which("perf_analyzer") or "",
        str(Path(sysconfig.get_path("scripts")) / "perf_analyzer"),
    ]
    env = {**os.environ, "LD_LIBRARY_PATH": _library_path()}
    reasons: list[str] = []
    for candidate in dict.fromkeys(c for c in candidates if c):
        if not Path(candidate).is_file():
            continue
        probe = subprocess.run(
            [candidate, "--version"], env=env, capture_output=True, text=True, timeout=30
        )
        if probe.returncode == 0:
            return candidate, env
        reasons.append(f"{candidate}: {(probe.stderr or probe.stdout).strip()[:200]}")
    pytest.skip(
        "perf_analyzer cannot be set up: no runnable binary found via $PERF_ANALYZER, PATH "
        "or the Python scripts folder, and bench/setup_perf_analyzer.sh has not set it up "
        f"({setup_said}); run bench/setup_perf_analyzer.sh"
        + (f"; tried {reasons}" if reasons else "")
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_server_side_breakdown(server: ServerProcess, protocol: str) -> None:
    binary, env = find_perf_analyzer()
    url = server.http_url if protocol == "http" else server.grpc_url
    result = subprocess.run(
        [
            binary,
            "-m",
            "simple",
            "-u",
            url,
            "-i",
            protocol,
            "--concurrency-range",
            "2",
            "--measurement-interval",
            "500",
            "--max-trials",
            "4",
            # The server-side section is what this test reads, not a steady rate: on a
            # loaded 2-core CI runner windows can differ by more than 2x, and perf_analyzer
            # then prints no report at all (max/min must stay within 1 + this / 100).
            "--stability-percentage",
            "100000",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    server_part = output.split("Server:", 1)
    assert len(server_part) == 2, f"no server-side section:\n{output}"
    section = server_part[1]
    inferences = re.search(r"Inference count: (\d+)", section)
    executions = re.search(r"Execution count: (\d+)", section)
    successes = re.search(r"Successful request count: (\d+)", section)
    assert inferences and executions and successes, output
    assert int(inferences.group(1)) > 0
    # simple gets dynamic batching from auto-complete (max_batch_size 8, as in Triton), so
    # concurrent batch-1 requests may share an execution.
    assert int(inferences.group(1)) == int(successes.group(1))
    assert 0 < int(executions.group(1)) <= int(inferences.group(1))
    breakdown = re.search(
        r"Avg request latency: \d+ usec \(overhead \d+ usec \+ queue \d+ usec \+ "
        r"compute input \d+ usec \+ compute infer \d+ usec \+ compute output \d+ usec\)",
        section,
    )
    assert breakdown, f"no server-side latency breakdown:\n{output}"
