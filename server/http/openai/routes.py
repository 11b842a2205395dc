"""The /v1 routes, each answering every failure with OpenAI's error object.

`GET /v1/models` and `GET /v1/models/{model}`, `POST /v1/chat/completions` (and vLLM's
`POST /v1/chat/completions/batch`, chatbatch.py), `POST /v1/completions`,
`POST /v1/embeddings`, `POST /v1/responses` (and vLLM's `GET /v1/responses/{id}` and its
cancel, a 404: no store), and Triton's OpenAI front end's
`POST /v1/models/{model}/load` and `/unload` (management.py). A body is read as the v2
routes read theirs (size-capped, decompressed), parsed as JSON, then checked
(schemas.py); one past --http-max-input-size is a 413 here (errors.content_too_large).

Also `GET /health/ready`, the readiness route of Triton's OpenAI front end, so probes
written for it work here: 200 with no body when the server is ready (as
`/v2/health/ready`), else 400 with its words; in the restricted-API category `health`,
as Triton puts it. And `GET /health`, vLLM's health route, which tools written for vLLM
(guidellm, k8s probes) call first: 200 with no body while the server is live, else 503,
as vLLM answers when its engine is dead; in the same category.

And Anthropic's Messages API as vLLM serves it, `POST /v1/messages` and
`POST /v1/messages/count_tokens` (anthropic_serve.py), on the chat path; every failure
there is Anthropic's error object.

And vLLM's `GET /load` (serverload.py), `POST /tokenize` and `POST /detokenize`
(tokenize.py), its scoring routes `POST /score`, `/v1/score`, `/rerank`, `/v1/rerank`
and `/v2/rerank` (scoring.py), its `POST /pooling` (pooling.py) and its Cohere
`POST /v2/embed` (cohere_embed.py), in `inference` (`/load` in `statistics`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ge_serve.server.control.chat import ChatSettings
from ge_serve.server.control.requestlog import RequestLogging
from ge_serve.server.errors import ServerError, internal

from ..disconnects import CLIENT_GONE, ClientGone, until_disconnect
from ..openapi import ApiRoute
from ..openapi import Body as DocumentedBody
from ..routing import RouteHost
from . import (
    anthropic_serve,
    chatbatch,
    cohere_embed,
    embeddings,
    invocations,
    pooling,
    responses_serve,
    scoring,
    serverload,
    text,
    tokenize,
)
from .anthropic import CountTokensRequest, MessagesRequest, counted_fits, known_blocks
from .catalog import Catalog, is_generative, text_generation
from .embed_schemas import EmbeddingRequest, PoolingRequest
from .errors import (
    CONTEXT_LENGTH_EXCEEDED,
    LOAD_PATH,
    SERVER_ERROR,
    AnthropicErrorObject,
    ErrorObject,
    OpenAIError,
    from_server_error,
    model_not_found,
)
from .management import ModelManagement
from .responses import ResponsesRequest, not_found
from .schemas import (
    Body,
    ChatCompletionRequest,
    CompletionRequest,
    parse,
)
from .tools import ToolSettings

log = logging.getLogger(__name__)

B = TypeVar("B", bound=Body)
M = TypeVar("M", bound=CountTokensRequest)

# Bodies larger than this are parsed and checked off the event loop's thread: below it
# that takes well under a millisecond, less than the hand-over to a thread would add.
PARSED_ON_THE_LOOP = 64 * 1024
Handler = Callable[[Request], Awaitable[Response]]
# Triton's OpenAI front end's answer, a FastAPI HTTPException's body.
NOT_READY = {"detail": "Attached inference engine is not ready for inference requests."}


def routes(
    front: RouteHost,
    tools: ToolSettings | None = None,
    chats: ChatSettings | None = None,
    load_tracking: bool = False,
    request_log: RequestLogging | None = None,
) -> list[Route]:
    catalog = Catalog(front.core, tools, chats, request_log)
    load = serverload.ServerLoad(load_tracking)
    management = ModelManagement(front.core, catalog)

    async def read_document(
        request: Request, bounded: Callable[[Any], None] | None
    ) -> tuple[Any, bool]:
        """The body's JSON document, and whether it is large (checked off the loop)."""
        document, large = await parsed(await front.read_body(request))
        # Checking a body of a million messages takes seconds, off the loop's thread or
        # on it, since the check holds the interpreter throughout: what `bounded` refuses
        # is never checked.
        if bounded is not None:
            bounded(document)
        return document, large

    async def parsed(raw: bytes) -> tuple[Any, bool]:
        """`raw`'s JSON document (parsed off the loop where large), and whether it is."""
        large = len(raw) > PARSED_ON_THE_LOOP
        return (await asyncio.to_thread(_document, raw) if large else _document(raw)), large

    async def read(
        request: Request,
        schema: type[B] | Callable[[Any], type[B]],
        bounded: Callable[[Any], None] | None = None,
    ) -> B:
        """The body checked against `schema` (or the schema it picks for the document);
        `bounded` may refuse a document first, before the checks, whose cost grows with it."""
        document, large = await read_document(request, bounded)
        if not isinstance(schema, type):
            schema = schema(document)
        if large:
            return await asyncio.to_thread(_checked, document, schema)
        return _checked(document, schema)

    async def read_conversation(
        request: Request, schema: type[M], bounded: Callable[[Any], None]
    ) -> tuple[M, ChatCompletionRequest]:
        """A Messages body and the chat request it becomes, both checked off the loop
        when large (the conversion checks every message and block again)."""
        document, large = await read_document(request, bounded)
        if large:
            return await asyncio.to_thread(_conversation, document, schema)
        return _conversation(document, schema)

    def body_first(handler: Callable[[Request], Awaitable[Response]]) -> Callable[..., Any]:
        """A route that takes no body still reads what is sent, size-capped: a body past
        --http-max-input-size is the 413 every /v1 POST gives (Triton's front end checks
        the size before any route), whatever else is wrong."""

        async def handle(request: Request) -> Response:
            await front.read_body(request)
            return await handler(request)

        return handle

    def conversation_fits(document: Any, batch: bool = False) -> None:
        """Every message of a conversation renders to at least one token (its role's
        markers, in any chat template), so one with more messages than the model's
        context has tokens cannot fit. `batch`: `messages` is a list of conversations."""
        if not isinstance(document, dict):
            return
        messages, name = document.get("messages"), document.get("model")
        if not isinstance(messages, list) or not isinstance(name, str | None):
            return
        try:
            # Without `model`, the one generative model that will answer.
            generation = text_generation(catalog.generator(name, text.CHAT_API)[1])
        except (OpenAIError, ServerError):
            return  # the checks that follow answer it
        limit = generation.max_model_len if generation is not None else 0
        found = enumerate(messages) if batch else [(None, messages)]
        for index, conversation in found:
            if isinstance(conversation, list) and 0 < limit < len(conversation):
                raise OpenAIError(
                    f"This model's maximum context length is {limit} tokens. However, your "
                    f"messages are {len(conversation)} messages, each of at least one token.",
                    param="messages" if index is None else f"messages[{index}]",
                    code=CONTEXT_LENGTH_EXCEEDED,
                )

    def conversations_fit(document: Any) -> None:
        chatbatch.bounded(document)
        conversation_fits(document, batch=True)

    async def health_ready(request: Request) -> Response:
        if front.core.ready():
            return Response(status_code=200)
        return Response(orjson.dumps(NOT_READY), status_code=400, media_type="application/json")

    async def health(request: Request) -> Response:
        # Liveness, not readiness: vLLM's route is its liveness probe too, and a pod
        # whose models are still loading must not be restarted for it.
        return Response(status_code=200 if front.core.live() else 503)

    async def list_models(request: Request) -> Response:
        return _json({"object": "list", "data": catalog.listing()})

    async def retrieve_model(request: Request) -> Response:
        name = str(request.path_params["model"])
        if name not in {m["id"] for m in catalog.listing()}:
            raise model_not_found(name)
        return _json(catalog.describe(name))

    async def kserve_v1(request: Request) -> Response:
        # KServe's REST client speaks its v1 protocol unless told v2; here /v1 is OpenAI's,
        # and a plain 405 from the route above would not say why.
        name, colon, verb = str(request.path_params["model"]).rpartition(":")
        if verb not in ("predict", "explain") or not colon:
            raise OpenAIError(f"Method Not Allowed: POST {request.url.path}", status=405)
        raise OpenAIError(
            f"KServe's v1 protocol ('{verb}') is not served: /v1 is the OpenAI API here. "
            f"Use the v2 protocol: POST /v2/models/{name}/infer",
            status=404,
            code="not_found",
        )

    async def chat(request: Request) -> Response:
        body = await read(request, ChatCompletionRequest, conversation_fits)
        return await text.chat_completion(catalog, request, body)

    async def batch_chat(request: Request) -> Response:
        body = await read(request, chatbatch.BatchChatCompletionRequest, conversations_fit)
        return await chatbatch.batch_chat_completion(catalog, request, body)

    async def completions(request: Request) -> Response:
        body = await read(request, CompletionRequest)
        return await text.completion(catalog, request, body)

    async def responses(request: Request) -> Response:
        body = await read(request, ResponsesRequest)
        return await responses_serve.create(catalog, request, body)

    def blocks_fit(document: Any) -> None:
        known_blocks(document)
        conversation_fits(document)

    async def messages(request: Request) -> Response:
        body, chat = await read_conversation(request, MessagesRequest, blocks_fit)
        return await anthropic_serve.create(catalog, request, body, chat)

    async def count_tokens(request: Request) -> Response:
        body, chat = await read_conversation(request, CountTokensRequest, counted_fits)
        counted = anthropic_serve.count_tokens(catalog, body, chat)
        return _json(await until_disconnect(request, counted))

    async def stored_response(request: Request) -> Response:
        # vLLM's routes; its store is off by default, so no response is ever found.
        raise not_found(str(request.path_params["response_id"]))

    async def embed(request: Request) -> Response:
        body = await read(request, EmbeddingRequest)
        given = text.request_id(request, body.request_id)
        # vLLM's @with_cancellation: a client that leaves cancels every text's request,
        # queued or running, rather than leave the model to embed them for no one.
        return await until_disconnect(request, embeddings.embeddings(catalog, body, given))

    async def pool(request: Request) -> Response:
        body = await read(request, PoolingRequest)
        # Cancelled with its client, as /v1/embeddings (vLLM's @with_cancellation).
        return await until_disconnect(request, pooling.pooling(catalog, request, body))

    async def cohere(request: Request) -> Response:
        body = await read(request, cohere_embed.CohereEmbedRequest, cohere_embed.blocks_fit)
        # Cancelled with its client, as /v1/embeddings (vLLM's @with_cancellation).
        work = cohere_embed.cohere_embed(catalog, request, body)
        return await until_disconnect(request, work)

    async def score(request: Request) -> Response:
        body = await read(request, scoring.form)
        return _json(await until_disconnect(request, scoring.score(catalog, request, body)))

    async def rerank(request: Request) -> Response:
        body = await read(request, scoring.RerankRequest)
        return _json(await until_disconnect(request, scoring.rerank(catalog, request, body)))

    async def tokenize_text(request: Request) -> Response:
        body = await read(request, tokenize.form)
        return _json(await tokenize.tokenize(catalog, body))

    async def detokenize(request: Request) -> Response:
        body = await read(request, tokenize.DetokenizeRequest, tokenize.ids_bounded)
        return _json(await tokenize.detokenize(catalog, body))

    async def tokenizer_info(request: Request) -> Response:
        name = request.query_params.get("model")
        return _json(await tokenize.tokenizer_info(catalog, name or None))

    async def invoke(request: Request) -> Response:
        raw = await front.read_body(request)
        document, _ = await parsed(raw)
        kind = invocations.route(document, generates)
        return await invoked[kind](invocations.replayed(request, raw))

    def generates(name: str | None) -> bool:
        """Whether a body for model `name` is for a generator; None: whether the server
        serves one (else an embedding model's chat form, as vLLM's tasks decide)."""
        if name is None:
            return any(is_generative(model) for _, model in catalog.ready())
        try:
            return is_generative(catalog.model(name))
        except OpenAIError:
            return True  # the chat route's 404 says so

    invoked = {
        invocations.CHAT: chat,
        invocations.COMPLETIONS: completions,
        invocations.EMBEDDINGS: embed,
        invocations.RERANK: rerank,
        invocations.SCORE: score,
    }

    async def version(request: Request) -> Response:
        return _json({"version": front.core.metadata().version})

    def get(path: str, handler: Handler) -> Route:
        return ApiRoute(path, _openai_errors(handler), methods=["GET"], error=ErrorObject)

    def post(path: str, handler: Handler, schema: type[BaseModel]) -> Route:
        body = DocumentedBody(schema)
        return ApiRoute(
            path, _openai_errors(handler), methods=["POST"], body=body, error=ErrorObject
        )

    built = [
        front.route("/health/ready", health_ready, ["GET"]),
        front.route("/health", health, ["GET"]),
        # vLLM's SageMaker routes on its own port (invocations.py), and its version.
        front.route("/ping", health, ["GET", "POST"]),
        ApiRoute("/invocations", _openai_errors(invoke), methods=["POST"], error=ErrorObject),
        get("/version", version),
        # vLLM's tokenizer routes (tokenize.py), outside /v1 as vLLM serves them.
        post("/tokenize", tokenize_text, tokenize.TokenizeRequest),
        post("/detokenize", detokenize, tokenize.DetokenizeRequest),
        get("/tokenizer_info", tokenizer_info),
        # vLLM's requests in progress (serverload.py), where it serves it.
        get(LOAD_PATH, load.answer),
        # vLLM's scoring routes for embedding models (scoring.py), where vLLM serves them:
        # /score and /rerank (with /v2/rerank, Cohere's v2 path), and below, their /v1
        # aliases (under /openai/v1 too). Before /v1, which the table keeps last.
        post("/score", score, scoring.ScoreRequest),
        post("/rerank", rerank, scoring.RerankRequest),
        post("/v2/rerank", rerank, scoring.RerankRequest),
        # vLLM's generic pooling route (pooling.py), for embedding models; not under /v1.
        post("/pooling", pool, PoolingRequest),
        # Cohere's embed API as vLLM serves it (cohere_embed.py), beside /v2/rerank.
        post("/v2/embed", cohere, cohere_embed.CohereEmbedRequest),
        get("/v1/models", list_models),
        ApiRoute(
            "/v1/models/{model}", _openai_errors(kserve_v1), methods=["POST"], error=ErrorObject
        ),
        get("/v1/models/{model}", retrieve_model),
        # Triton's OpenAI front end's model management (management.py); no body.
        *(
            ApiRoute(
                f"/v1/models/{{model}}/{verb}",
                _openai_errors(handler),
                methods=["POST"],
                error=ErrorObject,
            )
            for verb, handler in (
                ("load", body_first(management.load)),
                ("unload", body_first(management.unload)),
            )
        ),
        post("/v1/chat/completions", chat, ChatCompletionRequest),
        post("/v1/chat/completions/batch", batch_chat, chatbatch.BatchChatCompletionRequest),
        post("/v1/completions", completions, CompletionRequest),
        post("/v1/embeddings", embed, EmbeddingRequest),
        post("/v1/score", score, scoring.ScoreRequest),
        post("/v1/rerank", rerank, scoring.RerankRequest),
        # OpenAI's Responses API (responses_serve.py), on the chat path.
        post("/v1/responses", responses, ResponsesRequest),
        get("/v1/responses/{response_id}", stored_response),
        # Anthropic's Messages API (anthropic_serve.py), on the chat path.
        *(
            ApiRoute(
                path,
                _openai_errors(handler, anthropic=True),
                methods=["POST"],
                body=DocumentedBody(schema),
                error=AnthropicErrorObject,
            )
            for path, handler, schema in (
                ("/v1/messages", messages, MessagesRequest),
                ("/v1/messages/count_tokens", count_tokens, CountTokensRequest),
            )
        ),
        ApiRoute(
            "/v1/responses/{response_id}/cancel",
            _openai_errors(stored_response),
            methods=["POST"],
            error=ErrorObject,
        ),
    ]
    # vLLM's load_aware_call routes count their requests where --enable-server-load-tracking.
    return load.track(built)


