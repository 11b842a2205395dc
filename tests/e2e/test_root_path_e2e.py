"""`--root-path` with `--http-workers`: the workers serve v2 inference with and without
the prefix themselves, and pass everything else on to the server's front end, which
routes and guards it as the route it reaches (`--api-key`), as without workers."""

from __future__ import annotations

import httpx
import pytest
from serverproc import running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ROOT = "/proxy"
BODY = {
    "inputs": [
        {"name": name, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
        for name in ("INPUT0", "INPUT1")
    ]
}


def test_http_workers_serve_behind_the_root_path() -> None:
    extra = ["--http-workers", "1", "--root-path", ROOT, "--api-key", "k3y"]
    with running_server(extra=extra) as server, httpx.Client(base_url=server.base_url) as http:
        for prefix in (ROOT, ""):
            infer = http.post(f"{prefix}/v2/models/simple/infer", json=BODY)
            assert infer.status_code == 200, infer.text
            assert infer.json()["outputs"][0]["data"] == [2 * x for x in range(16)]
            assert http.get(f"{prefix}/v2/models/simple").json()["name"] == "simple"
            refused = http.get(f"{prefix}/v1/models")
            assert refused.status_code == 401
            assert refused.json()["error"]["type"] == "authentication_error"
            listed = http.get(f"{prefix}/v1/models", headers={"authorization": "Bearer k3y"})
            assert listed.status_code == 200 and listed.json()["object"] == "list"
        assert http.get(f"{ROOT}/openapi.json").json()["servers"] == [{"url": ROOT}]
