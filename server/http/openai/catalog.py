"""Which models the /v1 endpoints can serve, and how each is reached.

A model is recognised by its interface alone, whatever its backend:

- **generative**: decoupled (`model_transaction_policy { decoupled: true }`), with a BYTES
  input `text_input` and a BYTES output `text_output` (the contract of Triton's LLM
  backends, which ge-serve's `llm` backend implements). Its optional inputs (`stream`,
  `sampling_parameters`, TensorRT-LLM's one input per parameter...) are sent when the
  model has them (generation.py). Chat needs a chat template: the one the backend reports
  (`LoadedModel.text_generation`), or, for a model whose backend reports none (a Python
  model), the config parameter `chat_template_source` (the Jinja2 source itself;
  the `llm` backend's `chat_template` names a file) and optionally `bos_token`,
  `eos_token` and `max_model_len`. A generative model with neither serves
  /v1/completions only; /v1/chat/completions answers it with a 400 that says so.
- **embedding**: not decoupled, exactly one input, BYTES, one element per request (dims
  `[1]`), and exactly one FP32 output of one dimension (the vector), besides an optional
  integer output `num_input_tokens` (the token count, summed into `usage`). The MiniLM
  ensemble (`TEXT` -> `EMBEDDING` [384]) is one.

Every other model is left out of /v1/models, and /v1 answers it with 404, as OpenAI
answers a model it does not have. A generation request that names no model (vLLM's
optional `model`) goes to the one generative model served (`Catalog.generator`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ge_serve.backends.base import TextGeneration
from ge_serve.server.control.chat import ChatSettings
from ge_serve.server.control.requestlog import RequestLogging
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.model import ModelVersion, TensorSpec
from ge_serve.server.inference.types import DataType

from .errors import OpenAIError, from_server_error, model_not_found
from .templateproc import TemplateProcesses
from .tools import ToolSettings

T = TypeVar("T")
# Requests' own templates rendering at once: a thread waits on each one's process.
OWN_RENDERS = 2
TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
TOKEN_COUNT = "num_input_tokens"
_INTEGERS = frozenset(
    {DataType.INT8, DataType.INT16, DataType.INT32, DataType.INT64, DataType.UINT32}
)


@dataclass(frozen=True, slots=True)
class Embedder:
    """How an embedding model is called: its text input and vector output."""

    text_input: TensorSpec
    vector_output: TensorSpec
    token_count: TensorSpec | None


def is_generative(model: ModelVersion) -> bool:
    text_in, text_out = model.inputs.get(TEXT_INPUT), model.outputs.get(TEXT_OUTPUT)
    return (
        model.decoupled
        and text_in is not None
        and text_in.datatype is DataType.BYTES
        and text_out is not None
        and text_out.datatype is DataType.BYTES
    )


def embedder(model: ModelVersion) -> Embedder | None:
    """The embedding interface of `model`, or None when it has none."""
    if model.decoupled or len(model.inputs) != 1:
        return None
    (text,) = model.inputs.values()
    if text.datatype is not DataType.BYTES or text.dims != (1,):
        return None
    count = model.outputs.get(TOKEN_COUNT)
    if count is not None and count.datatype not in _INTEGERS:
        return None
    vectors = [spec for name, spec in model.outputs.items() if name != TOKEN_COUNT]
    if len(vectors) != 1 or vectors[0].datatype is not DataType.FP32:
        return None
    if len(vectors[0].dims) != 1:
        return None
    return Embedder(text, vectors[0], count)


def text_generation(model: ModelVersion, template: str | None = None) -> TextGeneration | None:
    """The model's chat template and limits: its backend's, else its config's; with
    `template` (the server's or a request's) in place of its own template, where it has
    one or not."""
    found = model.loaded.text_generation
    if found is not None:
        return found if template is None else replace(found, chat_template=template)
    params = model.config.parameters
    if template is None and "chat_template_source" not in params:
        return None
    limit = params["max_model_len"].string_value if "max_model_len" in params else "0"
    return TextGeneration(
        chat_template=template or params["chat_template_source"].string_value,
        bos_token=params["bos_token"].string_value if "bos_token" in params else "",
        eos_token=params["eos_token"].string_value if "eos_token" in params else "",
        max_model_len=int(limit) if limit.isdigit() else 0,
    )


def no_chat_template(name: str) -> OpenAIError:
    return OpenAIError(
        f"The model '{name}' has no chat template: use /v1/completions with a "
        "prompt, or give the model one (the llm backend's `chat_template` parameter, "
        "`chat_template_source` for another backend's model, or --chat-template)",
        param="model",
        code="chat_template_missing",
    )


class Catalog:
    """The models /v1 serves, looked up in the core each time (models load and unload)."""

    def __init__(
        self,
        core: InferenceServer,
        tools: ToolSettings | None = None,
        chat: ChatSettings | None = None,
        log: RequestLogging | None = None,
    ) -> None:
        self.core = core
        # --tool-call-parser and --max-tool-call-parse-bytes (tools.py).
        self.tools = tools or ToolSettings()
        # --chat-template and vLLM's other chat flags (control/chat.py).
        self.chat = chat or ChatSettings()
        # --enable-log-requests and its companions (control/requestlog.py).
        self.log = log or RequestLogging()
        # A request's own template (--trust-request-chat-template) renders in a process
        # of these (templateproc.py), waited for on these threads, not on the loop's
        # default executor, which the v2 path's decoding shares: slow ones hold only these.
        self._templates = ThreadPoolExecutor(OWN_RENDERS, thread_name_prefix="request-template")
        self.template_processes = TemplateProcesses(OWN_RENDERS)
        # OpenAI's `created` of every model: when this server started (a model's own
        # creation time is not something a repository records).
        self.created = int(time.time())

    async def own_template(self, render: Callable[[], T]) -> T:
        """`render`, of a request's own template, on the threads kept for it, the template
        in a process of its own, bounded in time (templateproc.py); cancelled (its client
        gone), a render that has not begun never does, and one running is killed."""
        stop = threading.Event()

        def job() -> T:
            with self.template_processes.bound(stop):
                return render()

        try:
            return await asyncio.get_running_loop().run_in_executor(self._templates, job)
        except asyncio.CancelledError:
            stop.set()
            raise

    def model(self, name: str) -> ModelVersion:
        """The ready version a /v1 request for `name` goes to (its highest); 404 else."""
        try:
            return self.core.model(name)
        except ServerError as exc:
            if exc.code is ErrorCode.NOT_FOUND:
                raise model_not_found(name) from None
            raise from_server_error(exc) from None

    def generative(self, name: str) -> ModelVersion:
        model = self.model(name)
        if not is_generative(model):
            raise model_not_found(name)
        return model

    def generator(self, name: str | None, api: str) -> tuple[str, ModelVersion]:
        """The generative model a request of vLLM's `api` ("Chat Completions API"...)
        goes to, and the name its answer echoes: the one it names, else (vLLM's default,
        its one served model) the one generative model the server serves; a 400 naming
        `model` where there are several, or none."""
        if name is not None:
            return name, self.generative(name)
        found = [(entry, model) for entry, model in self.ready() if is_generative(model)]
        if len(found) == 1:
            return found[0]
        if not found:
            # vLLM's words where its one model is no generative one (its 501; a client's
            # 400 here, as the scoring routes answer the converse).
            raise OpenAIError(
                f"The model does not support {api}: the server serves no generative model",
                param="model",
            )
        # The scoring routes' words for theirs (scoring.py).
        raise OpenAIError(
            f"Missing required parameter: 'model' ({len(found)} generative models here)",
            param="model",
        )

    def chat_generation(
        self, name: str, model: ModelVersion, requested: str | None = None
    ) -> TextGeneration:
        """The generation a chat with `model` (served as `name`) renders with: its own,
        with the request's template (`requested`, where trusted) or --chat-template's in
        place of its own; a 400 where it has none."""
        generation = self.templated(model, requested)
        if generation is None or generation.chat_template is None:
            raise no_chat_template(name)
        return generation

    def templated(self, model: ModelVersion, requested: str | None = None) -> TextGeneration | None:
        """The model's generation with the template a chat renders with: the request's
        `requested` (refused unless --trust-request-chat-template), else --chat-template's,
        else its own; None where there is none."""
        if requested is not None and not self.chat.trust_request_template:
            raise OpenAIError(
                "Chat template is passed with request, but --trust-request-chat-template "
                "is not set. Refused request with untrusted chat template.",
                param="chat_template",
            )
        return text_generation(model, requested or self.chat.template)

    def embedder_name(self, name: str | None) -> str:
        """The request's model; without one, the only embedding model the server serves
        (vLLM's default, its one served model), else the missing parameter's 400."""
        if name is not None:
            return name
        found = [entry for entry, model in self.ready() if embedder(model) is not None]
        if len(found) != 1:
            raise OpenAIError(
                f"Missing required parameter: 'model' ({len(found)} embedding models here)",
                param="model",
            )
        return found[0]

    def embedding(self, name: str) -> tuple[ModelVersion, Embedder]:
        model = self.model(name)
        found = embedder(model)
        if found is None:
            raise model_not_found(name)
        return model, found

    def ready(self) -> list[tuple[str, ModelVersion]]:
        """The ready models, by name: the index of what is loaded, read without a
        repository scan, so cheap enough for a body's first checks."""
        found = []
        for name in sorted({entry.name for entry in self.core.lifecycle.index(True, ())}):
            try:
                found.append((name, self.core.model(name)))
            except ServerError:  # unloaded since the index was read
                continue
        return found

    def listing(self) -> list[dict[str, Any]]:
        """OpenAI's model objects, one per ready model /v1 can serve, by name."""
        return [
            self.describe(name)
            for name, model in self.ready()
            if is_generative(model) or embedder(model) is not None
        ]

    def describe(self, name: str) -> dict[str, Any]:
        """OpenAI's model object, with vLLM's additions (its ModelCard): `root` (vLLM's
        model path; here the name, a repository's model has no other), `parent` (null: no
        LoRA adapters here) and `max_model_len`. vLLM's `permission` is left out: it fills
        it with constant flags (`allow_logprobs: true`, say) that would not be true here."""
        return {
            "id": name,
            "object": "model",
            "created": self.created,
            "owned_by": "ge-serve",
            "root": name,
            "parent": None,
            "max_model_len": self._max_model_len(name),
        }

    def _max_model_len(self, name: str) -> int | None:
        """A generative model's context (its backend's, or its `max_model_len` config
        parameter); None where the server does not know it (an embedding model's limit is
        its tokenizer's business, not declared in its interface)."""
        try:
            model = self.core.model(name)
        except ServerError:
            return None
        generation = text_generation(model) if is_generative(model) else None
        if generation is None or generation.max_model_len <= 0:
            return None
        return generation.max_model_len
