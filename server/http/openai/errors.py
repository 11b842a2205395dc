"""OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`, and the one
place where the core's errors become it.

OpenAI answers a bad request with 400 and type `invalid_request_error`, an unknown model
with 404 and code `model_not_found`, and its own faults with 5xx and type `server_error`.
A core `ServerError` keeps the status the v2 routes give it (server/http/errors.py), so a
request fails with the same status on both APIs; a model that reports a bad request
(INVALID_ARG, e.g. a prompt longer than its context) is a 400 here too, with OpenAI's
code `context_length_exceeded` when its message says the context is too short. A body
past --http-max-input-size, which v2 answers 400 as Triton does, is a 413 with code
`content_too_large` here, as Triton's OpenAI front end answers it.

On Anthropic's Messages API (/v1/messages, anthropic.py) the same error is Anthropic's
object, `{"type": "error", "error": {"type", "message"}}`, its type picked by status as
vLLM's translate_error_type picks it (`OpenAIError.anthropic_body`).

Such a refusal names its parameter as the schema's checks do. The context's is the field
that holds the prompt (`messages` or `prompt`), as OpenAI names it whether the prompt or
the prompt and `max_tokens` together are too long. Otherwise it is the parameter its
message begins with, if the request sent it: the `llm` engine words its checks so
("seed must not be negative", "stop: at most 64 strings"). The model's error carries only
its code and message, so the message is all there is to go by.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Any

import orjson
from pydantic import BaseModel
from starlette.responses import Response

from ge_serve.server.errors import ErrorCode, ServerError

from ..errors import ClosingError, TooLarge, http_status

# The paths whose errors, wherever they arise, are OpenAI's error object: /v1 and below,
# and vLLM's tokenizer, scoring and pooling routes beside it (tokenize.py, scoring.py,
# pooling.py), and its Cohere embed route (cohere_embed.py), whose errors vLLM gives as
# OpenAI's error object too.
OPENAI_ROOT = "/v1"
OPENAI_PREFIX = OPENAI_ROOT + "/"
# KServe's prefix of the same API (its KSERVE_OPENAI_ROUTE_PREFIX's default): /openai/v1/...
# is served as /v1/... (app.py), for deployments moved from KServe.
KSERVE_PREFIX = "/openai"
KSERVE_ROOT = KSERVE_PREFIX + OPENAI_ROOT
TOKENIZER_PATHS = frozenset(("/tokenize", "/detokenize", "/tokenizer_info"))
SCORING_PATHS = frozenset(("/score", "/rerank", "/v2/rerank", "/pooling", "/v2/embed"))
# vLLM's server load (serverload.py).
LOAD_PATH = "/load"
# vLLM's SageMaker route and its version route (invocations.py, routes.py).
SERVING_PATHS = frozenset((LOAD_PATH, "/invocations", "/version"))
# Anthropic's Messages API (anthropic.py): its errors are Anthropic's error object.
ANTHROPIC_PATHS = frozenset(("/v1/messages", "/v1/messages/count_tokens"))
# Anthropic's `error.type` by status, as vLLM's translate_error_type picks it (its SDKs
# raise by it); other 4xx are invalid_request_error, 5xx api_error.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
INVALID_REQUEST = "invalid_request_error"
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
CONTEXT_WORDS = "maximum context length"
CONTENT_TOO_LARGE = "content_too_large"
NOT_FOUND = "not_found_error"
SERVER_ERROR = "server_error"
# A message's first word, which may name the parameter it is about.
_FIRST_WORD = re.compile(r"[A-Za-z_]+")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorObject(BaseModel):
    """OpenAI's error answer (OpenAIError.body), as the OpenAPI document describes the
    /v1 routes' errors."""

    error: ErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorObject(BaseModel):
    """Anthropic's error answer (OpenAIError.anthropic_body), for /v1/messages."""

    type: str
    error: AnthropicErrorDetail


