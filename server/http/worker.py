"""An HTTP front-end worker process (see server/workers/).

It accepts connections on the listening socket the server bound and handed it (shared
by every HTTP worker: the kernel gives each connection to one of them), runs the
inference endpoint itself (InferEndpoint: the same body limits, decoding, errors and
encoding as the server's own) with each request run in the server process over its link,
and passes every other request on whole to the server's own HTTP front end on a Unix socket
(passon.py), which answers it (health, metadata, statistics, repository, shared
memory, logging, /metrics, /v1, generate). With
`--http-restricted-api`, whose checks must see every request, inference is passed on too.
It puts vLLM's CORS and request-id marks on every answer itself (marks.py), and serves
inference behind --root-path's prefix as the server does (rootpath.py).

    python -m ge_serve.server.http.worker '{"listen_fd": ..., "link_fd": ..., ...}'
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
from typing import Any

import uvicorn
import uvloop
from starlette.types import ASGIApp

from ge_serve.link.child import leave_stop_signals_to_parent
from ge_serve.server.control import uvicornlogs
from ge_serve.server.control.logformat import worker_logging
from ge_serve.server.control.logsettings import LogControl, LogSettings
from ge_serve.server.control.tls import HttpTls
from ge_serve.server.control.uvicornlogs import UvicornLogs
from ge_serve.server.inference.header_forward import HeaderForward
from ge_serve.server.startup.gcheap import settle_heap
from ge_serve.server.workers.remote import RemoteCore

from .embedded import EmbeddedUvicorn, front_end_config
from .infer import InferEndpoint, InferShortcut
from .marks import Marks
from .passon import PassOn
from .rootpath import with_root_path

log = logging.getLogger("ge_serve.http.worker")


async def serve(config: dict[str, Any]) -> int:
    index = int(config["index"])
    server: uvicorn.Server | None = None

    def stop() -> None:
        if server is not None:
            server.should_exit = True

    core = RemoteCore(socket.socket(fileno=int(config["link_fd"])), f"http-{index}", stop)
    passon = PassOn(
        str(config["forward_path"]),
        int(config["max_input_size"]),
        int(config["max_chunks"]),
    )
    app: ASGIApp = passon
    if not config["restricted"]:
        # Whether tracing is on is the server's to know: the context always goes along.
        endpoint = InferEndpoint(
            core.infer,
            int(config["max_input_size"]),
            int(config["max_chunks"]),
            lambda: True,
            HeaderForward.of(str(config["header_forward_pattern"])),
        )
        app = InferShortcut(app, endpoint.routes())
    app = with_root_path(Marks.from_json(config["marks"]).apply(app), str(config["root_path"]))
    listener = socket.socket(fileno=int(config["listen_fd"]))
    # Stopped by the server (`Stop`, or its link's end), never by a signal: uvicorn's own
    # Server would take SIGINT and SIGTERM.
    tls = HttpTls.from_json(config["tls"]).uvicorn_options()  # vLLM's --ssl-* flags
    server = EmbeddedUvicorn(front_end_config(app, float(config["grace_s"]), **tls))
    task = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        if task.done():
            core.ready(f"the HTTP worker did not start: {task.exception()!r}")
            await asyncio.sleep(0.1)  # the message leaves before the process does
            return 1
        await asyncio.sleep(0.01)
    # Its standing heap never changes: no model loads here (startup/gcheap.py).
    settle_heap()
    core.ready()
    await task
    await passon.close()
    core.link.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    leave_stop_signals_to_parent()
    config: dict[str, Any] = json.loads(args[0])
    worker_logging(config)
    uvicornlogs.install(UvicornLogs.from_json(config["uvicorn_logs"]))
    # uvicorn's lines (an access log, say) as the server writes its own: its log file,
    # its switches.
    control = LogControl(LogSettings.model_validate(config["log"]))
    control.attach(logging.getLogger("uvicorn"))
    code: int = uvloop.run(serve(config))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
