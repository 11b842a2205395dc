"""vLLM's `--ssl-certfile` and `--ssl-keyfile`: the HTTP port speaks HTTPS, served by the
server or by its HTTP workers; the metrics port stays plain, as Triton's. A throwaway CA
(tests/certs.py) signs the server's certificate for 127.0.0.1."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest
from certs import make_tls_files
from polling import poll
from serverproc import start_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BODY = {
    "inputs": [
        {"name": name, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
        for name in ("INPUT0", "INPUT1")
    ]
}


@pytest.mark.parametrize("workers", [0, 1], ids=["server", "http-workers"])
def test_the_http_port_speaks_https(tmp_path: Path, workers: int) -> None:
    files = make_tls_files(tmp_path)
    extra = ["--ssl-certfile", str(files.cert), "--ssl-keyfile", str(files.key)]
    extra += ["--http-workers", str(workers)]
    server = start_server(extra=extra, wait_ready=False)
    try:
        url = f"https://127.0.0.1:{server.http_port}"
        trusted = ssl.create_default_context(cafile=str(files.ca))
        with httpx.Client(base_url=url, verify=trusted) as https:

            def ready() -> bool:
                assert server.alive(), server.log()
                try:
                    return https.get("/v2/health/ready").status_code == 200
                except httpx.HTTPError:
                    return False

            poll(ready, 60, "ready over HTTPS", interval=0.05)
            infer = https.post("/v2/models/simple/infer", json=BODY)
            assert infer.status_code == 200, infer.text
            assert infer.json()["outputs"][0]["data"] == [2 * x for x in range(16)]
            assert https.get("/v1/models").json()["object"] == "list"
        # Plain HTTP is no longer spoken there; the metrics port still speaks it.
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{server.http_port}/v2/health/ready", timeout=5)
        assert httpx.get(server.metrics_url, timeout=5).status_code == 200
    finally:
        server.stop()
