"""A grpc.aio interceptor that refuses restricted protocols without their header.

Wiring: `grpc.aio.server(interceptors=[RestrictedProtocolInterceptor.from_rules(
settings.grpc_restricted_protocol)], ...)` (only when some rule is given).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio

from ge_serve.server.control.restrictions import (
    GRPC_HEADER_PREFIX,
    RestrictedApis,
    grpc_category,
    grpc_refusal_message,
)


class RestrictedProtocolInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """UNAVAILABLE "This protocol is restricted, expecting header
    'triton-grpc-protocol-<h>'", as Triton answers; streams fail on their first read."""

    def __init__(self, restrictions: RestrictedApis) -> None:
        self.restrictions = restrictions

    @classmethod
    def from_rules(cls, rules: tuple[tuple[str, str, str], ...]) -> RestrictedProtocolInterceptor:
        return cls(RestrictedApis(rules, header_prefix=GRPC_HEADER_PREFIX))

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        details: Any,
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        category = grpc_category(details.method)
        if category not in self.restrictions.rules:
            return handler
        metadata = {key: value for key, value in details.invocation_metadata or ()}
        header = self.restrictions.refusal(category, metadata)
        if header is None:
            return handler
        return _refusing(handler, grpc_refusal_message(header))


def _refusing(handler: Any, message: str) -> Any:
    """A handler of the same shape as `handler` that ends every call with `message`."""

    async def unary(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        yield  # pragma: no cover - abort raises

    codecs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, **codecs)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, **codecs)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming, **codecs)
    return grpc.unary_unary_rpc_method_handler(unary, **codecs)
