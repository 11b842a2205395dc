"""vLLM's cross-origin settings (`--allowed-origins` and its companions) and the
middleware that applies them.

vLLM installs Starlette's CORSMiddleware on its whole application, with no origin allowed
by default: a browser page on another origin is refused. Here the middleware is installed
only where an origin is allowed, so a server without the flag answers exactly as before (a
preflight there is a 405, not Starlette's 400). Where it is installed it wraps the whole
HTTP application, Triton's v2 inference shortcut and `--api-key`'s check included: a
browser's page can call every route, and reads a 401 or a 503 instead of an opaque CORS
failure (vLLM's key check sits outside its CORS middleware, so its 401s carry no CORS
headers).
"""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from ge_serve.server.control.cors import CorsSettings


def with_cors(app: ASGIApp, settings: CorsSettings) -> ASGIApp:
    """`app` answering cross-origin requests as `settings` allow; `app` itself where none
    is allowed."""
    if not settings.on:
        return app
    return CORSMiddleware(
        app,
        allow_origins=settings.allowed_origins,
        allow_methods=settings.allowed_methods,
        allow_headers=settings.allowed_headers,
        allow_credentials=settings.allow_credentials,
    )
