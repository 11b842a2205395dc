"""Pure ASGI middleware that refuses restricted HTTP APIs without their header."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ge_serve.server.control.restrictions import RestrictedApis, http_category, http_refusal_message

from .errors import error_response
from .openai.errors import OpenAIError, is_anthropic_path, is_openai_path
from .rootpath import route_path


class RestrictedApiMiddleware:
    """403 `{"error": "This API is restricted, expecting header '<h>'"}`, as Triton; on /v1
    (and vLLM's /tokenize and /detokenize), 401 with OpenAI's error object, as Triton's
    OpenAI front end (and OpenAI's own API, whose clients raise AuthenticationError); on
    /v1/messages, Anthropic's error object (`authentication_error`).

    Installed only when some category is restricted, so unrestricted servers pay nothing.
    """

    def __init__(self, app: ASGIApp, restrictions: RestrictedApis) -> None:
        self.app = app
        self.restrictions = restrictions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = route_path(scope)  # the route it reaches, behind --root-path too
            category = http_category(path)
            header = self.restrictions.refusal(category, Headers(scope=scope))
            if header is not None:
                message = http_refusal_message(header)
                if is_openai_path(path):
                    response = OpenAIError(
                        f"{message} with valid value",
                        status=401,
                        kind="authentication_error",
                        code="invalid_auth",
                    ).response(is_anthropic_path(path))
                else:
                    response = error_response(403, message)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
