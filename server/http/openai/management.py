"""`POST /v1/models/{model}/load` and `POST /v1/models/{model}/unload`, the model
management routes of Triton's OpenAI front end, over the model control the v2
repository API uses (`InferenceServer.load_model` and `unload_model`).

As Triton's front end, and unlike `/v2/repository`: a load of a model that is already
ready, and an unload of one that is not, are refused (400), so of several concurrent
loads (or unloads) of one model exactly one succeeds; a load answers OpenAI's model
object, an unload `{"status": "success", "model": name}`; both block until the model is
ready or gone, and both need `--model-control-mode=explicit` (400 otherwise, where v2
answers 503). A failed load or unload keeps the status the v2 routes give its error,
with Triton's front end's "Failed to load model '<name>': " before the core's message.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ge_serve.server.errors import ServerError
from ge_serve.server.inference.core import InferenceServer

from .catalog import Catalog
from .errors import OpenAIError, from_server_error

# Triton's OpenAI front end's words (engine/triton_engine.py).
EXPLICIT_ONLY = "Model load/unload requires --model-control-mode=explicit"


class ModelManagement:
    """The two routes' handlers; one load or unload of a model at a time."""

    def __init__(self, core: InferenceServer, catalog: Catalog) -> None:
        self.core = core
        self.catalog = catalog
        # Per model, so that a slow load (an LLM's minutes) holds up no other model's.
        self._locks: dict[str, asyncio.Lock] = {}
        self._holders: collections.Counter[str] = collections.Counter()

    async def load(self, request: Request) -> Response:
        name = str(request.path_params["model"])
        self._require_explicit()
        async with self._exclusive(name):
            if self.core.model_ready(name):
                raise OpenAIError(f"Model '{name}' is already loaded")
            try:
                await self.core.load_model(name)
            except ServerError as exc:
                raise _failed("load", name, exc) from None
        return _json(self.catalog.describe(name))

    async def unload(self, request: Request) -> Response:
        name = str(request.path_params["model"])
        self._require_explicit()
        async with self._exclusive(name):
            if not self.core.model_ready(name):
                raise OpenAIError(f"Unknown model: {name}")
            try:
                await self.core.unload_model(name)
            except ServerError as exc:
                raise _failed("unload", name, exc) from None
        return _json({"status": "success", "model": name})

    def _require_explicit(self) -> None:
        control = self.core.control
        if control is None or not control.api_enabled:
            raise OpenAIError(EXPLICIT_ONLY)

    @contextlib.asynccontextmanager
    async def _exclusive(self, name: str) -> AsyncIterator[None]:
        """Hold `name`'s lock; the lock goes when nobody holds or awaits it."""
        lock = self._locks.setdefault(name, asyncio.Lock())
        self._holders[name] += 1
        try:
            async with lock:
                yield
        finally:
            self._holders[name] -= 1
            if not self._holders[name]:
                del self._holders[name]
                del self._locks[name]


def _failed(verb: str, name: str, exc: ServerError) -> OpenAIError:
    found = from_server_error(exc)
    return OpenAIError(
        f"Failed to {verb} model '{name}': {exc.message}",
        status=found.status,
        kind=found.kind,
        param=found.param,
        code=found.code,
    )


def _json(data: object) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")
