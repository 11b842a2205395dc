"""Flags that contradict each other, and values of the flags that do nothing here that
Triton refuses: usage errors, as Triton's command line makes them, checked once the
whole command line is read (server/cli.py)."""

from __future__ import annotations

from .ports import check_endpoints, check_safe_range, endpoints
from .settings import Settings
from .tritonflags import check_values


def check_combined(settings: Settings) -> None:
    """ValueError, with a message for people, for settings that contradict each other or
    a value Triton refuses (tritonflags.py)."""
    check_values(settings.inapplicable)
    listeners = endpoints(settings)
    check_endpoints(listeners)
    if settings.load_models and settings.model_control_mode != "explicit":
        raise ValueError(
            "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
        )
    check_safe_range(listeners, settings.cloud.sagemaker_safe_range)
    if settings.enable_auto_tool_choice and not settings.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")  # vLLM's
