from __future__ import annotations

from collections.abc import Iterator

import pytest
from serverproc import ServerProcess, running_server


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """One ge-serve process serving examples/models for the whole session."""
    with running_server() as proc:
        yield proc
