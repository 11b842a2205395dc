"""A unary gRPC handler's guard answers a refused request and lets it go at once: the
request (whatever size of tensors the client sent) must not wait for the collector."""

from __future__ import annotations

import gc
import logging
import weakref
from typing import Any

import grpc
import pytest

from ge_serve.server.errors import invalid_arg
from ge_serve.server.grpc.errors import guard


class Message:
    """Stands for a request message (protobuf's take no weak reference)."""

    def __init__(self) -> None:
        self.payload = bytearray(16)


class Context:
    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


async def refuse(service: Any, request: Message, context: Any) -> None:
    tensor = request.payload  # a frame local, as a decoder's tensors are
    raise invalid_arg(f"cannot take {len(tensor)} bytes")


async def crash(service: Any, request: Message, context: Any) -> None:
    tensor = request.payload
    raise RuntimeError(f"a bug, with {len(tensor)} bytes at hand")


@pytest.mark.parametrize(
    ("handler", "code", "details"),
    [
        (refuse, grpc.StatusCode.INVALID_ARGUMENT, "cannot take 16 bytes"),
        (
            crash,
            grpc.StatusCode.INTERNAL,
            "internal error: RuntimeError: a bug, with 16 bytes at hand",
        ),
    ],
)
async def test_a_refused_request_is_freed_without_a_collection(
    handler: Any, code: grpc.StatusCode, details: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pytest's log capture keeps each record, and a logged exception's traceback holds
    # the request; a server's handlers write the record and let it go.
    monkeypatch.setattr(logging.getLogger("ge_serve.server.grpc.errors"), "propagate", False)
    guarded = guard(handler)
    context = Context()
    request = Message()
    freed = weakref.ref(request)
    gc.disable()
    try:
        assert await guarded(None, request, context) is None
        del request
        assert freed() is None
    finally:
        gc.enable()
    assert (context.code, context.details) == (code, details)