def _document(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(
            f"We could not parse the JSON body of your request: {exc}",
            code="invalid_json",
        ) from None


def _checked(document: Any, schema: type[B]) -> B:
    """The body checked against `schema`, unsupported features refused."""
    body = parse(schema, document)
    refuse = getattr(body, "refuse_unsupported", None)
    if refuse is not None:
        refuse()
    return body


def _conversation(document: Any, schema: type[M]) -> tuple[M, ChatCompletionRequest]:
    body = _checked(document, schema)
    return body, body.chat()


def _openai_errors(handler: Handler, anthropic: bool = False) -> Handler:
    """Every failure as OpenAI's error object (`anthropic`: Anthropic's): the client's
    mistakes 4xx, a model's or the server's failure 5xx (logged with its traceback)."""

    @functools.wraps(handler)
    async def answered(request: Request) -> Response:
        try:
            return await handler(request)
        except OpenAIError as exc:
            return exc.response(anthropic)
        except ServerError as exc:
            return from_server_error(exc).response(anthropic)
        except ClientGone:
            return Response(status_code=CLIENT_GONE)
        except Exception as exc:
            log.exception("unhandled error on %s", request.url.path)
            message = internal(exc, escaped=True).message
            return OpenAIError(message, status=500, kind=SERVER_ERROR).response(anthropic)

    return answered


def _json(data: Any) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")
