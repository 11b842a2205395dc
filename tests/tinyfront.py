"""The tiny `llm` model (`tiny`) and an onnxruntime identity model (`ident`) loaded in
this process, and HTTP front ends over them reached through httpx's ASGI transport: for
tests of what wraps the HTTP application (API keys, root paths)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import llmrepo
from modelgen import identity_model, write_model
from onnx import TensorProto

from ge_serve.backends.llm.backend import LlmBackend
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.scheduler.factory import SchedulerOptions
from ge_serve.server.app import make_scheduler
from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle
from ge_serve.server.models.repository import ModelRepository

CHAT = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
INFER = {"inputs": [{"name": "INPUT", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}


@contextlib.asynccontextmanager
async def tiny_core(repo: Path) -> AsyncIterator[InferenceServer]:
    """The core with `tiny` and `ident` written into `repo` and loaded."""
    llmrepo.write_tiny_llm(repo, "tiny", interface=False)
    write_model(repo, "ident", identity_model(TensorProto.FLOAT, ("batch", 4)))
    lifecycle = ModelLifecycle(
        ModelRepository([repo]),
        {"onnxruntime": OnnxRuntimeBackend(), "llm": LlmBackend()},
        functools.partial(make_scheduler, options=SchedulerOptions()),
        LifecycleSettings(unload_timeout_s=5.0),
    )
    try:
        assert await lifecycle.load_many(["tiny", "ident"]) == {}
        yield InferenceServer(lifecycle)
    finally:
        await lifecycle.close()


def front_client(core: InferenceServer, **settings: Any) -> httpx.AsyncClient:
    """A client of the HTTP application over `core`, with these HttpSettings fields."""
    base = HttpSettings(max_input_size=1 << 20, restricted_api=())
    front = HttpFrontEnd(core, dataclasses.replace(base, **settings))
    transport = httpx.ASGITransport(app=front.build())
    return httpx.AsyncClient(transport=transport, base_url="http://test")
