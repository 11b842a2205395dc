"""`--root-path` with `--http-workers`: the workers serve v2 inference with and without
the prefix themselves, and pass everything else on to the server's front end, which
routes and guards it as the route it reaches (`--api-key`), as without workers. Also the
workers' uvicorn access lines (`--uvicorn-log-level info`), which go where the server's
log goes (`--log-file`)."""

from __future__ import annotations

from pathlib import Path

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


def test_http_workers_serve_behind_the_root_path(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    extra = ["--http-workers", "1", "--root-path", ROOT, "--api-key", "k3y"]
    extra += ["--uvicorn-log-level", "info", "--log-file", str(log_file)]
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
    # A worker's access lines, in the server's log file and format.
    access = [
        line for line in log_file.read_text().splitlines() if "/v2/models/simple/infer" in line
    ]
    assert len(access) == 2 and all(line.startswith("I") and " 200" in line for line in access)
