"""What the SageMaker and Vertex AI endpoints share (sagemaker.py, vertexai.py): they are
route maps onto the HTTP front end's own application, so a request to them is the
KServe v2 request it stands for, re-addressed, and answered by the same handlers (and
the same --http-restricted-api rules).

Their inference bodies differ in one way, as in Triton: the length of the JSON header of
a body with binary tensor data is given in the content type
(`application/vnd.<platform>-triton.binary+json;json-header-size=<n>`), not in
`Inference-Header-Content-Length`, and neither compresses (Triton assumes identity both
ways).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ErrorCode, ServerError
from ..startup.tritonflags import stoi

# Request headers an inference request through these endpoints does not pass on.
_DROPPED: Final = frozenset(
    {b"inference-header-content-length", b"content-encoding", b"accept-encoding"}
)
_DIGITS: Final = re.compile(r"[ \t\n\v\f\r]*[+-]?[0-9]+")


def header_length(content_type: str, content_length: str | None, mime: str) -> int | None:
    """The JSON header length a content type gives (None: the body is all JSON), checked
    in Triton's words (GetInferenceHeaderLength)."""
    position = content_type.find(mime)
    if position < 0:
        return None
    if position != 0:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"expect MIME type for binary data starts with '{mime}', got: {content_type}",
        )
    given = content_type[len(mime) :]
    if _DIGITS.match(given) is None:
        raise ServerError(
            ErrorCode.INVALID_ARG, f"Unable to parse inference header size, got: {given}"
        )
    try:
        value = stoi(given)
    except ValueError:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"Unable to parse inference header size, value is out of range, got: {given}",
        ) from None
    # Without Content-Length (a chunked body) the codec checks the length against the body.
    limit = int(content_length) if content_length and content_length.isdigit() else None
    if value < 0 or (limit is not None and value > limit):
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"inference header size should be in range (0, {limit}), got: {given}",
        )
    return value


def readdressed(scope: Scope, path: str, method: str) -> Scope:
    """`scope` as a request for `path` with `method`, its query string dropped."""
    inner = dict(scope)
    inner.update(path=path, raw_path=path.encode(), method=method, query_string=b"")
    inner["path_params"] = {}
    return inner


def infer_scope(scope: Scope, path: str, mime: str) -> Scope:
    """`scope` as the KServe v2 inference (or generate) request at `path`: the content
    type's header length as Inference-Header-Content-Length, no compression either way.
    ServerError for a content type Triton refuses."""
    inner = readdressed(scope, path, "POST")
    headers = [(k, v) for k, v in scope["headers"] if k not in _DROPPED]
    given = dict(headers)
    content_type = given.get(b"content-type", b"").decode("latin-1")
    content_length = given.get(b"content-length", b"").decode("latin-1") or None
    length = header_length(content_type, content_length, mime)
    if length is not None:
        headers.append((b"inference-header-content-length", str(length).encode()))
    inner["headers"] = headers
    return inner


async def respond(send: Send, status: int, message: str | None = None) -> None:
    """An answer of ours: `{"error": message}`, or no body."""
    body = b"" if message is None else orjson.dumps({"error": message})
    headers = [(b"content-length", str(len(body)).encode())]
    if message is not None:
        headers.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def error(send: Send, exc: ServerError, status: int = 400) -> None:
    await respond(send, status, exc.message)


def rewriting_send(
    send: Send,
    headers: Callable[[list[tuple[bytes, bytes]]], list[tuple[bytes, bytes]]] | None = None,
    status: Callable[[int, bytes], int] | None = None,
) -> Send:
    """`send` with the response's headers, and its error status (given the error body),
    rewritten. The start of an error answer is held back until its body is known."""
    held: list[Message] = []

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            if headers is not None:
                message["headers"] = headers(list(message.get("headers", [])))
            if status is not None and message["status"] >= 400:
                held.append(message)
                return
        elif held and message["type"] == "http.response.body":
            start = held.pop()
            start["status"] = status(start["status"], message.get("body", b"")) if status else 0
            await send(start)
        await send(message)

    return wrapped


async def forward_infer(
    inner: ASGIApp, scope: Scope, receive: Receive, send: Send, path: str, mime: str
) -> None:
    """`scope`, a POST carrying an inference (or generate) request, to the front end's
    `path`; a 405 for another method, a 400 for a content type Triton refuses."""
    if scope["method"] != "POST":
        await respond(send, 405, "Method Not Allowed")
        return
    try:
        readdressed_scope = infer_scope(scope, path, mime)
    except ServerError as exc:
        await error(send, exc)
        return
    await inner(readdressed_scope, receive, send)
