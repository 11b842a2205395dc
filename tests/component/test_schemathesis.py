"""Schemathesis against the OpenAPI document: no request gets a 5xx answer.

The server is the real HTTP application (uvicorn, the infer shortcut, every route) over a
temporary repository holding one small model, in explicit model-control mode so that load
and unload really load and unload it, and with shared memory rooted in a temporary folder,
so fuzzed keys never reach /dev/shm. It runs on a thread of this process (threadserver.py).

Schemathesis sends requests that fit the document and requests that do not, spread over
the operations; the number of examples follows the hypothesis profile (conftest.py).
Schemathesis is used as a library, through hypothesis: its pytest plugin is off
(pyproject.toml), since it would load, with assertion rewriting, into every test run.

The one change made to the served document is that path parameters are narrowed to names
that exist (the model, its version, a region), so fitting requests reach the code past the
lookup; requests that do not fit still try everything else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from modelgen import identity_model, make_lifecycle, write_model
from onnx import TensorProto
from schemathesis import BaseSchema, GenerationMode
from threadserver import serving

from ge_serve.server.control.model_control import ControlMode, ControlSettings, ModelControl
from ge_serve.server.control.sharedmemory import SharedMemoryManager
from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference.core import InferenceServer

MODEL = "identity"
REGION = "region"
# What a fitting request may name in each path parameter.
PATH_VALUES = {
    "model": [MODEL, "missing"],
    "version": ["1", "2"],
    "region": [REGION, "other"],
    "repository": ["any"],
    "response_id": ["resp_1"],
}


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    repo = tmp_path_factory.mktemp("repository")
    write_model(repo, MODEL, identity_model(TensorProto.INT32, dims=("batch", 4)))
    shm_root = tmp_path_factory.mktemp("shm")
    (shm_root / "object").write_bytes(bytes(4096))

    @asynccontextmanager
    async def application() -> AsyncIterator[Any]:
        lifecycle = make_lifecycle(repo)
        control = ModelControl(
            lifecycle, lifecycle.repository, ControlSettings(ControlMode.EXPLICIT, (MODEL,), 1.0)
        )
        shared_memory = SharedMemoryManager(root=shm_root)
        try:
            assert await control.start() == {}
            core = InferenceServer(lifecycle, control=control, shared_memory=shared_memory)
            front = HttpFrontEnd(core, HttpSettings(max_input_size=1 << 20, restricted_api=()))
            yield front.build()
        finally:
            await control.stop()
            await lifecycle.close()
            shared_memory.close()

    with serving(application) as url:
        yield url


@pytest.fixture(scope="module")
def api(base_url: str) -> BaseSchema:
    document = httpx.get(base_url + "/openapi.json", timeout=10).json()
    for item in document["paths"].values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path":
                    parameter["schema"] = {"enum": PATH_VALUES[parameter["name"]]}
    schema = schemathesis.openapi.from_dict(document)
    schema.config.update(base_url=base_url, request_timeout=30)
    return schema


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=30) as client:
        yield client


def restore_the_model(http: httpx.Client) -> None:
    """Load the model again if a case unloaded it (or failed to load it), so that every case
    meets the same server: a model left unloaded would answer later cases with a deliberate
    503 "not at ready state", which says nothing about those cases."""
    if http.get(f"/v2/models/{MODEL}/ready").status_code != 200:
        loaded = http.post(f"/v2/repository/models/{MODEL}/load")
        assert loaded.status_code == 200, loaded.text


# Triton's OpenAI front end's model control routes (under /v1 and KServe's /openai/v1)
# unload the model too.
UNLOADING = ("/models/{model}/load", "/models/{model}/unload")

# The operations that take a body get most of the examples; a GET differs only in its path.
GROUPS: dict[str, tuple[Callable[[BaseSchema], BaseSchema], int]] = {
    "with a body": (lambda schema: schema.include(method="POST"), 3),
    "the rest": (lambda schema: schema.exclude(method="POST"), 2),
}


@pytest.mark.parametrize("group", GROUPS)
def test_no_request_gets_a_server_error(api: BaseSchema, http: httpx.Client, group: str) -> None:
    select, share = GROUPS[group]
    operations = select(api)
    cases = st.one_of(
        operations.as_strategy(GenerationMode.POSITIVE),
        operations.as_strategy(GenerationMode.NEGATIVE),
    )

    @settings(
        max_examples=share * settings().max_examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def check(case: schemathesis.Case[Any]) -> None:  # as_strategy yields a bare Case
        response = case.call()
        if case.path.startswith("/v2/repository/models/") or case.path.endswith(UNLOADING):
            restore_the_model(http)
        if case.path.startswith("/v2/repository/{repository}/models/"):
            # Triton's answer to a named repository: 501, the one status of 5xx that says
            # the request asked for what the server does not do.
            assert response.status_code in (400, 501), response.text
            return
        if case.path == "/v2/logging" and isinstance(case.body, dict) and "log_file" in case.body:
            # Triton's UNSUPPORTED (501) for a new log file; null is a 400.
            assert response.status_code in (400, 501), response.text
            return
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} answered {response.status_code}: "
            f"{response.text[:300]}\n{case.as_curl_command()}"
        )

    check()
