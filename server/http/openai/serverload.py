"""vLLM's `--enable-server-load-tracking` and its `GET /load`: `{"server_load": N}`, the
requests in progress on the routes vLLM counts (its `load_aware_call`), for a router
that sends work to the least loaded server.

vLLM counts chat (and its batch), completions, embeddings, the Responses API (its
retrieve and cancel too), the Messages API (and count_tokens), `/pooling`, the scoring
routes (`/score`, `/rerank`, their `/v1` aliases, `/v2/rerank`) and Cohere's `/v2/embed`,
and `/invocations` through the handler it picks; ge-serve's routes of those paths
(`TRACKED`, also under KServe's `/openai/v1`) count here. Not `/tokenize`, the model
listing, health or the v2 protocol, as in vLLM.

A request counts from when its route takes it until its answer's last byte is sent, a
stream's too, or until it ends any other way (an error, the client gone, cancelled): the
count is taken and given back around the route's whole ASGI call, so it cannot drift.
vLLM gives it back from the answer's background task, or as the client leaves; and it
counts from after FastAPI has read and checked the body, where here the route's own read
of the body counts too. A refusal before the route (a missing API key, a restricted API,
a stopping server, a wrong method) never counts.

Off (vLLM's default), no route is wrapped, so nothing is counted or paid for, and `/load`
answers 0, as vLLM's does.
"""

from __future__ import annotations

from typing import Final

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

TRACKED: Final = frozenset(
    (
        "/v1/chat/completions",
        "/v1/chat/completions/batch",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/responses/{response_id}",
        "/v1/responses/{response_id}/cancel",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/pooling",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/v2/embed",
        # vLLM's SageMaker route passes each request to one of the counted handlers.
        "/invocations",
    )
)


class ServerLoad:
    """The count of requests in progress on the tracked routes (one front end's: with
    --http-workers, every such request is answered by the server's own, passon.py)."""

    def __init__(self, tracking: bool) -> None:
        self.tracking = tracking
        self.count = 0

    def track(self, routes: list[Route]) -> list[Route]:
        """`routes`, those of the tracked paths counting their requests where tracking is
        on (in place: the same routes serve KServe's `/openai/v1`)."""
        if self.tracking:
            for route in routes:
                if route.path in TRACKED:
                    route.app = self._counted(route.app)
        return routes

    def _counted(self, app: ASGIApp) -> ASGIApp:
        async def counted(scope: Scope, receive: Receive, send: Send) -> None:
            self.count += 1
            try:
                await app(scope, receive, send)
            finally:
                self.count -= 1

        return counted

    async def answer(self, request: Request) -> Response:
        return Response(orjson.dumps({"server_load": self.count}), media_type="application/json")
