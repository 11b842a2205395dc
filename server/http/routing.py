"""What a route module (monitoring, sharedmemory, ...) needs of the HTTP front end to add
its routes: the core, guarded routes and the size-capped body.

Route modules take this protocol rather than `HttpFrontEnd` itself, so app.py imports
them and they never import app.py back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ge_serve.server.inference.core import InferenceServer

from .openapi import Body

Endpoint = Callable[[Request], Awaitable[Response]]


class RouteHost(Protocol):
    core: InferenceServer

    def route(
        self, path: str, endpoint: Endpoint, methods: list[str], body: Body | None = None
    ) -> Route:
        """A route whose errors become `{"error": ...}` bodies; `body` describes its POST
        body in the OpenAPI document."""
        ...

    def versioned(
        self, suffix: str, endpoint: Endpoint, methods: list[str], body: Body | None = None
    ) -> list[Route]:
        """A model route with and without `/versions/{version}`."""
        ...

    async def read_body(self, request: Request) -> bytes:
        """The request body, size-capped before and after decompression."""
        ...
