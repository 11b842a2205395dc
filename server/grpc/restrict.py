"""`--grpc-restricted-protocol`: RPC groups that answer only when the client sends a header.

Triton's groups: each RPC belongs to one category; a category may be restricted to
requests carrying `<key>: <value>` metadata. A request without it is refused UNAVAILABLE with
"This protocol is restricted, expecting header '<key>'". Reflection is never restricted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import grpc
import grpc.aio

from ..errors import ErrorCode, ServerError

_SERVICE: Final = "/inference.GRPCInferenceService/"
_HEALTH: Final = "/grpc.health.v1.Health/"

CATEGORIES: Final[dict[str, tuple[str, ...]]] = {
    "health": (
        _SERVICE + "ServerLive",
        _SERVICE + "ServerReady",
        _SERVICE + "ModelReady",
        _HEALTH + "Check",
        _HEALTH + "Watch",
    ),
    "metadata": (_SERVICE + "ServerMetadata", _SERVICE + "ModelMetadata"),
    "inference": (_SERVICE + "ModelInfer", _SERVICE + "ModelStreamInfer"),
    "shared-memory": tuple(
        f"{_SERVICE}{kind}SharedMemory{call}"
        for kind in ("System", "Cuda")
        for call in ("Status", "Register", "Unregister")
    ),
    "model-config": (_SERVICE + "ModelConfig",),
    "model-repository": (
        _SERVICE + "RepositoryIndex",
        _SERVICE + "RepositoryModelLoad",
        _SERVICE + "RepositoryModelUnload",
    ),
    "statistics": (_SERVICE + "ModelStatistics",),
    "trace": (_SERVICE + "TraceSetting",),
    "logging": (_SERVICE + "LogSettings",),
}
_STREAMING_REQUESTS: Final = frozenset({_SERVICE + "ModelStreamInfer"})
_STREAMING_RESPONSES: Final = frozenset({_SERVICE + "ModelStreamInfer", _HEALTH + "Watch"})


def method_rules(restrictions: Iterable[tuple[str, str, str]]) -> dict[str, tuple[str, str]]:
    """(category, header, value) triples as {full method name: (header, value)}.

    An unknown category, or one named in two groups, is a ServerError, as in Triton.
    """
    by_category: dict[str, tuple[str, str]] = {}
    for category, header, value in restrictions:
        if category not in CATEGORIES:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"unknown restricted protocol '{category}' in --grpc-restricted-protocol; "
                f"expected one of {', '.join(CATEGORIES)}",
            )
        if category in by_category:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"protocol '{category}' can not be specified in multiple config groups",
            )
        by_category[category] = (header.lower(), value)
    return {
        method: rule for category, rule in by_category.items() for method in CATEGORIES[category]
    }


class RestrictedProtocols(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, rules: dict[str, tuple[str, str]]) -> None:
        self._rules = rules

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        method = handler_call_details.method
        rule = self._rules.get(method)
        if rule is not None:
            header, value = rule
            for key, given in handler_call_details.invocation_metadata or ():
                if key == header and given == value:
                    break
            else:
                return _refusal(method, header)
        return await continuation(handler_call_details)


def _refusal(method: str, header: str) -> Any:
    message = f"This protocol is restricted, expecting header '{header}'"

    async def refuse(request: Any, context: Any) -> None:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)

    async def refuse_stream(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNAVAILABLE, message)
        yield  # pragma: no cover  (an async generator, as a streaming handler must be)

    if method in _STREAMING_REQUESTS:
        return grpc.stream_stream_rpc_method_handler(refuse_stream)
    if method in _STREAMING_RESPONSES:
        return grpc.unary_stream_rpc_method_handler(refuse_stream)
    return grpc.unary_unary_rpc_method_handler(refuse)