class OpenAIError(Exception):
    """A request that fails with OpenAI's error object and `status`."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        kind: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        closes: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind
        self.param = param
        self.code = code
        # The request's body was not read to its end: the answer ends the connection.
        self.closes = closes

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's error object, as vLLM's /v1/messages answers: the type its status
        gives, and the message."""
        fallback = "api_error" if self.status >= 500 else INVALID_REQUEST
        kind = ANTHROPIC_TYPES.get(self.status, fallback)
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, anthropic: bool = False) -> Response:
        """The answer: OpenAI's error object, or with `anthropic`, Anthropic's."""
        body = self.anthropic_body() if anthropic else self.body()
        response = Response(
            orjson.dumps(body), status_code=self.status, media_type="application/json"
        )
        if self.closes:
            response.headers["connection"] = "close"
        return response


def is_openai_path(path: str) -> bool:
    """Whether errors on `path` are OpenAI's error object (`/v1` itself too, and KServe's
    `/openai/v1`)."""
    if path.startswith(KSERVE_ROOT):
        path = path[len(KSERVE_PREFIX) :]
    return (
        path.startswith(OPENAI_PREFIX)
        or path == OPENAI_ROOT
        or path in SERVING_PATHS
        or path in TOKENIZER_PATHS
        or path in SCORING_PATHS
    )


def is_anthropic_path(path: str) -> bool:
    """Whether errors on `path` are Anthropic's error object (also under `/openai`)."""
    if path.startswith(KSERVE_ROOT):
        path = path[len(KSERVE_PREFIX) :]
    return path.rstrip("/") in ANTHROPIC_PATHS


def unsupported(param: str, message: str) -> OpenAIError:
    """A parameter this server accepts only at its default."""
    return OpenAIError(message, param=param, code="unsupported_parameter")


def model_not_found(name: str) -> OpenAIError:
    return OpenAIError(
        f"The model '{name}' does not exist or cannot be served by this endpoint",
        status=404,
        kind=INVALID_REQUEST,
        param="model",
        code="model_not_found",
    )


def from_server_error(
    exc: ServerError, prompt_param: str | None = None, sent: Collection[str] = ()
) -> OpenAIError:
    """The core's error as OpenAI's: the status the v2 routes give it, a type that says
    whose fault it is, and for a bad request, the parameter: `prompt_param` (the field
    holding the prompt) for the context's length, else one of `sent` (the parameters the
    request passed to the model) that the message begins with."""
    if isinstance(exc, TooLarge):
        return content_too_large(exc)
    status = http_status(exc)
    closes = isinstance(exc, ClosingError)
    if exc.code is ErrorCode.NOT_FOUND:
        return OpenAIError(exc.message, status=404, code="model_not_found", param="model")
    kind = INVALID_REQUEST if status < 500 else SERVER_ERROR
    code = param = None
    if exc.code is ErrorCode.INVALID_ARG:
        # vLLM's wording, which the llm engine keeps: clients that trim a conversation to
        # fit look for OpenAI's code, not the text.
        if CONTEXT_WORDS in exc.message:
            code, param = CONTEXT_LENGTH_EXCEEDED, prompt_param
        else:
            first = _FIRST_WORD.match(exc.message)
            if first is not None and first.group() in sent:
                param = first.group()
            else:
                # vLLM's words that name the parameter later ("token_id(s) [9] in
                # logit_bias contain..."): a sent parameter's name with an underscore,
                # which no English word of a message is.
                named = (w for w in _FIRST_WORD.findall(exc.message) if "_" in w and w in sent)
                param = next(named, None)
    return OpenAIError(exc.message, status=status, kind=kind, param=param, code=code, closes=closes)


def content_too_large(exc: TooLarge) -> OpenAIError:
    """A body past --http-max-input-size: 413 `content_too_large`, in the words of
    Triton's OpenAI front end (which counts a body as it arrives, as the v2 routes do)."""
    size = exc.size
    what = "Decompressed request size" if size is None else f"Request size of {size} bytes"
    return OpenAIError(
        f"{what} exceeds the maximum allowed input size of {exc.limit} bytes. "
        "Use --http-max-input-size to increase the limit.",
        status=413,
        code=CONTENT_TOO_LARGE,
        closes=isinstance(exc, ClosingError),
    )
