from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import settings
from modelgen import make_lifecycle
from ownprocess import WATCH_PROCESS, runs_here
from protocols import PROTOCOLS, Triton
from serverproc import ServerProcess, running_server

from ge_serve.server.models.lifecycle import ModelLifecycle

# Property and fuzz tests: "ci" (the default) keeps the whole set well under a minute on two
# cores; "fuzz" searches longer, for a local run: HYPOTHESIS_PROFILE=fuzz (or pytest's
# --hypothesis-profile=fuzz). The deadline is loose on purpose: it catches an input that
# makes a decoder crawl, not a busy machine. No example database is written in CI.
settings.register_profile(
    "ci", max_examples=40, deadline=timedelta(seconds=2), database=None, print_blob=True
)
settings.register_profile("fuzz", max_examples=3000, deadline=timedelta(seconds=2))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tests that watch with an audit hook out of the shared process, and run only
    them in the process started for them (tests/ownprocess.py says why)."""
    in_watch_process = os.environ.get(WATCH_PROCESS) == "1"
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        names = getattr(item, "fixturenames", ())
        (keep if runs_here(names, in_watch_process) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def thaw_the_heap() -> Iterator[None]:
    """A control or app run in process freezes the collector's heap (startup/gcheap.py),
    which in a test process would hold later tests' garbage: each test ends thawed."""
    yield
    gc.unfreeze()


@pytest.fixture(scope="session")
def examples_server() -> Iterator[ServerProcess]:
    """One ge-serve process serving examples/models, with the default flags, for the whole
    session: `server`, also where a module names a server of its own so."""
    with running_server() as proc:
        yield proc


@pytest.fixture(scope="session")
def server(examples_server: ServerProcess) -> ServerProcess:
    """One ge-serve process serving examples/models for the whole session."""
    return examples_server


@pytest.fixture(scope="session")
def perf_analyzer() -> tuple[str, dict[str, str]]:
    """perf_analyzer (binary, environment) as bench/setup_perf_analyzer.sh set it up; a test
    never installs it, and one that takes this fixture skips, saying why, where it is not."""
    from bench.lib import perfa

    try:
        return perfa.find_perf_analyzer(install=False)
    except perfa.PerfAnalyzerUnavailable as exc:
        pytest.skip(f"perf_analyzer not set up (bench/setup_perf_analyzer.sh): {exc}")


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Triton]:
    """A tritonclient for each protocol, on the session server: data-plane tests take this
    fixture and run once over HTTP and once over gRPC."""
    triton = Triton.connect(request.param, server)
    try:
        yield triton
    finally:
        triton.close()


@pytest.fixture
async def lifecycle(tmp_path: Path) -> AsyncIterator[ModelLifecycle]:
    """A lifecycle over an empty repository folder (tests write models into it)."""
    life = make_lifecycle(tmp_path)
    try:
        yield life
    finally:
        await life.close()
