"""--http-max-input-size bounds the JSON of an infer request, as in Triton
(src/http_server.cc): a JSON body, a raw-binary body, and the JSON header of a body with
binary tensor data. The tensor data after that header is not bounded by it, so a tensor
larger than the limit is served (qa L0_backend_python test_growth_error sends 1 GiB over
the 64 MiB default; qa L0_large_payload 1.9 GiB); such a body is bounded only at Triton's
own bound, the int32 Content-Length it can read.

Served by the server itself, by an HTTP worker's own infer endpoint, and by an HTTP
worker that passes the request on (under --http-restricted-api, the worker serves infer
through its pass-on)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from modelgen import identity_model, write_model
from onnx import TensorProto
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

LIMIT = 1 << 16
CONFIG = """name: "flat"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
# The restricted deployment's infer routes need this header.
KEY = {"infer-key": "open"}


@pytest.fixture(scope="module", params=["server", "worker", "restricted-worker"])
def srv(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    repo: Path = tmp_path_factory.mktemp("binary")
    write_model(repo, "flat", identity_model(TensorProto.FLOAT, dims=(None,)), CONFIG)
    flags = [f"--http-max-input-size={LIMIT}"]
    headers: dict[str, str] = {}
    if request.param != "server":
        flags.append("--http-workers=1")
    if request.param == "restricted-worker":
        flags.append("--http-restricted-api=inference:infer-key=open")
        headers = KEY
    with running_server([repo], flags) as proc:
        yield proc, headers


def binary_request(values: np.ndarray, pad: int = 0) -> tuple[bytes, bytes]:
    """(JSON header, body) of a binary request for `flat`; `pad` spaces end the header."""
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT",
                    "datatype": "FP32",
                    "shape": [values.size],
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT", "parameters": {"binary_data": True}}],
        }
    )
    header += b" " * pad
    return header, header + values.tobytes()


def pieces(body: bytes, size: int = 1 << 14) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_binary_tensor_data_past_the_limit_is_served(
    srv: tuple[ServerProcess, dict[str, str]], framing: str
) -> None:
    server, key = srv
    values = np.arange(4 * LIMIT // 4, dtype=np.float32)  # 4x the limit, in bytes
    header, body = binary_request(values)
    headers = {"Inference-Header-Content-Length": str(len(header)), **key}
    content = body if framing == "content-length" else pieces(body)
    response = httpx.post(
        f"{server.base_url}/v2/models/flat/infer", content=content, headers=headers, timeout=60
    )
    assert response.status_code == 200, response.text[:300]
    length = int(response.headers["inference-header-content-length"])
    np.testing.assert_array_equal(np.frombuffer(response.content[length:], np.float32), values)


def test_a_json_header_past_the_limit_gets_tritons_message(
    srv: tuple[ServerProcess, dict[str, str]],
) -> None:
    server, key = srv
    header, body = binary_request(np.zeros(4, np.float32), pad=LIMIT)
    response = httpx.post(
        f"{server.base_url}/v2/models/flat/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(len(header)), **key},
        timeout=60,
    )
    assert response.status_code == 400
    assert response.json()["error"] == (
        f"request JSON size of {len(header)} bytes exceeds the maximum allowed input size of "
        f"{LIMIT} bytes. Use --http-max-input-size to increase the limit."
    )
    assert response.headers["connection"] == "close"


def test_a_binary_body_past_tritons_own_bound_is_refused_at_once(
    srv: tuple[ServerProcess, dict[str, str]],
) -> None:
    """Triton reads Content-Length as an int: past that, its words, before a byte of the
    body is read."""
    server, key = srv
    declared = 3 << 30
    extra = "".join(f"{name}: {value}\r\n" for name, value in key.items())
    head = (
        "POST /v2/models/flat/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Inference-Header-Content-Length: 100\r\n{extra}Content-Length: {declared}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    status, _, payload = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert orjson.loads(payload)["error"] == (
        "Unable to parse Content-Length, value is out of range [ -2147483648, 2147483647 ], "
        f"got: {declared}"
    )
