"""vLLM's SageMaker routes on its own HTTP port: `POST /invocations`, whose body's kind
picks the route that answers it, and `GET`/`POST /ping` (vLLM's /health). A vLLM
container on SageMaker is started with `--port 8080` and called there; Triton's own
SageMaker endpoint (--allow-sagemaker, its own listener) keeps Triton's meaning.

vLLM tries its request types in order, the first its body validates as answering it:
chat, completions, then the pooling ones (embeddings, scoring, reranking). Here the same
order reads the body's fields: `messages` (a chat, or the embedding chat form where the
model named embeds), `prompt`, `input`, `query` with `documents` (reranking), one of
/score's pairs of fields; the route then checks the body as its own, with its own
errors. A body of no kind is vLLM's 400, "Cannot find suitable handler for request".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from starlette.requests import Request
from starlette.types import Message

from .errors import OpenAIError

CHAT: Final = "chat"
COMPLETIONS: Final = "completions"
EMBEDDINGS: Final = "embeddings"
RERANK: Final = "rerank"
SCORE: Final = "score"
# /score's forms (scoring.py), by the first field of each pair.
_SCORE_FIELDS: Final = ("queries", "data_1", "text_1")
_KINDS: Final = (
    "ChatCompletionRequest, CompletionRequest, EmbeddingRequest, RerankRequest, ScoreRequest"
)


def route(document: Any, generative: Callable[[str | None], bool]) -> str:
    """The route a body goes to; `generative`: whether the model it names (None: the
    one the server serves) generates text, rather than embeds it."""
    if not isinstance(document, dict):
        raise OpenAIError("The request body must be a JSON object")
    model = document.get("model")
    if "messages" in document:
        named = model if isinstance(model, str) else None
        return CHAT if generative(named) else EMBEDDINGS
    if "prompt" in document:
        return COMPLETIONS
    if "input" in document:
        return EMBEDDINGS
    if "query" in document and "documents" in document:
        return RERANK
    if any(field in document for field in _SCORE_FIELDS):
        return SCORE
    raise OpenAIError(f"Cannot find suitable handler for request. Expected one of: [{_KINDS}]")


def replayed(request: Request, body: bytes) -> Request:
    """`request` with its body (as read and decoded) to be read again by the route that
    answers it; what the client sends after it (its leaving) still reaches that route."""
    scope = dict(request.scope)
    # Decoded already: the route must not decode it again, and reads its own length.
    dropped = (b"content-encoding", b"content-length", b"transfer-encoding")
    headers = [(k, v) for k, v in scope["headers"] if k not in dropped]
    scope["headers"] = [*headers, (b"content-length", str(len(body)).encode())]
    given = False

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await request.receive()

    return Request(scope, receive)
