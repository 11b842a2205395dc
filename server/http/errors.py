"""The one place where core error codes become HTTP status codes."""

from __future__ import annotations

from typing import Literal

import orjson
from starlette.responses import Response

from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference import error_texts

STATUS = {
    ErrorCode.INVALID_ARG: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
    ErrorCode.INTERNAL: 500,
    # Triton answers 400 for every kind that has no HTTP status of its own.
    ErrorCode.ALREADY_EXISTS: 400,
    ErrorCode.CANCELLED: 400,
    ErrorCode.UNKNOWN: 400,
}


class ClosingError(ServerError):
    """An error whose answer also ends the connection (`Connection: close`): the request
    was not read to its end, so the connection cannot carry another one."""


def error_response(status: int, message: str) -> Response:
    return Response(
        orjson.dumps({"error": message}), status_code=status, media_type="application/json"
    )


def http_status(exc: ServerError) -> int:
    return STATUS.get(exc.code, 400)


def server_error_response(exc: ServerError) -> Response:
    response = error_response(http_status(exc), exc.message)
    if isinstance(exc, ClosingError):
        response.headers["connection"] = "close"
    return response


class TooLarge(ServerError):
    """A request body past --http-max-input-size: `size` bytes as it came (a body still
    arriving is counted up to the first byte past `limit`), or None where it is past the
    limit decompressed. The v2 routes answer it 400, as Triton; /v1 answers 413
    `content_too_large`, as Triton's OpenAI front end (openai/errors.py)."""

    def __init__(self, message: str, limit: int, size: int | None = None) -> None:
        super().__init__(ErrorCode.INVALID_ARG, message)
        self.limit = limit
        self.size = size


class ClosingTooLarge(TooLarge, ClosingError):
    """A body refused as it arrived, the rest unread."""


# How a body past its bound is worded: a JSON body or header, a raw-binary body, or one
# with binary tensor data after its JSON header.
BodyKind = Literal["json", "raw", "binary"]


def too_large(
    size: int, limit: int, kind: BodyKind = "json", declared: bool = False
) -> ServerError:
    """Triton's words for a body past its bound (a body still arriving is counted up to
    the first byte past it; `declared`: its Content-Length says so)."""
    if kind == "raw":
        message = error_texts.raw_input_too_large(size, limit).message
    elif kind == "binary":
        if declared and limit == error_texts.INT_MAX:
            message = error_texts.content_length_out_of_range(size)
        else:
            message = error_texts.binary_body_too_large(limit)
    else:
        message = error_texts.request_json_size(size, limit)
    return ClosingTooLarge(message, limit, size)
