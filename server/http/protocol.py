"""The HTTP/1.1 connection protocol: uvicorn's httptools protocol with a lingering close
(lingering.py) and bounds on reading a request (bounded.py), parsing as Triton does.

Two things differ from uvicorn's parsing, both where HTTP framing meets Triton's behaviour:

* Triton counts the non-empty chunks of a chunked request body (its kMaxChunkedChunks).
  An ASGI app only sees body messages, which the server coalesces from whatever arrived
  in one read, so the count must come from the parser: each request's scope carries a
  `ChunkCount` under CHUNKS_KEY, which llhttp's chunk-header callback advances.
* A request with both `Transfer-Encoding: chunked` and `Content-Length` (what `requests`
  sends when a caller chunks a body by hand and names the header) is read by its chunked
  framing, as RFC 9112 section 6.3 prescribes and Triton's HTTP library does, instead of
  being refused as malformed. The same section asks that the connection then close after
  the response, so that nothing a proxy framed differently can follow on it.

  The leniency that allows this (llhttp's `lenient_chunked_length`) also lets through a
  request whose Transfer-Encoding does not end in `chunked` (`identity`, `gzip`), whose
  body llhttp then frames by the connection's close: the request would never be answered.
  The same section says such a request gets 400 and the connection closes, and so it does
  here: the route is not run, a 400 `{"error": ...}` is the answer, and what the client
  still sends is read and dropped (lingering.py) so that the answer reaches it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from starlette.types import Receive, Scope, Send

from .bounded import BoundedHttpToolsProtocol
from .errors import error_response

# The scope key of a request's ChunkCount.
CHUNKS_KEY: Final = "ge_serve.chunks"
# Scope keys for a client that closes its connection before its answer: a handler leaves
# its task under TASK_KEY, and the protocol cancels that task and sets GONE_KEY (see
# `connection_lost`).
TASK_KEY: Final = "ge_serve.task"
GONE_KEY: Final = "ge_serve.gone"


class ChunkCount:
    """The chunk headers of one request's body read so far (the last, empty, chunk
    included once the body has ended)."""

    __slots__ = ("headers",)

    def __init__(self) -> None:
        self.headers = 0

    @property
    def non_empty(self) -> int:
        """Chunks that held data: every header but the body's final empty one. Exact once
        the body has ended; before, at most one short, which never hides an excess."""
        return max(self.headers - 1, 0)


class TritonHttpProtocol(BoundedHttpToolsProtocol):
    """The bounded, lingering httptools protocol with Triton's chunk count and chunked
    framing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._chunks = ChunkCount()
        # Requests still running behind the newest, on a pipelining connection.
        self._earlier: list[Any] = []
        # Both flags: a call sets every leniency it names, and uvicorn's own is kept.
        self.parser.set_dangerous_leniencies(
            lenient_data_after_close=True, lenient_chunked_length=True
        )

    def connection_lost(self, exc: Exception | None) -> None:
        """The client left. uvicorn only marks the request: its handler would run on, and
        a request it had queued would still run, for nobody. A handler that left its task
        in the scope is cancelled, so its request leaves the queue (or its model learns
        it through is_cancelled()), as a cancelled gRPC call does."""
        cycles = [self.cycle, *self._earlier]
        super().connection_lost(exc)
        for cycle in cycles:
            # Mid-body, the handler's read sees the disconnect itself, and says so; once
            # the answer is being sent, it is left to finish (or fail) sending it.
            if cycle is None or cycle.more_body or cycle.response_started:
                continue
            scope: dict[str, object] = cycle.scope  # type: ignore[assignment]
            task = scope.get(TASK_KEY)
            if isinstance(task, asyncio.Task):
                scope[GONE_KEY] = True
                task.cancel()

    def on_headers_complete(self) -> None:
        earlier = self.cycle
        if earlier is not None and not earlier.response_complete:
            # A pipelined request: uvicorn keeps only the newest cycle, and the one still
            # running must be found when the client leaves.
            self._earlier = [c for c in self._earlier if not c.response_complete]
            self._earlier.append(earlier)
        self._chunks = ChunkCount()
        self.scope[CHUNKS_KEY] = self._chunks  # type: ignore[typeddict-unknown-key]
        # Most requests have no Transfer-Encoding: one pass finds that out.
        codings: bytes | None = None
        for name, value in self.headers:
            if name == b"transfer-encoding":
                # Several headers are one list (RFC 9110 section 5.3), as llhttp reads them.
                codings = value if codings is None else codings + b"," + value
        if codings is None:
            super().on_headers_complete()
            return
        # llhttp frames the body as chunked exactly when the list's last element is
        # `chunked` (anything after it, it refuses itself).
        chunked = codings.rsplit(b",", 1)[-1].strip(b" \t").lower() == b"chunked"
        if chunked:
            super().on_headers_complete()
        else:
            # The request gets its cycle as any other, so that a request pipelined before
            # it is answered first; only its application is the refusal.
            app, self.app = self.app, _UnframedBody(codings)
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        closes = not chunked or any(name == b"content-length" for name, _ in self.headers)
        if closes and self.cycle:
            self.cycle.keep_alive = False

    def on_chunk_header(self) -> None:
        self._chunks.headers += 1


class _UnframedBody:
    """The answer to a request whose body's length cannot be known: its Transfer-Encoding
    does not end in `chunked`."""

    __slots__ = ("_codings",)

    def __init__(self, codings: bytes) -> None:
        self._codings = codings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        codings = self._codings.decode("latin-1")
        response = error_response(
            400,
            f"Transfer-Encoding '{codings}' is not supported: the last transfer coding of "
            "a request body must be chunked",
        )
        # The body cannot be told from what follows it: nothing more is read as a request.
        response.headers["connection"] = "close"
        await response(scope, receive, send)


def too_many_chunks(scope: object, received: int, limit: int) -> bool:
    """Whether the request's body has come in more than `limit` non-empty chunks, as the
    parser counted them; `received`, the body messages with data, where no parser
    count is at hand (another server)."""
    found = scope.get(CHUNKS_KEY) if isinstance(scope, dict) else None
    count = found.non_empty if isinstance(found, ChunkCount) else received
    return count > limit
