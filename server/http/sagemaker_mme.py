"""SageMaker's multi-model endpoint, as Triton serves it (sagemaker_server.cc):

- `POST /models` `{"model_name": ..., "url": ...}`: load the model archive SageMaker
  unpacked at `url`, which must be `<root>/<hash>/model[/<subdir>]` (root: /opt/ml/models).
  Its folder is registered as a model repository (registered.py) with the model folder
  mapped to the model's name, and the model loaded (explicit model control). A folder
  that holds the config is the model; else the ensemble among its folders, or its one
  folder. 409 if the name or the folder is in use already.
- `GET /models`, `GET /models/<name>`: what is loaded, as `modelName` and `modelUrl`.
- `POST /models/<name>/invoke`: an inference request to it (errors 400, or 507 for an
  out-of-memory error, as SageMaker expects).
- `DELETE /models/<name>`: unload it and its dependents, and unregister its folder.

`X-Amzn-SageMaker-Target-Model`, where given, is the name the model is loaded, invoked
and unloaded as. A url is a local path: resolved (symbolic links too) it must stay a
folder under the root; anything else is a 400 before anything is read from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import orjson
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from ..errors import ErrorCode, ServerError
from ..inference.core import InferenceServer
from ..models.registered import RegisteredRepositories
from ..models.repository import CONFIG_FILENAME, check_model_name
from .cloud import error, respond, rewriting_send
from .infer import InferEndpoint

# Run the inference request a scope carries against a model: (scope, receive, send, model).
Invoke = Callable[[Scope, Receive, Send, str], Awaitable[None]]

log = logging.getLogger(__name__)

TARGET_HEADER: Final = "x-amzn-sagemaker-target-model"
# Where SageMaker unpacks model archives; the environment may name another (ge-serve's).
ROOT_VARIABLE: Final = "GE_SERVE_SAGEMAKER_MODELS_ROOT"
DEFAULT_ROOT: Final = "/opt/ml/models"
_ENSEMBLE: Final = re.compile(r'platform:(\s)*"ensemble"')
# Triton's error texts that mean the host or device ran out of memory: a 507.
_OUT_OF_MEMORY: Final = (
    "CUDA out of memory",
    "CUDA_OUT_OF_MEMORY",
    "Out of memory",
    "Out Of Memory",
    "out of memory",
    "MemoryError",
    "OutOfMemory",
    "OOM",
    "Dst tensor is not initialized",
    "Src tensor is not initialized",
    "CNMEM_STATUS_OUT_OF_MEMORY",
    "CUDNN_STATUS_NOT_INITIALIZED",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUBLAS_STATUS_NOT_INITIALIZED",
    "Failed to allocate memory",
    "failed to allocate memory",
    "No space left on device",
)


def out_of_memory(message: str) -> bool:
    return any(text in message for text in _OUT_OF_MEMORY)


def _failure_status(status: int, body: bytes) -> int:
    """An invocation's error, as Triton's SageMaker endpoint answers it: a restricted
    API's 403 stays (RETURN_AND_RESPOND_IF_RESTRICTED answers before the invocation)."""
    if status == 403:
        return status
    return 507 if out_of_memory(body.decode("utf-8", "replace")) else 400


@dataclass(frozen=True, slots=True)
class Archive:
    """Where a load request's model is: the folder to register, and its model folder;
    `shown`: that folder as the url names it (`modelUrl`), links not followed, as Triton
    reports it."""

    repository: Path
    folder: str
    shown: Path


@dataclass(frozen=True, slots=True)
class Loaded:
    """A model this endpoint loaded: the name it serves as (the Target-Model header at
    its load, else its name), the repository folder registered for it, and that folder
    as its url named it."""

    target: str
    repository: Path
    shown: Path


