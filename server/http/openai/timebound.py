"""A request's own chat template (--trust-request-chat-template), rendered within a time.

Such a template is the client's code, which the sandbox (sandbox.py) keeps from the
server's objects but not from looping for as long as it likes. `time_bounded` runs its
render on a worker thread (catalog.py keeps two for it) under a trace function of that
thread alone, which checks at each line the template's code runs (and costs that
template alone), and stops it past its time or once its client has gone: a stuck thread
could not be stopped otherwise, and would hold the interpreter for as long as it ran.
vLLM answers at its timeout and abandons the thread, which runs on.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, Final, TypeVar

from .errors import OpenAIError

# vLLM's VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT default.
REQUEST_TEMPLATE_SECONDS: Final = 30.0
T = TypeVar("T")


class Stopped(BaseException):
    """A render stopped (`time_bounded`): no Exception, so that what the template's code
    catches (Jinja2's `is` tests catch Exception) lets it through."""


def time_bounded(
    work: Callable[[], T],
    seconds: float = REQUEST_TEMPLATE_SECONDS,
    stop: threading.Event | None = None,
) -> T:
    """`work()` (the rendering of a request's own template, on a worker thread), stopped
    once it has run `seconds`, or once `stop` is set (its client gone): such a template is
    the client's code, which the sandbox keeps from the server's objects but not from
    looping for as long as it likes. A trace function on this thread alone checks at each
    line the template's code runs (and costs that template alone); a stuck thread could
    not be stopped otherwise, and would hold the interpreter for as long as it ran."""
    deadline = time.monotonic() + seconds

    def check(frame: FrameType, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline or (stop is not None and stop.is_set()):
            raise Stopped
        return check

    previous = sys.gettrace()
    sys.settrace(check)
    try:
        return work()
    except Stopped:
        raise OpenAIError(
            f"The request's chat template took more than {seconds:g} s to render",
            param="chat_template",
        ) from None
    finally:
        sys.settrace(previous)
