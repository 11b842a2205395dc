"""`--allowed-origins` and `--enable-request-id-headers` with `--http-workers`: the worker
that accepts a connection marks every answer once, whether it answers the request itself
(v2 inference) or passes it on to the server's front end (everything else), so a browser
page reads answers through workers as without them, and each names its request once."""

from __future__ import annotations

import httpx
import pytest
from serverproc import running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PAGE = "https://app.example"
BODY = {
    "inputs": [
        {"name": name, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
        for name in ("INPUT0", "INPUT1")
    ]
}


def test_http_workers_answer_an_allowed_origin_with_request_ids() -> None:
    extra = ["--http-workers", "2", "--allowed-origins", f'["{PAGE}"]']
    extra.append("--enable-request-id-headers")
    with running_server(extra=extra) as server, httpx.Client(base_url=server.base_url) as http:
        infer = "/v2/models/simple/infer"
        asked = {"origin": PAGE, "access-control-request-method": "POST"}
        answer = http.options(infer, headers=asked)
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == PAGE
        for index in range(4):  # connections land on either worker
            sent = {"origin": PAGE, "x-request-id": f"trace-{index}"}
            with httpx.Client(base_url=server.base_url) as fresh:
                answer = fresh.post(infer, json=BODY, headers=sent)
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"][0]["data"] == [2 * x for x in range(16)]
            assert answer.headers["access-control-allow-origin"] == PAGE
            assert answer.headers["x-request-id"] == f"trace-{index}"
        # Passed on to the server's front end, which leaves the marks to the worker: once.
        sent = {"origin": PAGE, "x-request-id": "meta-1"}
        answer = http.get("/v2/models/simple", headers=sent)
        assert answer.status_code == 200
        assert answer.headers.get_list("x-request-id") == ["meta-1"]
        assert answer.headers.get_list("access-control-allow-origin") == [PAGE]
        assert answer.headers["vary"] == "Origin"
        (made,) = http.get("/v2/health/ready").headers.get_list("x-request-id")
        assert len(made) == 32 and int(made, 16) >= 0
