"""`POST /v1/embeddings`: one vector per input string, from any embedding model.

Each string is one request to the model (its BYTES input holds one element), all sent at
once, so the model's own scheduler batches them as it batches any clients' requests (the
MiniLM pipeline pads and merges them by length); the vectors come back in input order.

`encoding_format` `float` gives JSON numbers; `base64` gives the vector's bytes in base64:
little-endian float32 by default, as OpenAI's clients decode them, or vLLM's
`embed_dtype` (float16, bfloat16, fp8 e4m3 or e5m2, converted as torch converts them,
rounding to nearest) in its `endianness` ("native": this machine's), as vLLM encodes
them; `float` ignores both, as vLLM's does. `usage.prompt_tokens` is the
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

import base64
import re
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from ge_serve.server.errors import ServerError
from ge_serve.server.inference.model import ModelVersion
from ge_serve.server.inference.types import InferRequest, InferResponse, Tensor
from ge_serve.server.inference.wire import object_array

from .catalog import Catalog, Embedder
from .choices import all_of
from .errors import OpenAIError, from_server_error
from .schemas import EmbeddingRequest

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


async def embeddings(
    catalog: Catalog, body: EmbeddingRequest, request_id: str = ""
) -> dict[str, Any]:
    """The answer, whose `id` (vLLM's, which OpenAI's lacks) is `embd-` and `request_id`
    (the client's, text.request_id) or a fresh one."""
    model, embedder = catalog.embedding(body.model)
    texts = body.texts()
    size = embedder.vector_output.dims[0]
    if body.dimensions is not None and size > 0:
        _check_dimensions(body, size)  # before the model runs, where its size is declared
    listed = not isinstance(body.input, str)
    params = [f"input[{i}]" if listed else "input" for i in range(len(texts))]
    data = []
    tokens = 0
    for index, (vector, count) in enumerate(await embed(catalog, model, embedder, texts, params)):
        if body.dimensions is not None:
            _check_dimensions(body, vector.size)
        tokens += count
        encoded: Any
        if body.encoding_format == "base64":
            encoded = _base64(vector, body.embed_dtype, body.endianness)
        else:
            encoded = vector.tolist()
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    return {
        "id": "embd-" + (request_id or uuid.uuid4().hex),
        "object": "list",
        "created": int(time.time()),
        "data": data,
        "model": body.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


async def embed(
    catalog: Catalog,
    model: ModelVersion,
    embedder: Embedder,
    texts: Sequence[str],
    params: Sequence[str],
) -> list[tuple[np.ndarray[Any, Any], int]]:
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


def _check_dimensions(body: EmbeddingRequest, size: int) -> None:
    if body.dimensions != size:
        raise OpenAIError(
            f"The model '{body.model}' gives {size} dimensions; 'dimensions' cannot change it",
            param="dimensions",
        )


def _base64(vector: np.ndarray[Any, Any], embed_dtype: str, endianness: str) -> str:
    """vLLM's base64 encoding: the vector as `embed_dtype`, in `endianness`."""
    converted = vector.astype(_EMBED_DTYPES[embed_dtype])
    if endianness not in ("native", sys.byteorder):
        converted = converted.byteswap()
    return base64.b64encode(converted.tobytes()).decode("ascii")


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
