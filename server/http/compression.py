"""HTTP body compression: request `Content-Encoding` and response `Accept-Encoding`.

Pure functions over bytes. Decoding is streamed with a cap, so a small compressed body
cannot expand into an unbounded one.
"""

from __future__ import annotations

import functools
import zlib
from typing import Final

from ..errors import ServerError, invalid_arg
from ..inference import error_texts
from .errors import TooLarge

GZIP: Final = "gzip"
DEFLATE: Final = "deflate"
IDENTITY: Final = "identity"

_GZIP_WBITS: Final = 16 + zlib.MAX_WBITS
_ZLIB_WBITS: Final = zlib.MAX_WBITS
_RAW_DEFLATE_WBITS: Final = -zlib.MAX_WBITS
# zlib's default: a fair trade of speed for size; tensor data rarely shrinks much more.
_LEVEL: Final = 6
# Compressed bytes fed to zlib at a time: at first, and at most.
_FIRST_FEED_BYTES: Final = 1 << 12
_FEED_BYTES: Final = 1 << 16
# gzip members one body may hold: concatenated streams (bgzip's 64 KiB blocks) stay far
# below it; a body of thousands of empty members is an attack, not a tensor.
MAX_GZIP_MEMBERS: Final = 4096
# Bodies larger than this are compressed and decompressed off the event loop (zlib lets
# go of the GIL), so one large body does not stall every other request.
OFF_LOOP_BYTES: Final = 64 << 10


def decode_content(body: bytes, content_encoding: str | None, max_size: int) -> bytes:
    """Decode a request body by its `Content-Encoding`; the result never exceeds `max_size`.

    gzip (also `x-gzip`) and deflate (zlib-wrapped, or raw deflate) are decoded; None, ""
    and `identity` pass through. Anything else, corrupt data or a result over `max_size`
    is INVALID_ARG.
    """
    # None (the usual case) and "" are identity, without a name to normalise.
    encoding = content_encoding.strip().lower() if content_encoding else IDENTITY
    if encoding == IDENTITY:
        if len(body) > max_size:
            raise _too_large(max_size)
        return body
    if encoding in (GZIP, "x-gzip"):
        return _inflate(body, _GZIP_WBITS, max_size)
    if encoding == DEFLATE:
        return _inflate(
            body, _ZLIB_WBITS if _has_zlib_header(body) else _RAW_DEFLATE_WBITS, max_size
        )
    raise invalid_arg(f"unsupported Content-Encoding '{content_encoding}'")


def _has_zlib_header(data: bytes) -> bool:
    # RFC 1950: CM = 8 (deflate) in the low nibble of CMF, and CMF*256 + FLG divisible by 31.
    return len(data) >= 2 and data[0] & 0x0F == 8 and ((data[0] << 8) | data[1]) % 31 == 0


def _too_large(max_size: int) -> ServerError:
    return TooLarge(error_texts.decompressed_too_large(max_size).message, max_size)


def _inflate(data: bytes, wbits: int, max_size: int) -> bytes:
    """Inflate in slices of the body, so that what is left after a gzip member is never
    copied whole: with a copy per member, a body of many empty members took time in the
    square of its size (1.6 MB of 82,000 members: 3.3 s). Now a member costs at most its
    own bytes and one small slice."""
    if not data:
        return b""
    view = memoryview(data)
    out: list[bytes] = []
    total = 0
    offset = 0
    members = 0
    try:
        while True:
            members += 1
            if members > MAX_GZIP_MEMBERS:
                raise invalid_arg(
                    f"failed to decompress request body: more than {MAX_GZIP_MEMBERS} gzip members"
                )
            stream = zlib.decompressobj(wbits)
            # Small at a member's start, since zlib copies what it is given past the
            # member's end; doubling, so that one large member takes few calls.
            feed = _FIRST_FEED_BYTES
            while not stream.eof:
                piece: bytes | memoryview = stream.unconsumed_tail
                if not piece:
                    if offset >= len(view):
                        raise invalid_arg("failed to decompress request body: truncated stream")
                    piece = view[offset : offset + feed]
                    offset += len(piece)
                    feed = min(2 * feed, _FEED_BYTES)
                # Ask for one byte past the cap, so reaching it proves the body too large.
                chunk = stream.decompress(piece, max_size - total + 1)
                total += len(chunk)
                if total > max_size:
                    raise _too_large(max_size)
                out.append(chunk)
            # What the member's last slice held past its end is the next one's start.
            offset -= len(stream.unused_data) + len(stream.unconsumed_tail)
            if offset >= len(view):
                break
            # gzip allows several members back to back, and trailing zero padding (no
            # member starts with a zero byte); anything else after the end is corrupt.
            if view[offset] == 0 and not bytes(view[offset:]).strip(b"\x00"):
                break
            if wbits != _GZIP_WBITS:
                raise invalid_arg("failed to decompress request body: data after its end")
    except zlib.error as e:
        raise invalid_arg(f"failed to decompress request body: {e}") from None
    return b"".join(out)


# A client sends the same `Accept-Encoding` on every request (http.client: "identity"),
# so each value is weighed once; the bound keeps a client that varies it to a few entries.
@functools.lru_cache(maxsize=64)
def choose_encoding(accept_encoding: str | None) -> str | None:
    """Pick the response encoding from `Accept-Encoding`: "gzip", "deflate" or None.

    Honours q-weights and `*`. The best of gzip and deflate wins (gzip on a tie) unless it
    has q=0 or identity is listed with a strictly higher q; None means send the body as is.
    """
    if not accept_encoding:
        return None
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        token, _, params = item.partition(";")
        coding = token.strip().lower()
        if not coding:
            continue
        q = _q_value(params)
        if q is None:
            continue
        if coding == "x-gzip":
            coding = GZIP
        weights[coding] = max(q, weights.get(coding, 0.0))
    star = weights.get("*")
    gzip_q = weights.get(GZIP, star or 0.0)
    deflate_q = weights.get(DEFLATE, star or 0.0)
    # identity is always acceptable (RFC 9110), but it only competes on weight when listed,
    # itself or through `*`; plain `gzip;q=0.5` still asks for gzip.
    identity_q = weights.get(IDENTITY, star or 0.0)
    best, best_q = (GZIP, gzip_q) if gzip_q >= deflate_q else (DEFLATE, deflate_q)
    if best_q > 0.0 and best_q >= identity_q:
        return best
    return None


def _q_value(params: str) -> float | None:
    """The q-weight in `;q=0.5`-style parameters: 1.0 when absent, None when malformed."""
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return None
            return q if 0.0 <= q <= 1.0 else None
    return 1.0


def encode_content(body: bytes, encoding: str | None) -> bytes:
    """Compress a response body for `encoding` ("gzip", "deflate", or None/"identity")."""
    if encoding is None or encoding == IDENTITY:
        return body
    if encoding == GZIP:
        # zlib's gzip wrapper writes mtime 0, so equal bodies compress to equal bytes.
        compressor = zlib.compressobj(_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
        return compressor.compress(body) + compressor.flush()
    if encoding == DEFLATE:
        # HTTP "deflate" is the zlib format (RFC 9110), which is what clients decode.
        return zlib.compress(body, _LEVEL)
    raise ValueError(f"unknown content encoding {encoding!r}")
