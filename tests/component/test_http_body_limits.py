"""Triton's limits on a request body's shape, in Triton's words: the number of chunks a
chunked body may come in, and the size of a `file:` load parameter."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from ge_serve.server.errors import ServerError
from ge_serve.server.http import bodies
from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference import error_texts
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.models.lifecycle import ModelLifecycle


async def chunks(count: int) -> AsyncIterator[bytes]:
    for _ in range(count):
        yield b" "


async def test_a_body_in_too_many_chunks_is_refused(lifecycle: ModelLifecycle) -> None:
    settings = HttpSettings(max_input_size=1 << 20, restricted_api=(), max_chunks=8)
    app = HttpFrontEnd(InferenceServer(lifecycle), settings).build()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ge-serve") as client:
        response = await client.post("/v2/repository/index", content=chunks(9))
        assert response.status_code == 400
        assert response.json()["error"] == (
            "Chunked request body exceeds maximum of 8 non-empty chunks. Send fewer or "
            "larger HTTP chunks."
        )
        assert response.headers["connection"] == "close"
        response = await client.post("/v2/repository/index", content=chunks(8))
        assert response.status_code == 200, response.text


def test_the_chunk_limit_is_tritons() -> None:
    assert error_texts.too_many_chunks() == (
        "Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or larger "
        "HTTP chunks."
    )
    assert HttpSettings(max_input_size=1, restricted_api=()).max_chunks == 65536


def test_an_oversized_file_parameter_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(bodies, "FILE_TEXT_LIMIT", 8)
    text = base64.b64encode(b"0123456789").decode()
    body = b'{"parameters": {"config": "{}", "file:1/model.onnx": "%s"}}' % text.encode()
    with pytest.raises(ServerError) as info:
        bodies.decode_body(bodies.RepositoryLoadRequest, body, "load request")
    assert info.value.message == (
        "'file:1/model.onnx' exceeds the maximum allowed data size limit INT_MAX"
    )
    assert bodies.FILE_TEXT_LIMIT == 8 and error_texts.INT_MAX == 2**31 - 1
