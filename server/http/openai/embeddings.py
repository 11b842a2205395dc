"""`POST /v1/embeddings`: one vector per input string, from any embedding model; and the
machinery that /pooling and the scoring routes share (`vectors`, `embed`, `encoded`).

Each string is one request to the model (its BYTES input holds one element), all sent at
once, so the model's own scheduler batches them as it batches any clients' requests (the
MiniLM pipeline pads and merges them by length); the vectors come back in input order.
vLLM's chat forms (`messages`, or messages in `input`) render each conversation with the
model's chat template (a config parameter `chat_template_source`, catalog.py) and embed
the text; a model without one is refused in vLLM's words, as vLLM refuses a tokenizer
without a chat template (the MiniLM ensemble has none).

`encoding_format` `float` gives JSON numbers; `base64` gives the vector's bytes in base64:
little-endian float32 by default, as OpenAI's clients decode them, or vLLM's
`embed_dtype` (float16, bfloat16, fp8 e4m3 or e5m2, converted as torch converts them,
rounding to nearest) in its `endianness` ("native": this machine's), as vLLM encodes
them; `float` ignores both, as vLLM's does. vLLM's `bytes` and `bytes_only` answer the
vectors' bytes so encoded, one after the other, as `application/octet-stream`, `bytes`
with vLLM's `metadata` header (the answer's JSON, each vector's byte range and shape in
place of the vector). `usage.prompt_tokens` is the
sum of the model's `num_input_tokens` output where it has one (the MiniLM ensemble's
tokenizer reports it), else 0, rather than a count made up outside the model's tokenizer.

An input longer than the model's context is the model's to refuse (the MiniLM tokenizer
does, in vLLM's words): the refusal is OpenAI's 400 `context_length_exceeded` on the
input it is about, `input` or `input[i]` for the i-th of a list, and no vector is
returned for any of them, as OpenAI and vLLM answer rather than embed part of the text.
An ensemble's error comes without the "in ensemble 'name', " that Triton's form puts in
front of a step's error on /v2: the client named that model itself, and the message is
then the step's own (vLLM's words, for the MiniLM tokenizer).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import orjson
from starlette.responses import Response

from ge_serve.server.errors import ServerError
from ge_serve.server.inference.model import ModelVersion
from ge_serve.server.inference.types import InferRequest, InferResponse, Tensor
from ge_serve.server.inference.wire import object_array

from .catalog import Catalog, Embedder
from .choices import all_of
from .embed_schemas import NO_CHAT_TEMPLATE, EmbeddingRequest, PooledBody
from .errors import OpenAIError, from_server_error
from .messages import ChatMessage
from .template import RENDERED_ON_THE_LOOP, render

# What an ensemble puts in front of a step's error (scheduler/ensemble.py), once per level.
_ENSEMBLE_PREFIX = re.compile(r"^(?:in ensemble '[^']*', )+")
# vLLM's `embed_dtype`s, as numpy types (torch's float8_e4m3fn is ml_dtypes' too: no
# infinity, NaN past its range).
_EMBED_DTYPES: dict[str, Any] = {
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "fp8_e4m3": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2,
}
Vectors = list[tuple[np.ndarray[Any, Any], int]]
# Answers of more vector values than this in all are encoded and serialised off the event
# loop's thread: 2048 vectors of 4096 take over a second, one of 384 well under a ms.
ENCODED_ON_THE_LOOP = 64 * 1024


async def embeddings(catalog: Catalog, body: EmbeddingRequest, request_id: str = "") -> Response:
    """The answer, whose `id` (vLLM's, which OpenAI's lacks) is `embd-` and `request_id`
    (the client's, text.request_id) or a fresh one; encoded as answered() does."""
    served = catalog.embedder_name(body.model)
    model, embedder = catalog.embedding(served)
    size = embedder.vector_output.dims[0]
    if body.dimensions is not None and size > 0:
        check_dimensions(served, body.dimensions, size)  # before the model runs
    found = await vectors(catalog, model, embedder, body)
    if body.dimensions is not None:
        for vector, _ in found:
            check_dimensions(served, body.dimensions, vector.size)
    name = "embd-" + (request_id or uuid.uuid4().hex)
    created = int(time.time())

    def build() -> dict[str, Any] | Response:
        if body.encoding_format in ("bytes", "bytes_only"):
            return binary(body, name, created, served, found)
        tokens = sum(count for _, count in found)
        return {
            "id": name,
            "object": "list",
            "created": created,
            "data": [
                {"object": "embedding", "index": index, "embedding": encoded(vector, body)}
                for index, (vector, _) in enumerate(found)
            ],
            "model": served,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    return await answered(build, found)


async def answered(build: Callable[[], dict[str, Any] | Response], found: Vectors) -> Response:
    """The answer `build` makes from the vectors `found`, serialised as JSON (unless it is
    a Response already): on a worker thread past ENCODED_ON_THE_LOOP values."""

    def made() -> Response:
        answer = build()
        if isinstance(answer, Response):
            return answer
        return Response(orjson.dumps(answer), media_type="application/json")

    if sum(vector.size for vector, _ in found) > ENCODED_ON_THE_LOOP:
        return await asyncio.to_thread(made)
    return made()


async def vectors(
    catalog: Catalog,
    model: ModelVersion,
    embedder: Embedder,
    body: PooledBody,
    indexed: bool = False,
) -> Vectors:
    """Each input's vector and token count, in order: `input`'s texts, or each
    conversation of the chat forms rendered with the model's chat template. A refusal
    names the conversation's index (`messages[i]`) where there are several or `indexed`."""
    chat = body.conversations()
    if chat is None:
        texts = body.texts()
        listed = not isinstance(body.input, str)
        params = [f"input[{i}]" if listed else "input" for i in range(len(texts))]
        return await embed(catalog, model, embedder, texts, params)
    name, conversations = chat
    generation = catalog.templated(model, body.chat_template)
    if generation is None or generation.chat_template is None:
        raise OpenAIError(NO_CHAT_TEMPLATE, param=name)
    extra = catalog.chat.variables(body.chat_template_kwargs)
    # The renderer's options, which the request's own fields set.
    extra.pop("add_generation_prompt", None)
    extra.pop("continue_final_message", None)

    def rendered() -> list[str]:
        return [
            render(
                generation,
                conversation,
                add_generation_prompt=body.add_generation_prompt,
                continue_final=body.continue_final_message,
                extra=extra,
                blame="chat_template_kwargs" if body.chat_template_kwargs else name,
                content_format=catalog.chat.content_format,
                own=bool(body.chat_template),
            )
            for conversation in conversations
        ]

    # Messages and their content parts: the template walks each.
    many = sum(map(_pieces, conversations)) > RENDERED_ON_THE_LOOP
    if body.chat_template:  # the request's own: the client's code (templateproc.py)
        texts = await catalog.own_template(rendered)
    else:
        texts = await asyncio.to_thread(rendered) if many else rendered()
    listed = indexed or len(texts) > 1
    params = [f"{name}[{i}]" if listed else name for i in range(len(texts))]
    return await embed(catalog, model, embedder, texts, params)


def encoded(vector: np.ndarray[Any, Any], body: PooledBody) -> list[float] | str:
    """A vector as JSON gives it: numbers (`float`), or vLLM's base64."""
    if body.encoding_format == "base64":
        return in_base64(vector, body.embed_dtype, body.endianness)
    result: list[float] = vector.tolist()
    return result


def in_base64(vector: np.ndarray[Any, Any], dtype: str, endianness: str) -> str:
    """vLLM's base64 of a vector: its bytes as `dtype`, in `endianness`."""
    return base64.b64encode(as_bytes(vector, dtype, endianness)).decode("ascii")


def binary(body: PooledBody, name: str, created: int, model: str, found: Vectors) -> Response:
    """vLLM's octet-stream answer: the vectors' bytes, one after the other; with `bytes`,
    its `metadata` header says where each is and what the answer's JSON would."""
    parts = [as_bytes(vector, body.embed_dtype, body.endianness) for vector, _ in found]
    headers = None
    if body.encoding_format == "bytes":
        items, offset = [], 0
        for index, ((vector, _), part) in enumerate(zip(found, parts, strict=True)):
            place = {"start": offset, "end": offset + len(part), "shape": list(vector.shape)}
            items.append({"index": index, "embed_dtype": body.embed_dtype,
                          "endianness": body.endianness, **place})  # fmt: skip
            offset += len(part)
        tokens = sum(count for _, count in found)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        metadata = {"id": name, "created": created, "model": model, "data": items, "usage": usage}
        headers = {"metadata": json.dumps(metadata)}
    return Response(b"".join(parts), headers=headers, media_type="application/octet-stream")


async def embed(
    catalog: Catalog,
    model: ModelVersion,
    embedder: Embedder,
    texts: Sequence[str],
    params: Sequence[str],
) -> Vectors:
    """Each text's vector and token count (0 where the model reports none), in order; each
    text is one request to the model, all sent at once. A refusal names the text's field,
    its `params` entry, and cancels the other texts' requests."""
    # The first refusal fails the request and cancels the others, queued or running, as
    # a client that leaves cancels them all (routes.py): vLLM embeds no text of a request
    # it refuses, and no one would read those vectors.
    responses = await all_of(
        [
            _infer(catalog, _request(model, embedder, text), param)
            for text, param in zip(texts, params, strict=True)
        ]
    )
    return [_read(response, embedder) for response in responses]


def check_dimensions(model: str, dimensions: int, size: int, param: str = "dimensions") -> None:
    """Only the model's own size: no model here gives a shorter (Matryoshka) vector."""
    if dimensions != size:
        raise OpenAIError(
            f"The model '{model}' gives {size} dimensions; '{param}' cannot change it",
            param=param,
        )


def as_bytes(vector: np.ndarray[Any, Any], dtype: str, endianness: str) -> bytes:
    """vLLM's encoding: the vector as `dtype` (its `embed_dtype`), in `endianness`."""
    converted = vector.astype(_EMBED_DTYPES[dtype])
    if endianness not in ("native", sys.byteorder):
        converted = converted.byteswap()
    return converted.tobytes()


def _pieces(conversation: list[ChatMessage]) -> int:
    """A conversation's messages and content parts, which rendering walks one by one."""
    return sum(len(m.content) if isinstance(m.content, list) else 1 for m in conversation)


async def _infer(catalog: Catalog, request: InferRequest, param: str) -> InferResponse:
    """The model's answer to one input; its refusal names `param`, the field that held it."""
    try:
        return await catalog.core.infer(request)
    except ServerError as exc:
        own = ServerError(exc.code, _ENSEMBLE_PREFIX.sub("", exc.message), exc.reason)
        raise from_server_error(own, prompt_param=param) from None


def _request(model: ModelVersion, embedder: Embedder, text: str) -> InferRequest:
    shape = (1, 1) if model.max_batch_size > 0 else (1,)
    values = object_array([text.encode("utf-8")]).reshape(shape)
    tensor = Tensor(embedder.text_input.name, embedder.text_input.datatype, shape, values)
    return InferRequest(model_name=model.name, model_version=model.version_str, inputs=[tensor])


def _read(response: InferResponse, embedder: Embedder) -> tuple[np.ndarray[Any, Any], int]:
    outputs = {tensor.name: tensor for tensor in response.outputs}
    produced = outputs.get(embedder.vector_output.name)
    if produced is None:
        # A Python model or an ensemble may answer without an output (Triton leaves it out).
        raise OpenAIError(
            f"The model '{response.model_name}' did not produce its embedding output "
            f"'{embedder.vector_output.name}'",
            status=500,
            kind="server_error",
        )
    vector = np.asarray(produced.data, dtype=np.float32).reshape(-1)
    count = 0
    if embedder.token_count is not None and embedder.token_count.name in outputs:
        count = int(np.asarray(outputs[embedder.token_count.name].data).sum())
    return vector, count
