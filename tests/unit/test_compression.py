"""HTTP body compression: Content-Encoding decoding with a cap, Accept-Encoding selection."""

from __future__ import annotations

import gzip
import tracemalloc
import zlib

import numpy as np
import pytest
import tritonclient.http as triton_http

from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.http.codec import encode_infer_response
from ge_serve.server.http.compression import (
    _FIRST_FEED_BYTES,
    MAX_GZIP_MEMBERS,
    choose_encoding,
    decode_content,
    encode_content,
)
from ge_serve.server.inference.types import DataType, InferRequest, InferResponse, Tensor

BODY = b'{"inputs": []}' + bytes(range(256)) * 64
MAX = 1 << 20


def _raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


def _invalid(body: bytes, encoding: str | None, max_size: int = MAX) -> str:
    with pytest.raises(ServerError) as info:
        decode_content(body, encoding, max_size)
    assert info.value.code is ErrorCode.INVALID_ARG
    return info.value.message


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_round_trip(encoding: str) -> None:
    encoded = encode_content(BODY, encoding)
    assert encoded != BODY and len(encoded) < len(BODY)
    assert decode_content(encoded, encoding, MAX) == BODY


@pytest.mark.parametrize(
    ("encoded", "encoding"),
    [
        (gzip.compress(BODY), "gzip"),
        (gzip.compress(BODY), "x-gzip"),
        (gzip.compress(BODY), " GZip "),
        (zlib.compress(BODY), "deflate"),
        (_raw_deflate(BODY), "deflate"),
        (gzip.compress(BODY[:100]) + gzip.compress(BODY[100:]), "gzip"),
        (gzip.compress(BODY) + b"\0\0\0\0", "gzip"),
        (BODY, None),
        (BODY, ""),
        (BODY, "identity"),
    ],
    ids=[
        "gzip",
        "x-gzip",
        "case and spaces",
        "zlib deflate",
        "raw deflate",
        "gzip members",
        "gzip zero padding",
        "none",
        "empty",
        "identity",
    ],
)
def test_decode(encoded: bytes, encoding: str | None) -> None:
    assert decode_content(encoded, encoding, MAX) == BODY


def test_encode_is_standard_and_deterministic() -> None:
    assert gzip.decompress(encode_content(BODY, "gzip")) == BODY
    assert zlib.decompress(encode_content(BODY, "deflate")) == BODY
    assert encode_content(BODY, "gzip") == encode_content(BODY, "gzip")
    assert encode_content(BODY, None) is BODY
    assert encode_content(BODY, "identity") is BODY
    with pytest.raises(ValueError, match="br"):
        encode_content(BODY, "br")


def test_empty_compressed_body() -> None:
    assert decode_content(b"", "gzip", MAX) == b""
    assert decode_content(gzip.compress(b""), "gzip", MAX) == b""


def test_unsupported_encoding() -> None:
    assert _invalid(BODY, "br") == "unsupported Content-Encoding 'br'"


@pytest.mark.parametrize(
    ("encoded", "encoding", "message"),
    [
        (b"definitely not gzip", "gzip", "failed to decompress request body: "),
        (zlib.compress(BODY), "gzip", "failed to decompress request body: "),
        (b"\x78\x9c" + b"\xff" * 20, "deflate", "failed to decompress request body: "),
        (gzip.compress(BODY)[:-20], "gzip", "failed to decompress request body: truncated"),
        (zlib.compress(BODY)[:40], "deflate", "failed to decompress request body: truncated"),
        (gzip.compress(BODY) + b"junk", "gzip", "failed to decompress request body: "),
        (zlib.compress(BODY) + b"junk", "deflate", "failed to decompress request body: data"),
        (_raw_deflate(BODY) + b"junk", "deflate", "failed to decompress request body: data"),
        (
            gzip.compress(b"") * (MAX_GZIP_MEMBERS + 1),
            "gzip",
            f"failed to decompress request body: more than {MAX_GZIP_MEMBERS} gzip members",
        ),
    ],
    ids=[
        "garbage",
        "zlib as gzip",
        "corrupt deflate",
        "truncated gzip",
        "truncated deflate",
        "junk",
        "junk after zlib",
        "junk after raw deflate",
        "too many members",
    ],
)
def test_corrupt(encoded: bytes, encoding: str, message: str) -> None:
    assert _invalid(encoded, encoding).startswith(message)


