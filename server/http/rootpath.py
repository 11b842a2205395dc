"""vLLM's `--root-path`: the HTTP application behind a proxy that routes by a path prefix.

vLLM sets FastAPI's `root_path`, which puts it on every request's scope; Starlette's
routing then takes it off the front of a path that starts with it (`/prefix/v1/models`
is `/v1/models`), and a path without it is routed as it is. `RootPath`, in front of the
whole application here (the v2 inference shortcut and the refusal while draining
included), puts it on the scope of a request whose path starts with it, and only there:
a mounted application (KServe's `/openai/v1`) would take a root path on the scope as a
prefix its path has, and answer a path without it 404. Every check that reads a path
(`--api-key`'s, restricted APIs', the error shape of a route) reads `route_path`, the
path Starlette's routing sees: a prefixed path is guarded as the route it reaches.
FastAPI's `/openapi.json`, asked through the prefix, names it as its server (`servers:
[{"url": "/prefix"}]`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


def _under(path: str, root: str) -> bool:
    """Whether `path` starts with `root` and the next character ends a segment."""
    return path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/")


# Where `RootPath` notes the prefix it took, beside the scope's `root_path`: a mounted
# application (KServe's `/openai`) adds its own mount path to `root_path`, which is no
# part of the path the server's checks and error shapes read.
_PREFIX = "ge_serve.root_path"


def route_path(scope: Scope) -> str:
    """The path the routes match, without --root-path's prefix where it has it (the path
    Starlette's routing reads at the top of the application)."""
    path: str = scope["path"]
    root: str = scope.get(_PREFIX, "")
    return path[len(root) :] if root else path


class RootPath:
    """ASGI: the root path on the scope of every request whose path starts with it."""

    def __init__(self, app: ASGIApp, root: str) -> None:
        self.app = app
        self.root = root

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and _under(scope["path"], self.root):
            scope["root_path"] = scope[_PREFIX] = self.root
        await self.app(scope, receive, send)


def with_root_path(app: ASGIApp, root: str) -> ASGIApp:
    """`app` behind `root` ("": none, and nothing in front of it)."""
    return RootPath(app, root) if root else app
