"""Cohere's embed API, `POST /v2/embed`, as vLLM 0.34 serves it for an embedding model
(its CohereEmbedRequest and CohereEmbedResponse), so Cohere's SDK can point at this
server; on /v1/embeddings' path (embeddings.py), one request to the model per text.

The texts are `texts` (echoed in the answer), or `inputs`, Cohere's content blocks: each
input's text blocks are one user message, rendered with the model's chat template (vLLM
renders them so: a model without one is refused in its words), built and rendered off the
loop when many; at most 2048 blocks in all (vLLM has no bound), as many as `texts` holds.
`images`, and image blocks, are refused: no embedding model here takes anything but text.
A refused text is named by its index (`texts[0]`, `inputs[1]`), whichever path it took.

`input_type` is vLLM's: the prefix the model's `task_instructions` give it (a config
parameter, a JSON object from input type to prefix, where vLLM reads the HF config's or
sentence-transformers' `prompts`), a system message where the model has a chat template,
else put before each text; unset, nothing; a model without instructions refuses it, as
vLLM does, in its words.

`embedding_types` are vLLM's: `float` (the default), `binary` and `ubinary` (the signs,
>= 0 a 1, packed eight to a byte, most significant bit first; `binary` each byte less
128), `base64` (little-endian float32). Cohere's `int8` and `uint8`, which vLLM does not
serve, are refused by name. `truncate`: the model takes each text whole (its interface
carries no truncation), so every mode embeds a text that fits as vLLM does; one longer than
the model's context (or, with `max_tokens`, than that) is refused rather than shortened.
The types are encoded from one matrix of the vectors, and the answer serialised, as
/v1/embeddings' (embeddings.answered: on a worker thread when large).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, Literal

import numpy as np
from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from ge_serve.server.inference.model import ModelVersion

from . import fields
from .catalog import Catalog, Embedder
from .embed_schemas import EmbeddingRequest, check_count
from .embeddings import Vectors, answered, check_dimensions, embed, in_base64, vectors
from .errors import CONTEXT_LENGTH_EXCEEDED, OpenAIError, unsupported
from .messages import Body, ChatMessage, TextPart
from .scoring import served
from .template import RENDERED_ON_THE_LOOP
from .text import request_id

API = "Embeddings API"
# The config parameter that holds a model's prefixes by input type.
TASK_INSTRUCTIONS = "task_instructions"
# vLLM's words where `texts`, `images` and `inputs` are all missing, or two are given.
ONE_INPUT_FIELD = (
    "Exactly one of texts, images, or inputs must be provided, and it must be non-empty"
)
NO_IMAGES = "Image input is not supported: the model '{model}' embeds text only"
# vLLM's words: the binary types pack eight signs to a byte.
NOT_EIGHTS = (
    "Embedding dimension must be a multiple of 8 for binary embedding types, but got {dim}."
)
# vLLM's words for a text past `max_tokens` with truncate=NONE.
PAST_MAX_TOKENS = (
    "Input of {count} tokens exceeds max_tokens={limit} with truncate=NONE. Set truncate "
    "to END or START to allow truncation."
)
# Where vLLM would shorten the text instead.
NOT_SHORTENED = (
    "the model takes each text whole, so truncate={mode} cannot shorten it here: shorten the text"
)
# The number vLLM takes from each unsigned byte to make `binary`'s signed one.
_SIGNED = 128


class CohereContent(Body):
    """One content block of an input (vLLM's CohereEmbedContent)."""

    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: dict[str, str] | None = None


class CohereInput(Body):
    content: list[CohereContent]


class CohereEmbedRequest(Body):
    """vLLM's CohereEmbedRequest, its fields and bounds."""

    # vLLM's: optional; here, without it, the one embedding model the server serves.
    model: str | None = Field(None, min_length=1)
    input_type: str | None = None
    texts: list[str] | None = None
    images: list[str] | None = None
    inputs: list[CohereInput] | None = None
    output_dimension: int | None = None
    # Cohere's six, to refuse the two vLLM does not serve by name.
    embedding_types: (
        list[Literal["float", "binary", "ubinary", "base64", "int8", "uint8"]] | None
    ) = None
    truncate: Literal["NONE", "START", "END"] = "END"
    max_tokens: int | None = Field(None, ge=1)
    # Accepted and ignored: no engine queue to order (vLLM's `fcfs` ignores it too).
    priority: int = Field(0, ge=fields.INT64_MIN, le=fields.INT64_MAX)

    def refuse_unsupported(self) -> None:
        given = [f for f in ("texts", "images", "inputs") if getattr(self, f) is not None]
        if len(given) != 1 or not getattr(self, given[0]):
            raise OpenAIError(ONE_INPUT_FIELD, param=given[-1] if given else "texts")
        check_count(given[0], len(getattr(self, given[0])))
        for index, kind in enumerate(self.embedding_types or ()):
            if kind in ("int8", "uint8"):
                raise unsupported(
                    f"embedding_types[{index}]",
                    f"Embedding type '{kind}' is not supported: float, binary, ubinary or base64",
                )
        for index, text in enumerate(self.texts or ()):
            if not text:
                raise OpenAIError("'texts' must not hold an empty string", param=f"texts[{index}]")
        for index, item in enumerate(self.inputs or ()):
            if not item.content:
                raise OpenAIError(
                    "'content' must not be an empty list", param=f"inputs[{index}].content"
                )
            for place, block in enumerate(item.content):
                if block.type == "text" and block.text is None:
                    raise OpenAIError(
                        "CohereEmbedContent with type='text' requires text",
                        param=f"inputs[{index}].content[{place}].text",
                    )

    def kinds(self) -> list[str]:
        """The embedding types asked for, in the order vLLM's answer gives them."""
        asked = set(self.embedding_types or ("float",))
        return [kind for kind in ("float", "binary", "ubinary", "base64") if kind in asked]


def blocks_fit(document: Any) -> None:
    """At most MAX_EMBEDDING_INPUTS content blocks in all `inputs`, as many text pieces as
    `texts` may hold (vLLM has no bound): counted in the parsed JSON, before the schema's
    checks, whose cost, as that of building the blocks' messages, grows with them."""
    inputs = document.get("inputs") if isinstance(document, dict) else None
    if not isinstance(inputs, list):
        return
    found = (item.get("content") if isinstance(item, dict) else None for item in inputs)
    check_count("inputs", sum(len(c) for c in found if isinstance(c, list)), "content blocks")


async def cohere_embed(catalog: Catalog, request: Request, body: CohereEmbedRequest) -> Response:
    """vLLM's CohereEmbedResponse, as it dumps it (no null fields), encoded and serialised
    as /v1/embeddings' answer (embeddings.answered: off the loop when large)."""
    name, model, embedder = await served(catalog, body.model, API)
    size = embedder.vector_output.dims[0]
    _refuse_images(name, body)
    kinds = body.kinds()
    if size > 0:  # before the model runs
        _check_shape(name, body, kinds, size)
    if body.max_tokens is not None and embedder.token_count is None:
        raise unsupported(
            "max_tokens",
            f"'max_tokens' is not supported: the model '{name}' does not count its tokens",
        )
    prefix = _prefix(model, body.input_type)
    field = "inputs" if body.inputs is not None else "texts"
    try:
        found = await _vectors(catalog, model, embedder, body, prefix)
    except OpenAIError as exc:
        raise _renamed(exc, field, body.truncate) from None
    for vector, _ in found:
        _check_shape(name, body, kinds, vector.size)
    _check_max_tokens(body, field, found)
    name = "embd-" + (request_id(request, None) or uuid.uuid4().hex)

    def build() -> dict[str, Any]:
        tokens = sum(count for _, count in found)
        answer: dict[str, Any] = {"id": name, "embeddings": _typed(kinds, found)}
        if body.texts is not None:
            answer["texts"] = body.texts
        answer["meta"] = {
            "api_version": {"version": "2"},
            "billed_units": {"input_tokens": tokens, "image_tokens": 0},
        }
        answer["response_type"] = "embeddings_by_type"
        return answer

    return await answered(build, found)


def task_instructions(model: ModelVersion) -> dict[str, str] | None:
    """The model's prefixes by input type (its `task_instructions` parameter, a JSON
    object); None where it has none, as vLLM keeps only string values of an object."""
    params = model.config.parameters
    if TASK_INSTRUCTIONS not in params:
        return None
    try:
        given = json.loads(params[TASK_INSTRUCTIONS].string_value)
    except json.JSONDecodeError:
        return None
    if not isinstance(given, dict):
        return None
    return {k: v for k, v in given.items() if isinstance(v, str)} or None


def _prefix(model: ModelVersion, input_type: str | None) -> str | None:
    """The prefix `input_type` gives, in vLLM's words where the model has none for it."""
    if input_type is None:
        return None
    instructions = task_instructions(model)
    if instructions is None:
        raise OpenAIError(
            f"Unsupported input_type {input_type!r}. This model does not define any "
            "input_type task instructions.",
            param="input_type",
        )
    if input_type not in instructions:
        supported = ", ".join(sorted(instructions))
        raise OpenAIError(
            f"Unsupported input_type {input_type!r}. Supported values: {supported}",
            param="input_type",
        )
    return instructions[input_type] or None


async def _vectors(
    catalog: Catalog,
    model: ModelVersion,
    embedder: Embedder,
    body: CohereEmbedRequest,
    prefix: str | None,
) -> Vectors:
    """Each input's vector and token count, as vLLM renders them: a text as it is (after
    the prefix), or, for content blocks and for a prefix with a chat template, a
    conversation of the prefix as system message and the input as user message."""
    texts = body.texts or []
    if body.inputs is None:
        generation = catalog.templated(model)
        if prefix is None or generation is None or generation.chat_template is None:
            given = [(prefix or "") + text for text in texts]
            params = [f"texts[{index}]" for index in range(len(given))]
            return await embed(catalog, model, embedder, given, params)
    inputs = body.inputs

    def proxy() -> EmbeddingRequest:
        """/v1/embeddings' chat form, whose renderer and refusals these are (vLLM's proxy
        EmbeddingBatchChatRequest); its `messages` is renamed after (`_renamed`)."""
        system = [] if prefix is None else [ChatMessage(role="system", content=prefix)]
        users = (
            [ChatMessage(role="user", content=text) for text in texts]
            if inputs is None
            else [ChatMessage(role="user", content=_parts(item)) for item in inputs]
        )
        conversations = [[*system, user] for user in users]
        return EmbeddingRequest.model_validate({"model": model.name, "messages": conversations})

    # Each block a message part, each built and checked in Python: off the loop when many.
    blocks = sum(len(item.content) for item in inputs or ())
    built = await asyncio.to_thread(proxy) if blocks > RENDERED_ON_THE_LOOP else proxy()
    return await vectors(catalog, model, embedder, built, indexed=True)


def _parts(item: CohereInput) -> list[TextPart]:
    return [TextPart(type="text", text=block.text) for block in item.content]


def _not_shortened(reason: str, mode: str) -> str:
    """Why a text is refused, where vLLM would shorten it under truncate=`mode`."""
    return f"{reason.rstrip('.')}: {NOT_SHORTENED.format(mode=mode)}"


def _renamed(exc: OpenAIError, field: str, truncate: str) -> OpenAIError:
    """The chat form's refusal named after the request's own field (`messages[1]` is
    `inputs[1]`); a text past the context says that `truncate` cannot shorten it."""
    param = exc.param
    if param is not None and param.startswith("messages"):
        param = field + param[len("messages") :]
    message = exc.message
    if exc.code == CONTEXT_LENGTH_EXCEEDED and truncate != "NONE":
        message = _not_shortened(message, truncate)
    return OpenAIError(
        message, status=exc.status, kind=exc.kind, param=param, code=exc.code, closes=exc.closes
    )


def _refuse_images(model: str, body: CohereEmbedRequest) -> None:
    if body.images is not None:
        raise unsupported("images", NO_IMAGES.format(model=model))
    for index, item in enumerate(body.inputs or ()):
        for place, block in enumerate(item.content):
            if block.type == "image_url":
                raise unsupported(
                    f"inputs[{index}].content[{place}]", NO_IMAGES.format(model=model)
                )


def _check_shape(model: str, body: CohereEmbedRequest, kinds: list[str], size: int) -> None:
    """`output_dimension` (as /v1/embeddings' `dimensions`: only the model's own), and
    the binary types' multiple of eight, in vLLM's words."""
    if body.output_dimension is not None:
        check_dimensions(model, body.output_dimension, size, "output_dimension")
    if size % 8 and ("binary" in kinds or "ubinary" in kinds):
        raise OpenAIError(NOT_EIGHTS.format(dim=size), param="embedding_types")


def _check_max_tokens(body: CohereEmbedRequest, field: str, found: Vectors) -> None:
    """vLLM's `max_tokens`: with truncate=NONE, a text past it is refused in its words;
    with START or END, vLLM would shorten it, which the model here cannot."""
    if body.max_tokens is None:
        return
    for index, (_, count) in enumerate(found):
        if count > body.max_tokens:
            message = PAST_MAX_TOKENS.format(count=count, limit=body.max_tokens)
            if body.truncate != "NONE":
                past = f"Input of {count} tokens exceeds max_tokens={body.max_tokens}"
                message = _not_shortened(past, body.truncate)
            raise OpenAIError(message, param=f"{field}[{index}]", code=CONTEXT_LENGTH_EXCEEDED)


def _typed(kinds: list[str], found: Vectors) -> dict[str, list[Any]]:
    """The vectors in each of vLLM's embedding types `kinds`: all at once, one matrix
    (each vector alone where the model's sizes differ)."""
    floats = [vector for vector, _ in found]
    if len({vector.size for vector in floats}) > 1:
        rows = [_encoded(kinds, vector[np.newaxis]) for vector in floats]
        return {kind: [row[kind][0] for row in rows] for kind in kinds}
    return _encoded(kinds, np.stack(floats))


def _encoded(kinds: list[str], matrix: np.ndarray[Any, Any]) -> dict[str, list[Any]]:
    """A matrix of vectors (a row each) in each of `kinds`, in their order."""
    found: dict[str, list[Any]] = {}
    if "float" in kinds:
        found["float"] = matrix.tolist()
    if "binary" in kinds or "ubinary" in kinds:
        packed = np.packbits(matrix >= 0, axis=-1)
        if "binary" in kinds:
            found["binary"] = (packed.astype(np.int16) - _SIGNED).tolist()
        if "ubinary" in kinds:
            found["ubinary"] = packed.tolist()
    if "base64" in kinds:
        found["base64"] = [in_base64(row, "float32", "little") for row in matrix]
    return {kind: found[kind] for kind in kinds}
