from __future__ import annotations

from collections.abc import Iterator

import pytest
from protocols import PROTOCOLS, Triton
from serverproc import ServerProcess, running_server


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """One ge-serve process serving examples/models for the whole session."""
    with running_server() as proc:
        yield proc


@pytest.fixture(params=PROTOCOLS)
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Triton]:
    """A tritonclient for each protocol, on the session server: data-plane tests take this
    fixture and run once over HTTP and once over gRPC."""
    triton = Triton.connect(request.param, server)
    try:
        yield triton
    finally:
        triton.close()