def test_gzip_members_and_zero_padding_decode_in_order() -> None:
    parts = [BODY[:100], b"", BODY[100:3000], BODY[3000:]]
    body = b"".join(gzip.compress(p) for p in parts) + bytes(300)
    assert decode_content(body, "gzip", MAX) == BODY
    big = bytes(range(256)) * 4096  # 1 MiB: slices end inside members
    members = b"".join(gzip.compress(big[i : i + 70_000]) for i in range(0, len(big), 70_000))
    assert decode_content(members, "gzip", 2 * MAX) == big


def test_a_gzip_member_costs_its_own_bytes_not_the_rest_of_the_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each member's rest was copied whole: 82,000 empty members in 1.6 MB took 3.3 s, in
    # the square of the size. Counted in bytes given to zlib, not timed.
    real = zlib.decompressobj
    fed = [0]

    class Counting:
        def __init__(self, wbits: int) -> None:
            self._stream = real(wbits)

        def decompress(self, data: bytes, max_length: int = 0) -> bytes:
            fed[0] += len(data)
            return self._stream.decompress(data, max_length)

        def __getattr__(self, name: str) -> object:
            return getattr(self._stream, name)

    monkeypatch.setattr(zlib, "decompressobj", Counting)
    last = np.random.default_rng(0).bytes(1 << 20)  # incompressible: 1 MiB compressed too
    body = gzip.compress(b"") * (MAX_GZIP_MEMBERS - 1) + gzip.compress(last)
    assert decode_content(body, "gzip", 2 * MAX) == last
    assert fed[0] < 2 * len(body) + MAX_GZIP_MEMBERS * 2 * _FIRST_FEED_BYTES


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_decompression_bomb_is_capped(encoding: str) -> None:
    bomb = encode_content(bytes(64 << 20), encoding)
    assert len(bomb) < 128 << 10
    tracemalloc.start()
    try:
        message = _invalid(bomb, encoding, max_size=MAX)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert message == (
        f"Decompressed data size exceeds the maximum allowed value of {MAX} bytes. Use "
        "--http-max-input-size to increase the limit."
    )
    # Streamed: it stops near the cap instead of inflating all 64 MiB first.
    assert peak < 8 * MAX


@pytest.mark.parametrize("encoding", ["gzip", "deflate", None])
def test_cap_is_exact(encoding: str | None) -> None:
    encoded = encode_content(BODY, encoding)
    assert decode_content(encoded, encoding, len(BODY)) == BODY
    assert "exceeds the maximum allowed value" in _invalid(
        encoded, encoding, max_size=len(BODY) - 1
    )


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("", None),
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("GZIP", "gzip"),
        ("x-gzip", "gzip"),
        ("br", None),
        ("identity", None),
        ("deflate, gzip", "gzip"),
        ("gzip, deflate", "gzip"),
        ("gzip;q=0.5, deflate;q=0.9", "deflate"),
        ("gzip;q=0.9, deflate;q=0.5", "gzip"),
        ("gzip; q=0.5, deflate; q=0.5", "gzip"),
        ("gzip;q=0", None),
        ("gzip;q=0, deflate", "deflate"),
        ("*", "gzip"),
        ("*;q=0.3, deflate;q=0.5", "deflate"),
        ("*;q=0.8, gzip;q=0", "deflate"),
        ("*;q=0", None),
        ("gzip;q=0.5, identity", None),
        ("gzip;q=0.5, identity;q=0.5", "gzip"),
        ("gzip;q=0.5, identity;q=0", "gzip"),
        ("gzip;q=bogus, deflate;q=0.1", "deflate"),
        ("gzip;q=2", None),
        ("br;q=1.0, gzip;q=0.8, *;q=0.1", "gzip"),
        (" , gzip ;q=1", "gzip"),
    ],
)
def test_choose_encoding(header: str | None, expected: str | None) -> None:
    assert choose_encoding(header) == expected


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_tritonclient_reads_compressed_responses(encoding: str) -> None:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    response = InferResponse(
        "m", "1", outputs=[Tensor("y", DataType.FP32, (3, 4), arr)], id="compressed"
    )
    body, length = encode_infer_response(
        response, InferRequest("m", wire={"binary_data_output": True})
    )
    result = triton_http.InferResult.from_response_body(
        encode_content(body, encoding), header_length=length, content_encoding=encoding
    )
    got = result.as_numpy("y")
    assert got is not None and got.tobytes() == arr.tobytes()
