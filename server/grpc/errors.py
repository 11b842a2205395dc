"""The one place where core error codes become gRPC status codes."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio

from ge_serve.server.errors import ErrorCode, ServerError, internal

log = logging.getLogger(__name__)

STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
}


def status_of(exc: ServerError) -> grpc.StatusCode:
    return STATUS.get(exc.code, grpc.StatusCode.INVALID_ARGUMENT)


def as_server_error(exc: BaseException) -> ServerError:
    """A core error as it is; anything else is an INTERNAL error that names its type."""
    if isinstance(exc, ServerError):
        return exc
    return internal(exc, escaped=True)


def fail(context: Any, exc: ServerError) -> None:
    """Set the RPC's final status to the one for `exc`; the handler then returns nothing.

    Unary handlers end this way rather than with `context.abort`: abort raises, and every
    aborted call left an exception, its traceback and the call's context in a reference
    cycle with grpc's call state, so the server's memory grew with each refused request
    until a full collection. grpc discards the returned message of a non-OK status.
    """
    context.set_code(status_of(exc))
    context.set_details(exc.message)


async def abort(context: Any, exc: ServerError) -> NoReturn:
    """End the RPC with the status for `exc`; `context.abort` raises, so this never returns."""
    await context.abort(status_of(exc), exc.message)
    raise AssertionError("grpc context.abort returned")  # pragma: no cover


S = TypeVar("S")
Req = TypeVar("Req")
Resp = TypeVar("Resp")

Handler = Callable[[S, Req, Any], Awaitable[Resp]]


class Undecodable:
    """Stands for a request message whose bytes protobuf could not parse.

    The service's deserializers return it instead of raising, since grpc would end the
    call UNKNOWN; the handler's guard (or the stream) answers it INVALID_ARGUMENT.
    """

    __slots__ = ("error",)

    def __init__(self, message: str, detail: str) -> None:
        self.error = ServerError(
            ErrorCode.INVALID_ARG, f"failed to decode the {message} message: {detail}"
        )


def guard(handler: Handler[S, Req, Resp]) -> Handler[S, Req, Resp | None]:
    """Wrap a unary handler: a ServerError ends the RPC with its mapped status and message
    (see `fail`); an unexpected exception is logged and ends it INTERNAL, never as an
    opaque UNKNOWN.

    Handlers decode request parts under `decoding(...)`, so an unexpected exception there
    is already the client's INVALID_ARGUMENT when it gets here.
    """

    @functools.wraps(handler)
    async def guarded(self: S, request: Req, context: Any) -> Resp | None:
        if isinstance(request, Undecodable):
            fail(context, request.error)
            return None
        try:
            return await handler(self, request, context)
        except ServerError as exc:
            error = exc
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            log.exception("unhandled error in %s", handler.__name__)
            error = as_server_error(exc)
        try:
            if error.code is ErrorCode.UNAVAILABLE:
                # UNAVAILABLE says "send it again" (stopping, queue full): it must end the
                # call with trailers only, as abort does, or grpc counts the call as
                # answered and a client's retry policy never retries it. set_code + return
                # sends headers first. These refusals are the rare ones; abort's garbage is
                # the price.
                await abort(context, error)
            fail(context, error)
        finally:
            # The error's traceback holds this frame, and this frame the error and the
            # request: a cycle that would keep a refused request's tensors (any size the
            # client sent) until the collector next ran, which an idle server, or one
            # refused large requests in a row, may not do for many of them.
            del error
        return None

    return guarded
