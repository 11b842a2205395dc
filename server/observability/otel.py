"""OpenTelemetry mode: traces become spans exported over OTLP/HTTP by the OpenTelemetry
SDK's batch span processor (`--trace-config opentelemetry,url=...`, `resource=`, `bsp_*`).

The exporter is the standard OTLP/HTTP one with protobuf encoding
(`opentelemetry-exporter-otlp-proto-http`), which every OTLP collector accepts.

Each traced request is a top-level `InferRequest` span with a span for its model inside,
and a `compute` span inside that; an ensemble step's model span sits inside the ensemble's
model span. A client's W3C `traceparent` makes the top-level span its child. Timestamps
are events on the spans, at wall-clock times (the steady clock moved to the epoch); the
front end's (HTTP_*, GRPC_*, INFER_RESPONSE_COMPLETE) are on the top-level span, as in
Triton, which ends with the last of them.
"""

from __future__ import annotations

import time
from typing import Any

from .traceconfig import OtelSettings
from .tracing import Trace, front_end_mark


class OtelSink:
    def __init__(self, settings: OtelSettings) -> None:
        # Imported here: only a server in OpenTelemetry mode needs the SDK.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._provider = TracerProvider(resource=Resource.create(dict(settings.resource)))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=settings.url),
                max_queue_size=settings.bsp_max_queue_size,
                schedule_delay_millis=settings.bsp_schedule_delay_ms,
                max_export_batch_size=settings.bsp_max_export_batch_size,
            )
        )
        self._tracer = self._provider.get_tracer("ge-serve")
        self._propagator = TraceContextTextMapPropagator()
        self._offset = time.time_ns() - time.monotonic_ns()

    def _wall(self, ns: int) -> int:
        return ns + self._offset

    def started(self, trace: Trace) -> None:
        from opentelemetry import trace as otel_trace

        first = self._wall(trace.marks[0][1])
        start = self._wall(dict(trace.marks)["REQUEST_START"])
        if trace.parent is not None and trace.parent.spans is not None:
            context = otel_trace.set_span_in_context(trace.parent.spans[1])
            root = None
        else:
            carrier = {"traceparent": trace.traceparent} if trace.traceparent else {}
            parent = self._propagator.extract(carrier)
            root = self._tracer.start_span("InferRequest", context=parent, start_time=first)
            context = otel_trace.set_span_in_context(root)
        model = self._tracer.start_span(trace.model_name, context=context, start_time=start)
        model.set_attribute("triton.model_name", trace.model_name)
        model.set_attribute("triton.model_version", trace.model_version)
        model.set_attribute("triton.trace_id", trace.id)
        model.set_attribute("triton.trace_parent_id", trace.parent_id)
        if trace.request_id:
            model.set_attribute("triton.request_id", trace.request_id)
        trace.spans = (root, model)

    def finished(self, trace: Trace) -> None:
        from opentelemetry import trace as otel_trace

        if trace.spans is None:
            return
        root, model = trace.spans
        marks = dict(trace.marks)
        for name, ns in trace.marks:
            if front_end_mark(name):
                if root is not None:
                    root.add_event(name, timestamp=self._wall(ns))
            elif not name.startswith("COMPUTE_"):
                model.add_event(name, timestamp=self._wall(ns))
        if "COMPUTE_START" in marks:
            compute = self._tracer.start_span(
                "compute",
                context=otel_trace.set_span_in_context(model),
                start_time=self._wall(marks["COMPUTE_START"]),
            )
            for name, ns in trace.marks:
                if name.startswith("COMPUTE_"):
                    compute.add_event(name, timestamp=self._wall(ns))
            compute.end(end_time=self._wall(marks["COMPUTE_END"]))
        end = self._wall(marks["REQUEST_END"])
        model.end(end_time=end)
        if root is not None:
            root.end(end_time=max(end, self._wall(max(ns for _, ns in trace.marks))))

    def close(self) -> None:
        self._provider.shutdown()


def make_sink(control: Any) -> Any:
    """The sink for the control's startup mode."""
    from .traceconfig import OPENTELEMETRY
    from .tracefile import TraceFileSink

    if control.startup.mode == OPENTELEMETRY:
        return OtelSink(control.startup.otel)
    return TraceFileSink(control)
