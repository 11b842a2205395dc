"""The /v1 front end in process, for component tests: the models of a repository in real
Python-backend workers (ONNX Runtime and the llm engine beside them), the core and the
lifecycle in this process, and the HTTP application reached over httpx's ASGI transport;
and how those tests read OpenAI's error object."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import httpx

from ge_serve.backends.llm.backend import LlmBackend
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.backends.python.host.backend import PythonBackend
from ge_serve.scheduler.factory import SchedulerOptions
from ge_serve.server.app import make_scheduler
from ge_serve.server.control.chat import ChatSettings
from ge_serve.server.http.app import HttpFrontEnd, HttpSettings
from ge_serve.server.http.openai.tools import ToolSettings
from ge_serve.server.inference.bls import CoreBridge
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle
from ge_serve.server.models.repository import ModelRepository


@contextlib.asynccontextmanager
async def openai_client(
    repo: Path,
    models: Iterable[str],
    tools: ToolSettings | None = None,
    chat: ChatSettings | None = None,
    **settings: Any,
) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the HTTP front end over `repo` with `models` loaded (each must load);
    the models are unloaded and the Python workers ended after. `tools`: the server's
    /v1 parsers (--tool-call-parser, --reasoning-parser); `chat`: its chat flags;
    `settings`: other fields of its HttpSettings."""
    async with openai_app(repo, models, tools, chat, **settings) as (client, _):
        yield client


@contextlib.asynccontextmanager
async def openai_app(
    repo: Path,
    models: Iterable[str],
    tools: ToolSettings | None = None,
    chat: ChatSettings | None = None,
    **settings: Any,
) -> AsyncIterator[tuple[httpx.AsyncClient, InferenceServer]]:
    """`openai_client`'s client with the core behind it (for a test that reaches a loaded
    model's scheduler)."""
    python = PythonBackend()
    lifecycle = ModelLifecycle(
        ModelRepository([repo]),
        {"onnxruntime": OnnxRuntimeBackend(), "python": python, "llm": LlmBackend()},
        functools.partial(make_scheduler, options=SchedulerOptions()),
        LifecycleSettings(unload_timeout_s=10.0),
    )
    core = InferenceServer(lifecycle)
    python.attach_core(CoreBridge(core, asyncio.get_running_loop()))
    try:
        assert await lifecycle.load_many(list(models)) == {}
        given = HttpSettings(max_input_size=1 << 20, restricted_api=(), **settings)
        if tools is not None:
            given = dataclasses.replace(given, tools=tools)
        if chat is not None:
            given = dataclasses.replace(given, chat=chat)
        front = HttpFrontEnd(core, given)
        transport = httpx.ASGITransport(app=front.build())
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client, core
    finally:
        await lifecycle.close()
        python.close()


def error(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    """OpenAI's error object of a `status` answer, which has its four fields."""
    assert response.status_code == status, response.text
    found: dict[str, Any] = response.json()["error"]
    assert set(found) == {"message", "type", "param", "code"}
    return found