class MultiModelEndpoint:
    def __init__(
        self,
        core: InferenceServer,
        registered: RegisteredRepositories,
        reader: InferEndpoint,
        restricted: Callable[[str, Headers], str | None],
        environ: Mapping[str, str],
    ) -> None:
        self.core = core
        self.registered = registered
        self.reader = reader
        self.restricted = restricted
        self.root = Path(os.path.abspath(environ.get(ROOT_VARIABLE, DEFAULT_ROOT)))
        # The loaded models, by the name their load request gave.
        self.models: dict[str, Loaded] = {}
        self._lock = asyncio.Lock()

    async def handle(
        self,
        invoke_model: Invoke,
        scope: Scope,
        receive: Receive,
        send: Send,
        name: str,
        invoke: str | None,
    ) -> None:
        method = scope["method"]
        headers = Headers(scope=scope)
        if method == "POST" and invoke:
            if name not in self.models:
                await respond(send, 404, f"model '{name}' is not loaded")
                return
            target = headers.get(TARGET_HEADER) or name
            log.info("Invoking SageMaker TargetModel: %s", target)
            failing = rewriting_send(send, status=_failure_status)
            await invoke_model(scope, receive, failing, target)
            return
        if method not in ("GET", "POST", "DELETE") or (method != "POST" and invoke):
            await respond(
                send, 400, f"Bad Request: no SageMaker route for {method} {scope['path']}"
            )
            return
        header = self.restricted("model-repository", headers)
        if header is not None:
            await respond(send, 403, f"This API is restricted, expecting header '{header}'")
            return
        try:
            if method == "GET":
                await self._get(send, name)
            elif method == "POST":
                body = await self.reader.read_body(Request(scope, receive))
                await self._load(send, body, headers)
            else:
                await self._unload(send, name)
        except ServerError as exc:
            # A name or folder in use already: 409, as SageMaker expects.
            await error(send, exc, 409 if exc.code is ErrorCode.ALREADY_EXISTS else 400)

    async def _get(self, send: Send, name: str) -> None:
        if not name:
            models = [
                {"modelName": model, "modelUrl": str(loaded.shown)}
                for model, loaded in self.models.items()
                if self.core.model_ready(loaded.target)
            ]
            await _json(send, {"models": models})
        elif name in self.models:
            url = str(self.models[name].shown)
            await _json(send, {"modelName": name, "modelUrl": url})
        else:
            await respond(send, 404, f"model '{name}' is not loaded")

    async def _load(self, send: Send, body: bytes, headers: Headers) -> None:
        name, url = _load_request(body)
        target = headers.get(TARGET_HEADER) or name
        log.info("Loading SageMaker TargetModel: %s", target)
        check_model_name(target)
        if self.core.control is None or not self.core.control.api_enabled:
            raise ServerError(
                ErrorCode.UNSUPPORTED,
                "repository registration is not allowed if model control mode is not EXPLICIT",
            )
        archive = await asyncio.to_thread(self.archive, url)
        async with self._lock:
            # A name the server knows already (from its own repository, say) is not this
            # load's to undo: a failed load leaves it as it was, as in Triton.
            known = target in self.core.lifecycle.models
            self.registered.register(archive.repository, {target: archive.folder})
            try:
                await self.core.load_model(target)
            except ServerError as exc:
                # What loaded along with it (an ensemble's steps) goes too, and the index
                # forgets what came from a repository no longer registered.
                if not known:
                    with contextlib.suppress(ServerError):
                        await self.core.unload_model(target, unload_dependents=True, forget=True)
                self.registered.unregister(archive.repository)
                if exc.code is ErrorCode.ALREADY_EXISTS:
                    await error(send, exc, 409)
                else:
                    await error(send, exc, 507 if out_of_memory(exc.message) else 400)
                return
            self.models[name] = Loaded(target, archive.repository, archive.shown)
        await respond(send, 200)

    async def _unload(self, send: Send, name: str) -> None:
        async with self._lock:
            loaded = self.models.get(name)
            if loaded is None:
                await respond(send, 404, f"model '{name}' is not loaded")
                return
            # The name it was loaded as, whatever this request's Target-Model says: another
            # would leave it served with its repository gone.
            log.info("Unloading SageMaker TargetModel: %s", loaded.target)
            await self.core.unload_model(loaded.target, unload_dependents=True, forget=True)
            del self.models[name]
            self.registered.unregister(loaded.repository)
        await respond(send, 200)

    def archive(self, url: str) -> Archive:
        """Blocking: where the model at `url` is, or a 400 that says why not."""
        path = Path(os.path.abspath(url))
        if any(str(path).startswith(p) for p in ("/dev/", "/proc/", "/sys/")):
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f'Invalid URL: {url}. "url" property value cannot start with /dev/, '
                "/proc/, or /sys/.",
            )
        relative = path.relative_to(self.root).parts if path.is_relative_to(self.root) else ()
        form = re.compile(r"[0-9A-Za-z._]+")
        if not (
            2 <= len(relative) <= 3
            and relative[1] == "model"
            and all(form.fullmatch(part) for part in relative)
        ):
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"Invalid \"url\" '{url}': expected a path of the form "
                f"{self.root}/<hash>/model[/<subdir>]",
            )
        # Symbolic links may not lead out of the root (a folder SageMaker did not unpack),
        # neither the url's nor the model folder's chosen in it; what is registered is the
        # resolved folder, so a link swapped later changes nothing.
        real_root = self.root.resolve()
        real = path.resolve()
        if not real.is_relative_to(real_root) or not real.is_dir():
            raise ServerError(
                ErrorCode.INVALID_ARG, f"failed to register '{path}', repository not found"
            )
        if (real / CONFIG_FILENAME).is_file():
            return Archive(real.parent, real.name, path.parent)
        folders = sorted(p for p in real.iterdir() if p.is_dir() and not p.name.startswith("."))
        chosen = next((p for p in folders if _is_ensemble(p)), folders[-1] if folders else None)
        if chosen is None:
            raise ServerError(ErrorCode.INVALID_ARG, f"no model folder found in '{url}'")
        if chosen.is_symlink() and not chosen.resolve().is_relative_to(real):
            raise ServerError(
                ErrorCode.INVALID_ARG, f"model folder '{chosen.name}' in '{url}' leaves it"
            )
        return Archive(real, chosen.name, path)


def _is_ensemble(folder: Path) -> bool:
    try:
        text = (folder / CONFIG_FILENAME).read_text("utf-8", "replace")
    except OSError:
        return False
    return _ENSEMBLE.search(text) is not None


def _load_request(body: bytes) -> tuple[str, str]:
    """(model_name, url) of a load request; a 400 in Triton's words for a bad one."""
    try:
        request = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError as exc:
        raise ServerError(
            ErrorCode.INVALID_ARG, f"failed to parse the request JSON buffer: {exc}"
        ) from None
    if not isinstance(request, dict):
        raise ServerError(ErrorCode.INVALID_ARG, "load model request must be a JSON object")
    values = []
    for key in ("model_name", "url"):
        value = request.get(key, "")
        if not isinstance(value, str):
            raise ServerError(ErrorCode.INVALID_ARG, f"'{key}' must be a string")
        values.append(value)
    return values[0], values[1]


async def _json(send: Send, value: object) -> None:
    body = orjson.dumps(value)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
