"""Flags that contradict each other, and values of the flags that do nothing here that
Triton refuses: usage errors, as Triton's command line makes them, checked once the
whole command line is read (server/cli.py)."""

from __future__ import annotations

from ge_serve.backends.text_bool import parse_bool

from .settings import Settings
from .tritonflags import check_values

# The cloud endpoints Triton adds beside HTTP and gRPC; ge-serve has neither.
_CLOUD = ("--allow-sagemaker", "--allow-vertex-ai")


def check_combined(settings: Settings) -> None:
    """ValueError, with a message for people, for settings that contradict each other or
    a value Triton refuses (tritonflags.py)."""
    check_values(settings.inapplicable)
    if settings.load_models and settings.model_control_mode != "explicit":
        raise ValueError(
            "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."
        )
    cloud = [flag for flag, value in settings.inapplicable if flag in _CLOUD and parse_bool(value)]
    if cloud and not (settings.allow_http or settings.allow_grpc):
        # Triton's SageMaker and Vertex AI launch lines turn HTTP and gRPC off: here that
        # would start a server that answers nothing, not even the platform's health check.
        raise ValueError(
            f"{cloud[0]}=true: ge-serve has no SageMaker or Vertex AI endpoint, and with "
            "--allow-http=false and --allow-grpc=false it would serve nothing; serve the "
            "KServe v2 protocol over HTTP or gRPC instead"
        )
