"""Failure counters exist from the moment a model loads, ensembles included.

Ported from Triton's qa (L0_model_queue, L0_request_cancellation,
L0_backend_python/lifecycle): before sending anything, the tests read
`nv_inference_request_failure{model="m",reason="R",version="1"} N` from the raw text
of /metrics with a regular expression, so the counter must be there at 0 for every
reason, with its labels in Triton's order.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from ensemblerepo import write_pipelines
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
MODELS = ("add1", "add10", "add_sub", "chain", "diamond")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo: Path = tmp_path_factory.mktemp("failure-metrics-repo")
    write_pipelines(repo)
    with running_server([repo]) as proc:
        yield proc


@pytest.mark.parametrize("model", MODELS)
def test_every_failure_reason_reads_0_before_any_request(server: ServerProcess, model: str) -> None:
    text = httpx.get(server.metrics_url, timeout=10).text
    for reason in REASONS:
        pattern = (
            rf'nv_inference_request_failure\{{model="{model}",reason="{reason}",version="1"\}} '
            r"(\d+)"
        )
        found = re.search(pattern, text)
        assert found is not None, f"no {reason} failure counter for {model}:\n{text}"
        assert int(found.group(1)) == 0
