"""What the `peers` suite reads of ../shared/peers runs: ratios, memory, start-up.

`run_peers.sh` writes one folder per run; its `summarize.py` and `compare.py` read them.
This adds the figures they do not give: ge-serve ÷ raw onnxruntime as a median over
runs (each run measures onnxruntime just before each peer), and for a peer started with
`run_peers.sh serve`, its memory (the RSS of its whole process group: Triton's stub
processes count) and how long it took from launch to ready.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import statistics
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

# run_peers.sh's fixed loopback HTTP ports.
HTTP_PORT = {"mlserver": 18080, "kserve": 18090, "triton": 18100, "ge": 18110}
# The four models build_models.py makes.
PEER_MODELS = ("simple", "identity_fp32", "resnet18_like", "minilm_like")

Point = tuple[str, str, int]  # model, protocol, concurrency


def load_compare(peers_dir: Path) -> ModuleType:
    """../shared/peers/compare.py as a module (it imports summarize.py beside it)."""
    spec = importlib.util.spec_from_file_location("peers_compare", peers_dir / "compare.py")
    if spec is None or spec.loader is None:
        raise FileNotFoundError(peers_dir / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ort_reference(run: Path, peer: str) -> dict[str, float]:
    """Raw onnxruntime's best samples/s per model, measured just before `peer`."""
    best: dict[str, float] = {}
    path = run / f"ort_ref__{peer}.csv"
    if not path.is_file():
        return best
    with path.open() as f:
        for row in csv.DictReader(f):
            best[row["model"]] = max(best.get(row["model"], 0.0), float(row["samples_per_s"]))
    return best


# What compare.py's `points(run)` gives for one run: (peer, model, protocol, concurrency)
# -> that point's figures ("ips", ...).
RunPoints = Mapping[tuple[str, str, str, int], Mapping[str, float]]


def ort_ratios(
    points_of: Callable[[str], RunPoints], runs: Sequence[Path], peer: str
) -> dict[Point, tuple[float, int]]:
    """`peer`'s infer/s ÷ raw onnxruntime's, median over runs, with how many runs.
    `points_of` reads one run's points (compare.py's `points`)."""
    found: dict[Point, list[float]] = {}
    for run in runs:
        reference = ort_reference(run, peer)
        for (who, model, protocol, concurrency), result in points_of(str(run)).items():
            if who == peer and reference.get(model):
                ratio = result["ips"] / reference[model]
                found.setdefault((model, protocol, concurrency), []).append(ratio)
    return {k: (statistics.median(v), len(v)) for k, v in sorted(found.items())}


def group_rss_bytes(pgid: int) -> int:
    """The resident memory of every process in process group `pgid`."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total


def ready(port: int, models: Sequence[str]) -> bool:
    """Whether the server on `port` is ready, with every one of `models`."""
    paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)]
    try:
        for path in paths:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as answer:
                if answer.status != 200:
                    return False
    except OSError:
        return False
    return True


def wait_ready(port: int, models: Sequence[str], timeout_s: float) -> float | None:
    """Poll until ready: the monotonic time it was first seen ready, or None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready(port, models):
            return time.monotonic()
        time.sleep(0.05)
    return None


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")
