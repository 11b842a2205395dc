"""The one failure classifier of the request path: what a client is told when a request
fails, and the reason statistics count it under (Triton's
`nv_inference_request_failure{reason}`).

Every infer entry point (a client's request, an ensemble step, a decoupled request) ends a
failed request through `failure_of`, so one exception reads the same whichever way it
came in.
"""

from __future__ import annotations

import asyncio

from ..errors import FailureReason, ServerError, execution_failure, request_cancelled


def failure_of(exc: BaseException, executing: bool) -> ServerError:
    """`exc` as the client's error. A ServerError is already classified; a cancellation
    (the client went away, or the generator was closed) is CANCELLED; a ShapeRejected
    (shapes the model cannot run) and a DataRejected (values its runtime refused) are the
    input's fault; anything else is INTERNAL. Either is charged to the backend when it
    came out of an execution (`executing`)."""
    if isinstance(exc, ServerError):
        return exc
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return request_cancelled()
    return execution_failure(exc, FailureReason.BACKEND if executing else FailureReason.OTHER)


def unlinked(error: ServerError, exc: BaseException) -> ServerError:
    """`error` (the client's error for `exc`, or `exc` itself), to be raised without the
    frames `exc` came up through, and with `exc` as its cause.

    Those frames (the scheduler's, the infer path's) hold the request's tensors, and
    the future that the scheduler failed with `exc` holds `exc`: a reference cycle that
    would keep tensors of whatever size the client sent until the collector next ran,
    which a server refusing large requests in a row may not do for many of them. Nothing
    reads the traceback of what leaves here: the front ends answer a ServerError with
    its code and message. The raising frame must also drop its own reference to `error`
    (`finally: del error`), or that frame, in the new traceback, closes the same cycle.
    """
    exc.__traceback__ = None
    error.__traceback__ = None
    if error is not exc:
        error.__cause__ = exc
    return error
