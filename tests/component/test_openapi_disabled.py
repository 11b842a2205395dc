"""vLLM's `--disable-fastapi-docs`: `/openapi.json` answers 404 (with `--root-path`'s
prefix too), as vLLM's FastAPI application without its document; the API is unchanged.
`/docs` and `/redoc` are never served here."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from modelgen import make_lifecycle

from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference.core import InferenceServer

pytestmark = pytest.mark.asyncio


@pytest.mark.parametrize("served", [True, False], ids=["served", "disabled"])
async def test_the_document_is_served_unless_disabled(tmp_path: Path, served: bool) -> None:
    lifecycle = make_lifecycle(tmp_path)
    try:
        settings = HttpSettings(1 << 20, (), root_path="/proxy", openapi=served)
        transport = httpx.ASGITransport(
            app=HttpFrontEnd(InferenceServer(lifecycle), settings).build()
        )
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            for path in ("/openapi.json", "/proxy/openapi.json"):
                answer = await http.get(path)
                if served:
                    assert answer.status_code == 200 and answer.json()["paths"]
                else:
                    assert answer.status_code == 404
                    assert answer.json() == {"error": f"Not Found: no route for GET {path}"}
            for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
                assert (await http.get(path)).status_code == 404
            assert (await http.get("/v2/health/live")).status_code == 200
    finally:
        await lifecycle.close()
