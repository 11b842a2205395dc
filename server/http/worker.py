"""An HTTP front-end worker process (see server/workers/).

It accepts connections on the listening socket the server bound and handed it (shared
by every HTTP worker: the kernel gives each connection to one of them), runs the
inference endpoint itself (InferEndpoint: the same body limits, decoding, errors and
encoding as the server's own) with each request run in the server process over its link,
and passes every other request on whole to the server, whose own application answers it
(health, metadata, statistics, repository, shared memory, logging, /metrics). With
`--http-restricted-api`, whose checks must see every request, inference is passed on too.

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
from starlette.types import ASGIApp, Receive, Scope, Send

from ge_serve.server.errors import ServerError
from ge_serve.server.workers.messages import Part, Start
from ge_serve.server.workers.remote import RemoteCore

from .errors import server_error_response
from .infer import InferEndpoint, InferShortcut
from .protocol import TritonHttpProtocol

log = logging.getLogger("ge_serve.http.worker")

# What of an ASGI scope the server's application reads.
_SCOPE_KEYS = (
    "type", "http_version", "method", "scheme", "path", "raw_path", "query_string",
    "root_path", "server", "client",
)  # fmt: skip


class PassOn:
    """ASGI: the request, body and all, answered by the server's own application."""

    def __init__(self, core: RemoteCore) -> None:
        self.core = core

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        wire = {key: scope[key] for key in _SCOPE_KEYS if key in scope}
        headers = [(bytes(k), bytes(v)) for k, v in scope["headers"]]
        parts: list[Start | Part] = []
        arrived = asyncio.Event()

        def on_part(message: Start | Part) -> None:
            parts.append(message)
            arrived.set()

        call = asyncio.ensure_future(self.core.forward(wire, headers, b"".join(chunks), on_part))
        # The body is all read: what receive() gives now is the client going away.
        gone = asyncio.ensure_future(receive())
        started = False
        try:
            while True:
                waiter = asyncio.ensure_future(arrived.wait())
                await asyncio.wait([call, gone, waiter], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                arrived.clear()
                pending, parts[:] = parts[:], []
                for part in pending:
                    if isinstance(part, Start):
                        started = True
                        start = {"type": "http.response.start", "status": part.status,
                                 "headers": part.headers}  # fmt: skip
                        await send(start)
                    else:
                        await send({"type": "http.response.body", "body": part.chunk,
                                    "more_body": True})  # fmt: skip
                if call.done():
                    break
                if gone.done():
                    if gone.result().get("type") == "http.disconnect":
                        break
                    gone = asyncio.ensure_future(receive())
        finally:
            gone.cancel()
            if not call.done():
                call.cancel()  # the server cancels it too
        if not call.done():
            return
        try:
            status, headers, body = call.result()
        except ServerError as exc:
            if started:  # the stream has begun: it can only end
                await send({"type": "http.response.body", "body": b""})
            else:
                await server_error_response(exc)(scope, receive, send)
            return
        if not started:
            await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def serve(config: dict[str, Any]) -> int:
    index = int(config["index"])
    server: uvicorn.Server | None = None

    def link_closed() -> None:
        if server is not None:
            server.should_exit = True

    core = RemoteCore(socket.socket(fileno=int(config["link_fd"])), f"http-{index}", link_closed)
    app: ASGIApp = PassOn(core)
    if not config["restricted"]:
        # Whether tracing is on is the server's to know: the context always goes along.
        endpoint = InferEndpoint(
            core.infer, int(config["max_input_size"]), int(config["max_chunks"]), lambda: True
        )
        app = InferShortcut(app, endpoint.routes())
    listener = socket.socket(fileno=int(config["listen_fd"]))
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            loop="none",
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=float(config["grace_s"]),  # type: ignore[arg-type]
            http=TritonHttpProtocol,
            ws="none",
            proxy_headers=False,
        )
    )
    task = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        if task.done():
            core.ready(f"the HTTP worker did not start: {task.exception()!r}")
            await asyncio.sleep(0.1)  # the message leaves before the process does
            return 1
        await asyncio.sleep(0.01)
    core.ready()
    await task
    core.link.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    config: dict[str, Any] = json.loads(args[0])
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    code: int = uvloop.run(serve(config))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
