"""`triton_python_backend_utils` (5/5): `Logger`, and custom metrics (`MetricFamily`,
`Metric`).

Log lines go to the server's log, under the model's name. Metrics live in the server, so
that every instance of a model (each its own process) adds to the same series, and
/metrics shows them: creating a family or a metric asks the server and waits, updates are
sent without waiting, and `value()` asks again (after every update sent before it).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import os
import weakref

from ..messages import Log, MetricDelete, MetricUpdate
from .pb_types import TritonModelException
from .runtime import current


class Logger:
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3

    @staticmethod
    def log(message: str, level: int = INFO) -> None:
        if not isinstance(message, str) or not isinstance(level, int):
            # Triton's binding: a str and a LogLevel (pybind11's TypeError otherwise).
            raise TypeError(
                "log(): incompatible function arguments: takes (message: str, level: int), "
                f"got ({type(message)}, {type(level)})"
            )
        current().send(Log(int(level), message, _caller()))

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, Logger.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, Logger.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, Logger.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, Logger.VERBOSE)


def _caller() -> str:
    """`file:line` of the model code that logged (the first frame outside this module)."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    if frame is None:
        return ""
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


class MetricFamily:
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise TritonModelException(
                "the kind of a MetricFamily must be COUNTER, GAUGE or HISTOGRAM"
            )
        try:
            self._id = int(current().request("metric_family", str(name), str(description), kind))
        except RuntimeError as exc:
            raise TritonModelException(str(exc)) from None
        self.name = str(name)
        self.kind = kind

    def Metric(
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        return Metric(self, labels or {}, buckets)


class Metric:
    def __init__(
        self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None
    ) -> None:
        if family.kind == MetricFamily.HISTOGRAM:
            if buckets is None:
                raise TritonModelException("a histogram metric needs its buckets")
            bounds = [float(b) for b in buckets]  # none at all: only +Inf, as in Triton
            if any(low >= high for low, high in itertools.pairwise(bounds)):
                raise TritonModelException("histogram buckets must be in strictly increasing order")
        elif buckets is not None:
            raise TritonModelException("only a histogram metric takes buckets")
        else:
            bounds = []
        pairs = [(str(k), str(v)) for k, v in labels.items()]
        try:
            self._id = int(current().request("metric", family._id, pairs, bounds))
        except RuntimeError as exc:
            raise TritonModelException(str(exc)) from None
        self._kind = family.kind
        # Triton's Metric refuses every operation once its MetricFamily object is gone.
        self._family = weakref.ref(family)

    def _check_family(self) -> None:
        if self._family() is None:
            raise TritonModelException(
                "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
            )

    def increment(self, value: float) -> None:
        self._check_family()
        if self._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("a histogram metric is observed, not incremented")
        if self._kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("a counter cannot be incremented by a negative value")
        current().send(MetricUpdate(self._id, "increment", float(value)))

    def set(self, value: float) -> None:
        self._check_family()
        if self._kind != MetricFamily.GAUGE:
            raise TritonModelException("only a gauge metric can be set")
        current().send(MetricUpdate(self._id, "set", float(value)))

    def observe(self, value: float) -> None:
        self._check_family()
        if self._kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("only a histogram metric can be observed")
        current().send(MetricUpdate(self._id, "observe", float(value)))

    def value(self) -> float:
        self._check_family()
        if self._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("a histogram metric has no single value")
        return float(current().request("metric_value", self._id))

    def __del__(self) -> None:
        # When the worker is going away this may fail: the server drops its metrics anyway.
        with contextlib.suppress(Exception):
            current().send(MetricDelete(self._id))
