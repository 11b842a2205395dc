"""The CV examples' end-to-end tests' shared parts: a server of one example's repository,
built as its build script builds it by default, on the simulated NPU, and the sample
photos; each skips, saying why, where a package is missing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import cvrepo
import pytest
from serverproc import ServerProcess, running_server


@contextmanager
def example_server(build: ModuleType, repo: Path, what: str) -> Iterator[ServerProcess]:
    try:
        build.build(repo)
    except build.PackageMissing as exc:
        pytest.skip(f"the {what} example cannot be built: {exc}")
    # --device sim: the example's networks must land on the simulated NPU, never elsewhere.
    with running_server([repo], ["--device", "sim"], timeout=150.0) as proc:
        yield proc


def photo(name: str) -> bytes:
    try:
        return cvrepo.photo(name)
    except cvrepo.PhotoMissing as exc:
        pytest.skip(str(exc))
