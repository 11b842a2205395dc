"""The /v1 routes, each answering every failure with OpenAI's error object.

`GET /v1/models` and `GET /v1/models/{model}`, `POST /v1/chat/completions`,
`POST /v1/completions`, `POST /v1/embeddings`. A body is read as the v2 routes read
theirs (size-capped, decompressed), parsed as JSON, then checked (schemas.py).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ge_serve.server.errors import ServerError, internal

from ..disconnects import CLIENT_GONE, ClientGone
from ..openapi import ApiRoute
from ..openapi import Body as DocumentedBody
from ..routing import RouteHost
from . import embeddings, text
from .catalog import Catalog
from .errors import SERVER_ERROR, OpenAIError, from_server_error, model_not_found
from .schemas import (
    Body,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ErrorObject,
    parse,
)

log = logging.getLogger(__name__)

B = TypeVar("B", bound=Body)
Handler = Callable[[Request], Awaitable[Response]]


def routes(front: RouteHost) -> list[Route]:
    catalog = Catalog(front.core)

    async def read(request: Request, schema: type[B]) -> B:
        raw = await front.read_body(request)
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise OpenAIError(
                f"We could not parse the JSON body of your request: {exc}",
                code="invalid_json",
            ) from None
        body = parse(schema, document)
        refuse = getattr(body, "refuse_unsupported", None)
        if refuse is not None:
            refuse()
        return body

    async def list_models(request: Request) -> Response:
        return _json({"object": "list", "data": await catalog.listing()})

    async def retrieve_model(request: Request) -> Response:
        name = str(request.path_params["model"])
        if name not in {m["id"] for m in await catalog.listing()}:
            raise model_not_found(name)
        return _json(catalog.describe(name))

    async def chat(request: Request) -> Response:
        body = await read(request, ChatCompletionRequest)
        return await text.chat_completion(catalog, request, body)

    async def completions(request: Request) -> Response:
        body = await read(request, CompletionRequest)
        return await text.completion(catalog, request, body)

    async def embed(request: Request) -> Response:
        body = await read(request, EmbeddingRequest)
        return _json(await embeddings.embeddings(catalog, body))

    def get(path: str, handler: Handler) -> Route:
        return ApiRoute(path, _openai_errors(handler), methods=["GET"], error=ErrorObject)

    def post(path: str, handler: Handler, schema: type[Body]) -> Route:
        body = DocumentedBody(schema)
        return ApiRoute(
            path, _openai_errors(handler), methods=["POST"], body=body, error=ErrorObject
        )

    return [
        get("/v1/models", list_models),
        get("/v1/models/{model}", retrieve_model),
        post("/v1/chat/completions", chat, ChatCompletionRequest),
        post("/v1/completions", completions, CompletionRequest),
        post("/v1/embeddings", embed, EmbeddingRequest),
    ]


def _openai_errors(handler: Handler) -> Handler:
    """Every failure as OpenAI's error object: the client's mistakes 4xx, a model's or the
    server's failure 5xx (logged with its traceback)."""

    @functools.wraps(handler)
    async def answered(request: Request) -> Response:
        try:
            return await handler(request)
        except OpenAIError as exc:
            return exc.response()
        except ServerError as exc:
            return from_server_error(exc).response()
        except ClientGone:
            return Response(status_code=CLIENT_GONE)
        except Exception as exc:
            log.exception("unhandled error on %s", request.url.path)
            message = internal(exc, escaped=True).message
            return OpenAIError(message, status=500, kind=SERVER_ERROR).response()

    return answered


def _json(data: Any) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")
