"""vLLM's generic pooling route, `POST /pooling`, for the embedding models /v1/embeddings
serves: what vLLM 0.34's /pooling answers for an embedding model, whose pooling task is
`embed` (the pooled vector, as /v1/embeddings gives it).

The body is /v1/embeddings' (`input` text or vLLM's chat form `messages`, the encodings,
the pooling fields: embed_schemas.py) with vLLM's `task`: `embed` (the default) is
served; the tasks an embedding model here has not (`token_embed`: its interface gives no
per-token vectors; `classify`...) are refused in vLLM's words, as are `dimensions` (vLLM's
/pooling takes none) and a plugin's `data`. The inputs are embedded as /v1/embeddings
embeds them (embeddings.vectors: one request each, all at once, the rest cancelled when
one is refused or the client leaves), and the answer is vLLM's PoolingResponse.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .catalog import Catalog
from .embed_schemas import PoolingRequest
from .embeddings import Vectors, answered, binary, encoded, vectors
from .scoring import served
from .text import request_id


async def pooling(catalog: Catalog, request: Request, body: PoolingRequest) -> Response:
    """vLLM's PoolingResponse, or its octet-stream answer (encoded as answered() does)."""
    name, model, embedder = await served(catalog, body.model, "Pooling API")
    found = await vectors(catalog, model, embedder, body)
    given = request_id(request, body.request_id) or uuid.uuid4().hex
    answer_id, created = f"pooling-{given}", int(time.time())
    return await answered(lambda: _answer(body, answer_id, created, name, found), found)


def _answer(
    body: PoolingRequest, answer_id: str, created: int, name: str, found: Vectors
) -> dict[str, Any] | Response:
    if body.encoding_format in ("bytes", "bytes_only"):
        return binary(body, answer_id, created, name, found)
    tokens = sum(count for _, count in found)
    return {
        "id": answer_id,
        "object": "list",
        "created": created,
        "model": name,
        "data": [
            {"index": index, "object": "pooling", "data": encoded(vector, body)}
            for index, (vector, _) in enumerate(found)
        ],
        # vLLM's UsageInfo, as it dumps it.
        "usage": {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "completion_tokens": 0,
            "completion_tokens_details": None,
        },
    }
