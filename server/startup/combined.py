"""Flags that contradict each other, and values of the flags that do nothing here that
Triton refuses: usage errors, as Triton's command line makes them, checked once the
whole command line is read (server/cli.py)."""

from __future__ import annotations

from .cloudflags import Endpoint, check_ports
from .settings import Settings
from .tritonflags import check_values


def check_combined(settings: Settings) -> None:
    """ValueError, with a message for people, for settings that contradict each other or
    a value Triton refuses (tritonflags.py)."""
    check_values(settings.inapplicable)
    if settings.load_models and settings.model_control_mode != "explicit":
        raise ValueError(
            "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
        )
    endpoints: list[Endpoint] = []
    if settings.allow_http:
        endpoints.append(("HTTP", settings.http_address, settings.http_port))
    if settings.allow_grpc:
        endpoints.append(("GRPC", settings.grpc_address, settings.grpc_port))
    if settings.allow_metrics:
        endpoints.append(("metrics", settings.metrics_address, settings.metrics_port))
    check_ports(endpoints, settings.cloud)
