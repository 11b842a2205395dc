"""`triton_python_backend_utils`, the module a Triton Python model imports.

Models do `import triton_python_backend_utils as pb_utils`; the worker makes that name
this module (see `modules/`). The pieces live in pb_types, pb_tensor, pb_request,
pb_config and pb_observe; this module gathers them and adds the helpers Triton's has.
"""

from __future__ import annotations

from typing import Any

from .pb_config import (
    ModelConfig,
    get_input_config_by_name,
    get_output_config_by_name,
    using_decoupled_model_transaction_policy,
)
from .pb_observe import Logger, Metric, MetricFamily
from .pb_request import (
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    InferenceTrace,
)
from .pb_tensor import Tensor
from .pb_types import (
    TRITON_STRING_TO_NUMPY,
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_CPU_PINNED,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    TritonError,
    TritonModelException,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)
from .runtime import current

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_CPU_PINNED",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "Metric",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


class PreferredMemory:
    """Where a BLS call would like its outputs; every tensor is on the CPU here."""

    def __init__(
        self, preferred_memory_type: int = TRITONSERVER_MEMORY_CPU, preferred_device_id: int = 0
    ) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


def get_model_dir() -> str:
    """The model's version folder, where its own files are (a Python-based backend's
    model.py reads the model's settings from there)."""
    return current().model_dir


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    return bool(current().request("model_ready", str(model_name), str(model_version)))


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) a model through the server's model control (explicit mode)."""
    _control("load_model", str(model_name), str(config or ""), dict(files or {}))


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    _control("unload_model", str(model_name), bool(unload_dependents))


def _control(name: str, *args: Any) -> None:
    try:
        current().request(name, *args)
    except RuntimeError as exc:
        raise TritonModelException(str(exc)) from None
