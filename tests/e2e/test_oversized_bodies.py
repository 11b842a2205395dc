"""A body over --http-max-input-size (64 MiB by default) gets its 400, whatever its size,
also for a client that writes its whole body before it reads its answer, as Python's
`http.client` (and so `requests`) does: the server answers first, then reads and drops the
rest before it closes (the lingering close, server/http/lingering.py), so the client reads
the 400 rather than a connection reset."""

from __future__ import annotations

import http.client
from collections.abc import Iterator

import httpx
import orjson
import pytest
from serverproc import ServerProcess, running_server

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with running_server() as proc:
        yield proc


@pytest.mark.parametrize("route", ["infer", "generate"])
@pytest.mark.parametrize("size_mib", [65, 80, 200])
def test_http_client_writes_an_oversized_body_whole_then_reads_the_400(
    server: ServerProcess, route: str, size_mib: int
) -> None:
    body = b" " * (size_mib * MIB)
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        connection.request(
            "POST",
            f"/v2/models/simple/{route}",
            body=body,
            headers={"Content-Type": "application/json"},
        )
        response = connection.getresponse()
        payload = response.read()
    finally:
        connection.close()
    assert response.status == 400, payload[:300]
    assert response.getheader("connection", "").lower() == "close"
    message = orjson.loads(payload)["error"]
    assert f"{size_mib * MIB}" in message
    assert "exceeds the maximum" in message
    # Nothing else was affected.
    assert httpx.get(f"{server.base_url}/v2/health/ready", timeout=10).status_code == 200
