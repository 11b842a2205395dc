"""Triton's SageMaker endpoint (sagemaker_server.cc), on its own port
(`--allow-sagemaker`, `--sagemaker-port`, default 8080).

- `/ping`: the server's readiness (`SAGEMAKER_TRITON_PING_MODE=live`: its liveness).
- `/invocations`: an inference request (or, with `SAGEMAKER_TRITON_INFERENCE_TYPE`,
  a generate or generate-stream request) to `SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`.
- `/models...`: the multi-model endpoint (sagemaker_mme.py).

Anything else is a 400, as in Triton. Each route is the KServe v2 route it stands for,
answered by the HTTP front end's own application (cloud.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ErrorCode, ServerError
from .cloud import forward_infer, readdressed, respond, rewriting_send
from .sagemaker_mme import MultiModelEndpoint

MIME: Final = "application/vnd.sagemaker-triton.binary+json;json-header-size="
UNSPECIFIED: Final = "unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
INFERENCE_TYPES: Final = ("infer", "generate", "generate_stream")
_MODELS: Final = re.compile(r"/models(?:/)?([^/]+)?(/invoke)?")


def _binary_content_type(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """An answer with binary tensor data names its JSON header's length in its content
    type, as SageMaker's clients read it."""
    length = next((v for k, v in headers if k == b"inference-header-content-length"), None)
    if length is None:
        return headers
    kept = [
        (k, v) for k, v in headers if k not in (b"inference-header-content-length", b"content-type")
    ]
    return [*kept, (b"content-type", MIME.encode() + length)]


class SageMakerEndpoint:
    """ASGI: the SageMaker routes, onto `inner` (the HTTP front end's application)."""

    def __init__(self, inner: ASGIApp, mme: MultiModelEndpoint, environ: Mapping[str, str]) -> None:
        self.inner = inner
        self.mme = mme
        self.ping_mode = environ.get("SAGEMAKER_TRITON_PING_MODE", "ready")
        self.model = environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME", UNSPECIFIED)
        self.inference_type = environ.get("SAGEMAKER_TRITON_INFERENCE_TYPE", "infer")
        if self.inference_type not in INFERENCE_TYPES:
            # Triton's `serve` script refuses it so; its server would answer each
            # invocation with a 500.
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"Invalid SAGEMAKER_TRITON_INFERENCE_TYPE '{self.inference_type}'. "
                "Must be one of: infer, generate, generate_stream",
            )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/ping":
            if scope["method"] != "GET":
                await respond(send, 405, "Method Not Allowed")
                return
            kind = "live" if self.ping_mode == "live" else "ready"
            await self.inner(readdressed(scope, f"/v2/health/{kind}", "GET"), receive, send)
            return
        if path == "/invocations":
            await self.invoke(scope, receive, send, self.model, self.inference_type)
            return
        match = _MODELS.fullmatch(path)
        if match is not None:
            await self.mme.handle(
                self.invoke, scope, receive, send, match.group(1) or "", match.group(2)
            )
            return
        await respond(send, 400, f"Bad Request: no SageMaker route for {scope['method']} {path}")

    async def invoke(
        self, scope: Scope, receive: Receive, send: Send, model: str, kind: str = "infer"
    ) -> None:
        """The inference (or generate) request to `model` that `scope` carries."""
        if kind == "infer":
            send = rewriting_send(send, headers=_binary_content_type)
        await forward_infer(self.inner, scope, receive, send, f"/v2/models/{model}/{kind}", MIME)
