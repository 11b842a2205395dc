"""vLLM's `--allowed-origins` and its companions (server/http/cors.py): a browser page on
an allowed origin may call every route, Triton's v2 inference shortcut included, and reads
the server's own refusals; without the flag nothing changes. vLLM's
`--enable-request-id-headers` (server/http/requestid.py): every answer names its request.
In process: an onnxruntime identity model behind the HTTP application, over httpx's ASGI
transport."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from modelgen import identity_model, make_lifecycle, write_model
from onnx import TensorProto

from ge_serve.server.control.cors import CorsSettings
from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference.core import InferenceServer

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="module")]

PAGE = "https://app.example"
INFER = "/v2/models/ident/infer"
BODY = {"inputs": [{"name": "INPUT", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
ALLOWED = CorsSettings(allowed_origins=(PAGE,))


def preflight(method: str = "POST", origin: str = PAGE) -> dict[str, str]:
    return {
        "origin": origin,
        "access-control-request-method": method,
        "access-control-request-headers": "content-type,authorization",
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def core(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[InferenceServer]:
    repo: Path = tmp_path_factory.mktemp("cors")
    write_model(repo, "ident", identity_model(TensorProto.FLOAT, ("batch", 4)))
    lifecycle = make_lifecycle(repo)
    try:
        assert await lifecycle.load_many(["ident"]) == {}
        yield InferenceServer(lifecycle)
    finally:
        await lifecycle.close()


def client(core: InferenceServer, **settings: Any) -> httpx.AsyncClient:
    base = HttpSettings(max_input_size=1 << 20, restricted_api=())
    front = HttpFrontEnd(core, dataclasses.replace(base, **settings))
    transport = httpx.ASGITransport(app=front.build())
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def test_without_an_allowed_origin_nothing_changes(core: InferenceServer) -> None:
    async with client(core) as http:
        answer = await http.options("/v1/chat/completions", headers=preflight())
        assert answer.status_code == 405
        answer = await http.post(INFER, json=BODY, headers={"origin": PAGE})
        assert answer.status_code == 200
        assert "access-control-allow-origin" not in answer.headers


@pytest.mark.parametrize("path", [INFER, "/v1/chat/completions", "/v2/repository/index"])
async def test_an_allowed_origin_passes_the_preflight(core: InferenceServer, path: str) -> None:
    async with client(core, cors=ALLOWED) as http:
        answer = await http.options(path, headers=preflight())
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == PAGE
    assert "POST" in answer.headers["access-control-allow-methods"]
    assert answer.headers["access-control-allow-headers"] == "content-type,authorization"
    assert "access-control-allow-credentials" not in answer.headers


async def test_another_origin_is_refused_its_preflight(core: InferenceServer) -> None:
    async with client(core, cors=ALLOWED) as http:
        answer = await http.options(INFER, headers=preflight(origin="https://evil.example"))
        assert answer.status_code == 400
        assert "access-control-allow-origin" not in answer.headers
        # Its request itself is answered, without the header its browser needs to read it.
        answer = await http.post(INFER, json=BODY, headers={"origin": "https://evil.example"})
        assert answer.status_code == 200
        assert "access-control-allow-origin" not in answer.headers


async def test_answers_and_refusals_carry_the_origin(core: InferenceServer) -> None:
    async with client(core, cors=ALLOWED, api_keys=("k",)) as http:
        # Triton's inference shortcut, a FastAPI route, and --api-key's 401.
        answer = await http.post(INFER, json=BODY, headers={"origin": PAGE})
        assert answer.status_code == 200
        assert answer.json()["outputs"][0]["data"] == [1, 2, 3, 4]
        assert answer.headers["access-control-allow-origin"] == PAGE
        answer = await http.get("/v2/models/ident", headers={"origin": PAGE})
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == PAGE
        answer = await http.get("/v1/models", headers={"origin": PAGE})
        assert answer.status_code == 401
        assert answer.headers["access-control-allow-origin"] == PAGE
        assert answer.json()["error"]["type"] == "authentication_error"


async def test_methods_headers_and_credentials_as_given(core: InferenceServer) -> None:
    cors = CorsSettings(("*",), ("GET",), ("x-custom",), allow_credentials=True)
    async with client(core, cors=cors) as http:
        answer = await http.options(INFER, headers=preflight())
        assert answer.status_code == 400  # POST and these headers are not allowed
        answer = await http.options(
            "/v2/models/ident",
            headers={
                "origin": PAGE,
                "access-control-request-method": "GET",
                "access-control-request-headers": "x-custom",
            },
        )
        assert answer.status_code == 200
        # Any origin with credentials: the page's own origin is named, never "*".
        assert answer.headers["access-control-allow-origin"] == PAGE
        assert answer.headers["access-control-allow-credentials"] == "true"
        answer = await http.get("/v2/models/ident", headers={"origin": PAGE})
        assert answer.headers["access-control-allow-origin"] == PAGE


async def test_request_id_headers_on_every_answer(core: InferenceServer) -> None:
    async with client(core) as http:
        answer = await http.post(INFER, json=BODY, headers={"x-request-id": "trace-1"})
        assert "x-request-id" not in answer.headers  # off by default
    async with client(core, request_id_headers=True, cors=ALLOWED, api_keys=("k",)) as http:
        answer = await http.post(INFER, json=BODY, headers={"x-request-id": "trace-1"})
        assert answer.status_code == 200
        assert answer.headers.get_list("x-request-id") == ["trace-1"]
        fresh = [(await http.get("/v2/models/ident")).headers["x-request-id"] for _ in "ab"]
        assert fresh[0] != fresh[1] and all(len(x) == 32 and int(x, 16) >= 0 for x in fresh)
        # Refusals and CORS's own answers too.
        answer = await http.get("/v1/models", headers={"x-request-id": "trace-2"})
        assert (answer.status_code, answer.headers["x-request-id"]) == (401, "trace-2")
        answer = await http.get("/v2/models/absent", headers={"x-request-id": "trace-3"})
        assert (answer.status_code, answer.headers["x-request-id"]) == (404, "trace-3")
        answer = await http.options(INFER, headers={**preflight(), "x-request-id": "trace-4"})
        assert (answer.status_code, answer.headers["x-request-id"]) == (200, "trace-4")
