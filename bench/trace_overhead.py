"""What tracing costs a request that is not traced: the checks the core and the front ends
make on every request while the trace extension is off (`TraceControl.active`, the trace
the core passes along, and the `trace is None` branches), timed with timeit.

    export PYTHONPATH=$(tools/pyroot.sh)
    python3 bench/trace_overhead.py            # a few seconds

It prints nanoseconds per request for the disabled path, against the same function
without the checks, so the difference is what an untraced request pays (goal < 1 us).
"""

from __future__ import annotations

import timeit

from ge_serve.server.observability.tracing import TraceControl


class _Request:
    traceparent = ""
    id = ""


def _with_checks(control: TraceControl, request: _Request) -> object:
    # core.infer and a front end's handler
    if control.active:
        request.traceparent = "x"
    trace = None
    if control.active:
        trace = control.begin("m", 1, request.id, request.traceparent, 0)
    # core._infer: which submit, and _notify's end of the trace
    if trace is None:
        pass
    if trace is not None:
        trace.end(0)
    return trace


def _without(control: TraceControl, request: _Request) -> object:
    return None


def main(number: int = 2_000_000) -> None:
    control = TraceControl()
    request = _Request()
    checked = min(timeit.repeat(lambda: _with_checks(control, request), number=number, repeat=5))
    bare = min(timeit.repeat(lambda: _without(control, request), number=number, repeat=5))
    per = (checked - bare) / number * 1e9
    print(f"disabled path {checked / number * 1e9:.1f} ns, bare call {bare / number * 1e9:.1f} ns")
    print(f"untraced request extra: {per:.1f} ns")


if __name__ == "__main__":
    main()
