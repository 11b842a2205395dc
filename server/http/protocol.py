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
"""

from __future__ import annotations

from typing import Final

from .bounded import BoundedHttpToolsProtocol

# The scope key of a request's ChunkCount.
CHUNKS_KEY: Final = "ge_serve.chunks"


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
        # Both flags: a call sets every leniency it names, and uvicorn's own is kept.
        self.parser.set_dangerous_leniencies(
            lenient_data_after_close=True, lenient_chunked_length=True
        )

    def on_headers_complete(self) -> None:
        self._chunks = ChunkCount()
        self.scope[CHUNKS_KEY] = self._chunks  # type: ignore[typeddict-unknown-key]
        # Most requests have no Transfer-Encoding: one pass finds that out.
        both = False
        for name, _ in self.headers:
            if name == b"transfer-encoding":
                both = any(other == b"content-length" for other, _ in self.headers)
                break
        super().on_headers_complete()
        if both and self.cycle:
            self.cycle.keep_alive = False

    def on_chunk_header(self) -> None:
        self._chunks.headers += 1


def too_many_chunks(scope: object, received: int, limit: int) -> bool:
    """Whether the request's body has come in more than `limit` non-empty chunks, as the
    parser counted them; `received`, the body messages with data, where no parser
    count is at hand (another server)."""
    found = scope.get(CHUNKS_KEY) if isinstance(scope, dict) else None
    count = found.non_empty if isinstance(found, ChunkCount) else received
    return count > limit
