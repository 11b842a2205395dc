"""One error type for the whole core, with protocol-neutral codes.

Each front end maps these codes to its own status codes in one place.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import re
from types import TracebackType

from ge_serve.backends.base import DataRejected, ShapeRejected

log = logging.getLogger(__name__)


class ErrorCode(enum.Enum):
    INVALID_ARG = "INVALID_ARG"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    INTERNAL = "INTERNAL"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    # Only a model gives it (a Python model's TritonError.UNKNOWN); Triton answers it
    # gRPC UNKNOWN and HTTP 400.
    UNKNOWN = "UNKNOWN"


class FailureReason(enum.Enum):
    """Why a request failed, as Triton's `nv_inference_request_failure{reason}` says it."""

    REJECTED = "REJECTED"  # timed out in the queue before running
    CANCELED = "CANCELED"
    BACKEND = "BACKEND"  # the model's execution failed
    OTHER = "OTHER"


class ServerError(Exception):
    """An error a client should see, with a code and a message meant for people.

    `reason` tags a failed inference for statistics; left None, statistics classify it.
    """

    def __init__(self, code: ErrorCode, message: str, reason: FailureReason | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason

    def __repr__(self) -> str:
        return f"ServerError({self.code.value}, {self.message!r})"


def invalid_arg(message: str) -> ServerError:
    """The client sent something the server cannot accept: HTTP 400, gRPC INVALID_ARGUMENT."""
    return ServerError(ErrorCode.INVALID_ARG, message)


def internal(
    exc: BaseException, reason: FailureReason | None = None, escaped: bool = False
) -> ServerError:
    """An exception nobody classified, as the INTERNAL error a client sees: its type and
    its text. `escaped`: it got past everything to a front end's last guard, whose
    message says so first ("internal error: "). `reason` tags it for statistics; left
    None, statistics count it against the backend."""
    said = f"{type(exc).__name__}: {exc}"
    return ServerError(ErrorCode.INTERNAL, f"internal error: {said}" if escaped else said, reason)


def execution_failure(exc: BaseException, reason: FailureReason) -> ServerError:
    """An exception that is not a ServerError, out of running a request, as the client's
    error: a ShapeRejected is the input's fault (shapes the model cannot run), and so is a
    DataRejected (values the model's runtime refused, counted under `reason`); anything
    else INTERNAL, counted under `reason`."""
    if isinstance(exc, ShapeRejected):
        return ServerError(ErrorCode.INVALID_ARG, str(exc), FailureReason.OTHER)
    if isinstance(exc, DataRejected):
        return ServerError(ErrorCode.INVALID_ARG, str(exc), reason)
    return internal(exc, reason)


# How much of an unexpected exception's text a client is shown.
_DETAIL_CHARS = 200


def decoding(part: str) -> contextlib.AbstractContextManager[None]:
    """Guard the decoding of one part of a request: `with decoding("inference request"):`.

    A ServerError passes as it is. Any other exception is a gap in a decoder that the
    client's bytes found, so it is the request's failure, not the server's: it becomes
    INVALID_ARG naming `part`, and is logged here, once, with its traceback (a front
    end's own guard logs only what is not a ServerError).
    """
    return _Decoding(part)


class _Decoding:
    __slots__ = ("part",)

    def __init__(self, part: str) -> None:
        self.part = part

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None or isinstance(exc, ServerError) or not isinstance(exc, Exception):
            return
        log.error("unexpected error while decoding the %s", self.part, exc_info=exc)
        detail = str(exc)
        if len(detail) > _DETAIL_CHARS:
            detail = detail[:_DETAIL_CHARS] + "..."
        raise invalid_arg(
            f"failed to decode the {self.part}: {type(exc).__name__}: {detail}",
        ) from exc


def unknown_model(name: str) -> ServerError:
    return ServerError(ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")


def unknown_version(name: str, version: str) -> ServerError:
    """A version that names no version of the model; one that names no version at all
    gets Triton's answer for the string itself (`bad_version_string`)."""
    return bad_version_string(version) or ServerError(
        ErrorCode.NOT_FOUND,
        f"Request for unknown model: '{name}' version {version} is not found",
    )


def bad_version_string(version: str) -> ServerError | None:
    """Triton's answer for a version string that names no version because C's stol
    cannot read it (or it is out of range), or because it is negative; None otherwise."""
    found = re.match(r"[ \t\n\r\f\v]*([+-]?)0*([0-9]{1,20})(?![0-9])", version)
    # (More than 20 significant digits is past int64 anyway, and never goes to int().)
    number = 0 if found is None else int(found.group(2)) * (-1 if found.group(1) == "-" else 1)
    if found is None or not -(2**63) <= number < 2**63:
        return ServerError(
            ErrorCode.INVALID_ARG,
            f"failed to get model version from specified version string '{version}' "
            "(details: stol), version should be an integral value > 0",
        )
    if number < 0:
        return ServerError(
            ErrorCode.INVALID_ARG,
            f"invalid model version specified '{version}' , version should be an integral "
            "value > 0",
        )
    return None


def model_not_ready(name: str, version: str = "") -> ServerError:
    what = f"'{name}'" if not version else f"'{name}' version {version}"
    return ServerError(
        ErrorCode.UNAVAILABLE, f"Request for unknown model: {what} is not at ready state"
    )


def no_available_versions(name: str) -> ServerError:
    """Triton's answer for a model that is known but has nothing loaded (e.g. unloaded)."""
    return ServerError(
        ErrorCode.NOT_FOUND, f"Request for unknown model: '{name}' has no available versions"
    )


class SchedulerClosed(ServerError):
    """A scheduler refused a request because its model version is being retired.

    Raised only for requests that never started; the core retries them on the version
    that replaced it, so a hot swap never fails a request.
    """

    def __init__(self, message: str = "model version is being unloaded") -> None:
        super().__init__(ErrorCode.UNAVAILABLE, message)


def shutting_down() -> ServerError:
    """A request that arrived after the server began to stop: retry it on another server."""
    return ServerError(ErrorCode.UNAVAILABLE, "Server is shutting down")


def cut_off_at_exit() -> ServerError:
    """A request still running when the stopping server's exit timeout ran out: ended by
    the server, so that its client is told rather than left with a cut connection. It may
    have run in part (a stream, some of its responses)."""
    return ServerError(
        ErrorCode.UNAVAILABLE,
        "Server is shutting down: the request did not finish within the exit timeout",
    )


def queue_full() -> ServerError:
    """Untagged: a request its queue refused is not counted as failed (statistics.py)."""
    return ServerError(ErrorCode.UNAVAILABLE, "Exceeds maximum queue size")


def request_timeout() -> ServerError:
    return ServerError(ErrorCode.UNAVAILABLE, "Request timeout expired", FailureReason.REJECTED)


def request_cancelled() -> ServerError:
    return ServerError(ErrorCode.CANCELLED, "request cancelled", FailureReason.CANCELED)
