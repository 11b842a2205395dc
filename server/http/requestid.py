"""vLLM's `--enable-request-id-headers`: every HTTP answer carries `X-Request-Id`, the
request's own where it sent one (a gateway's trace id), else a fresh uuid4 in hex, as
vLLM's XRequestIdMiddleware. Installed only with the flag, around the whole application
(Triton's v2 routes included, as vLLM's covers every route), so that refusals (a 401, a
503 while stopping, CORS's own answers) carry it too."""

from __future__ import annotations

import uuid
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_HEADER: Final = b"x-request-id"


class RequestIdHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope["headers"] if name == _HEADER), None)
        request_id = given if given is not None else uuid.uuid4().hex.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                headers.append((b"X-Request-Id", request_id))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)
