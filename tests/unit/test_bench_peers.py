"""The peers suite's own figures: ge-serve ÷ raw onnxruntime from run folders, the RSS of
a process group, and the wrapper that runs this checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

from polling import poll

from bench.lib import peers
from bench.lib.server import REPO_ROOT
from bench.suites import peers as suite


def write_run(run: Path, peer: str, ort: float) -> None:
    """A run folder's raw onnxruntime reference, as run_peers.sh writes it."""
    run.mkdir(parents=True, exist_ok=True)
    (run / f"ort_ref__{peer}.csv").write_text(
        f"model,batch,samples_per_s\nsimple,1,{ort / 2}\nsimple,8,{ort}\n"
    )


def test_ort_ratios_are_medians_over_runs_of_each_runs_own_reference(tmp_path: Path) -> None:
    measured: dict[str, peers.RunPoints] = {}
    runs = []
    for index, (ips, ort) in enumerate([(100.0, 400.0), (300.0, 600.0), (90.0, 100.0)]):
        run = tmp_path / f"r{index}"
        write_run(run, "ge", ort)
        # What compare.py's points() reads from the run's perf_analyzer CSVs.
        measured[str(run)] = {("ge", "simple", "grpc", 1): {"ips": ips, "p50": 500.0}}
        runs.append(run)
    ratios = peers.ort_ratios(measured.__getitem__, runs, "ge")
    assert ratios == {("simple", "grpc", 1): (0.5, 3)}  # median of 0.25, 0.5, 0.9
    assert peers.ort_ratios(measured.__getitem__, runs, "triton") == {}


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_group_rss_counts_every_process_of_the_group() -> None:
    leader = subprocess.Popen(["sleep", "30"], process_group=0)
    other = subprocess.Popen(["sleep", "30"], process_group=leader.pid)
    try:
        both = (leader.pid, other.pid)

        def running() -> bool:
            return all(Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sleep") for p in both)

        poll(running, 10, "both to run sleep")
        # RSS grows while the dynamic loader maps sleep's libraries: wait until it holds.
        readings = [-1]

        def settled() -> bool:
            readings.append(_rss(leader.pid) + _rss(other.pid))
            return readings[-1] == readings[-2]

        poll(settled, 10, "sleep's RSS to settle")
        expected = readings[-1]
        assert expected > 0
        assert 0.5 * expected <= peers.group_rss_bytes(leader.pid) <= 1.5 * expected
    finally:
        for process in (other, leader):
            process.kill()
            process.wait()


def test_the_wrapper_runs_this_checkouts_cli(tmp_path: Path) -> None:
    root = subprocess.run(
        ["bash", str(REPO_ROOT / "tools" / "pyroot.sh")],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    wrapper = suite.ge_wrapper(tmp_path, root)
    answer = subprocess.run([str(wrapper), "--help"], capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0
    assert "--model-namespacing" in answer.stdout
