"""Which of onnxruntime's run failures are the request's fault.

A request reaches a session only once its shapes and types fit the model's config, so an
op that fails on the values it holds failed on what this request sent: an index past a
table's end (an op's INVALID_ARGUMENT: Gather, ScatterND; GatherElements' "out of
range"), a string its graph casts to a number that is not one (Cast's RUNTIME_EXCEPTION
"stoll"), an integer divided by zero. Those are answered as invalid input (HTTP 400,
gRPC INVALID_ARGUMENT) with the op and onnxruntime's reason. Triton's onnxruntime
backend answers every one of them INTERNAL (HTTP 500), which tells a client that sent a
bad token id that the server broke.

Dims an op cannot reshape, broadcast, concatenate or multiply (a kernel's FAIL) are the
request's only where its config lets the client choose a dim (a -1 in `dims`): a model
whose fixed dims fail every request is the model's fault, and stays a 500. (Requests
the batcher merged into a batch the model cannot run are run again one by one first.)

What stays the server's: a failure that names no op (the session's own checks), and one
that ran out of memory, which other requests' load can cause as much as this one's.
"""

from __future__ import annotations

import re

from .base import DataRejected

# onnxruntime's Python exceptions are named after its status codes; the message starts
# with "[ONNXRuntimeError] : <code> : <NAME> : ".
_ORT = "onnxruntime.capi.onnxruntime_pybind11_state"
_REFUSED_BY_OP = ("InvalidArgument", "Fail", "RuntimeException")
# A kernel's FAIL on the values it was given, not on their dims.
_VALUES = re.compile(r"by zero|out of range|out of bounds", re.IGNORECASE)
_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : [A-Z_]+ : ")
_OP = re.compile(
    r"Non-zero status code returned while running (\w+) node\. Name:'([^']*)' Status Message: "
)
# A kernel's own check names its source file, line and function before its reason
# (`concatbase.h:135 PrepareForComputeImpl Non concat axis ...`), and an enforced
# condition its C++ text (`... input_shape_size == requested_shape_size was false. The
# input tensor cannot be reshaped ...`), which say nothing to a client.
_SOURCE = re.compile(
    r"^\S+\.(?:h|cc|cpp):\d+ "
    r"(?:(?:[\w:<>*&]+ )*?[\w:~<>]+\([^)]*\)(?: const)?(?: \[with [^\]]*\])? |\S+ )"
)
_ENFORCED = " was false. "
_MEMORY = ("bfc_arena", "Failed to allocate", "bad_alloc", "bad allocation", "out of memory")
# std::stoll's and std::stod's own messages: Cast from a string read each element so.
_NOT_A_NUMBER = re.compile(r"^sto(?:i|l|ll|ul|ull|f|d|ld)$")


def refused_data(exc: Exception, dims_chosen: bool) -> DataRejected | None:
    """`exc`, raised by a session's run, as the request's fault, or None where it is not
    (or not onnxruntime's). `dims_chosen`: the config lets a client choose some dim."""
    status = type(exc).__name__
    if type(exc).__module__ != _ORT or status not in _REFUSED_BY_OP:
        return None
    text = _PREFIX.sub("", str(exc), count=1)
    # An op inside a subgraph (an If's branch, a Loop's body) fails its parent op with its
    # own message inside: the innermost names the op that refused.
    ops = list(_OP.finditer(text))
    op = ops[-1] if ops else None
    if op is None or any(mark in text for mark in _MEMORY):
        return None
    kind, name = op.group(1), op.group(2)
    reason = _cleaned(text[op.end() :])
    if _NOT_A_NUMBER.match(reason):
        reason = f"a string it reads as a number is not one ({reason})"
    elif status == "RuntimeException" or not (
        status == "InvalidArgument" or _VALUES.search(reason) or dims_chosen
    ):
        # Another exception in a kernel, or a kernel's check of dims the client did not
        # choose.
        return None
    where = f"{kind} node '{name}'" if name else f"{kind} node"
    return DataRejected(f"{where}: {reason}")


def _cleaned(reason: str) -> str:
    """onnxruntime's reason without what says nothing to a client: a status nested in it,
    a kernel's source line and function, an enforced condition's C++ text."""
    while True:
        before = reason
        reason = _PREFIX.sub("", reason.strip(), count=1)
        if _ENFORCED in reason:
            reason = reason.split(_ENFORCED, 1)[1]
        reason = _SOURCE.sub("", reason, count=1)
        if reason == before:
            return reason
