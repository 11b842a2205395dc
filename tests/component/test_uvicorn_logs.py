"""vLLM's uvicorn log flags on ge-serve's uvicorn (control/uvicornlogs.py): from
`--uvicorn-log-level info` on, one access line per answer, in the server's log, without
the paths of `--disable-access-log-for-endpoints`; none with
`--disable-uvicorn-access-log`, at ge-serve's default level (warning), or in a server
process whose HTTP workers write them. A real uvicorn on loopback, as the server runs it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from ge_serve.server.control.uvicornlogs import UvicornLogs, install
from ge_serve.server.http.embedded import EmbeddedUvicorn, front_end_config
from ge_serve.server.startup.listen import listen_socket

pytestmark = [pytest.mark.timeout(30), pytest.mark.asyncio]

NAMES = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


@pytest.fixture(autouse=True)
def uvicorn_loggers() -> Iterator[None]:
    """uvicorn's loggers as they were: install() sets them for the whole process."""
    loggers = [logging.getLogger(name) for name in NAMES]
    kept = [(lg.level, lg.propagate, list(lg.handlers), list(lg.filters)) for lg in loggers]
    yield
    for logger, (level, propagate, handlers, filters) in zip(loggers, kept, strict=True):
        logger.setLevel(level)
        logger.propagate, logger.handlers, logger.filters = propagate, handlers, filters


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def access_lines(caplog: pytest.LogCaptureFixture, *paths: str) -> list[str]:
    """The access lines of GETs of `paths` on a uvicorn as ge-serve runs it."""
    caplog.set_level(logging.DEBUG)
    sock = listen_socket("127.0.0.1", 0, "HTTP")
    server = EmbeddedUvicorn(front_end_config(app, grace_s=0.5))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not task.done()
            await asyncio.sleep(0.005)
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with httpx.AsyncClient(base_url=base) as client:
            for path in paths:
                assert (await client.get(path)).status_code == 200
    finally:
        server.should_exit = True
        await task
    return [r.getMessage() for r in caplog.records if r.name == "uvicorn.access"]


async def test_the_access_log_from_info_on_without_the_excluded_paths(
    caplog: pytest.LogCaptureFixture,
) -> None:
    install(UvicornLogs("info", excluded=("/health", "/metrics")))
    found = await access_lines(caplog, "/v1/models?x=1", "/health", "/health?probe=1", "/metrics")
    assert len(found) == 1
    assert found[0].endswith(' - "GET /v1/models?x=1 HTTP/1.1" 200')
    assert found[0].startswith("127.0.0.1:")


@pytest.mark.parametrize(
    ("logs", "access"),
    [
        (UvicornLogs(), True),
        (UvicornLogs("info", access_log=False), True),
        (UvicornLogs("error"), True),
        (UvicornLogs("debug"), False),
    ],
    ids=["default-warning", "disabled", "error", "workers-write-them"],
)
async def test_no_access_log(
    caplog: pytest.LogCaptureFixture, logs: UvicornLogs, access: bool
) -> None:
    install(logs, access=access)
    assert await access_lines(caplog, "/v1/models") == []
    assert logging.getLogger("uvicorn.error").level == logging.getLevelName(logs.level.upper())
