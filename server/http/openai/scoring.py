"""vLLM's scoring routes for the embedding models /v1/embeddings serves: `POST /score`
(and `/v1/score`) and `POST /rerank` (and `/v1/rerank`, `/v2/rerank`), as vLLM 0.34
serves them for an embedding model (its bi-encoder scoring): each text embedded on its
own, and a pair's score the cosine similarity of its two texts' vectors.

A score request pairs its first texts with its second: vLLM's forms `queries` and
`documents` (or `items`), `data_1` and `data_2`, `text_1` and `text_2`; each a string or a
list of them. One first text is scored against every second one (1:N), else the two lists
pair up in order (N:N) and must be as long. A rerank request scores `query` against each
of `documents` and answers them by relevance, highest first, the first `top_n` (0: all).
Lengths and refusals are in vLLM's words.

Each distinct text of a request is embedded once (a query against N documents is N + 1
requests to the model), all at once, as embeddings.py sends them. The vectors are
normalised here (the model's may or may not be), so a model that pools without
normalising scores as vLLM scores it. `usage` counts the model's `num_input_tokens` of
every text as vLLM counts its prompts (a repeated text once per place it is given).
"""

from __future__ import annotations

import time
import uuid
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, RootModel
from starlette.requests import Request

from ge_serve.server.inference.model import ModelVersion

from . import fields
from .catalog import Catalog, Embedder, embedder, is_generative
from .embed_schemas import MAX_EMBEDDING_INPUTS
from .embeddings import embed
from .errors import OpenAIError, model_not_found, unsupported
from .messages import Body
from .text import request_id

# vLLM's multimodal input (its ScoreMultiModalParam, `{"content": [parts]}`): parsed to be
# refused by name, since no embedding model here takes anything but text.
_Text = str | dict[str, Any]
# torch's cosine_similarity's floor under the product of the norms (vLLM's score): a
# zero vector scores 0, not NaN.
_EPS = 1e-8

# vLLM's scoring fields that no embedding model's interface carries: the text goes to
# the model whole, as sent, and there is no chat template to give an instruction to.
NEVER_SERVED = {
    "truncate_prompt_tokens": "prompt truncation",
    "truncation_side": "prompt truncation",
    "padding": "the tokenizer's padding",
    "instruction": "an instruction for the score template",
}
# ... and those served only at vLLM's defaults (max_tokens_per_*: 0, no truncation).
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "max_tokens_per_query": (None, 0),
    "max_tokens_per_doc": (None, 0),
    "chat_template_kwargs": (None, {}),
}


class _Scoring(Body):
    """vLLM's fields common to /score and /rerank (its ScoringRequestMixin)."""

    # vLLM's: optional; here, without it, the one embedding model the server serves.
    model: str | None = Field(None, min_length=1)
    user: str | None = None
    # vLLM's: the answer's id is `score-` and this (an `X-Request-Id` header wins).
    request_id: str | None = None
    # vLLM's pooling fields, with its checks (the tables above: which are served).
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    padding: Literal["max_length", "do_not_pad"] | None = None
    # Accepted and ignored: no engine queue to order (vLLM's `fcfs` ignores it too).
    priority: int | None = Field(None, ge=fields.INT64_MIN, le=fields.INT64_MAX)
    max_tokens_per_query: int | None = Field(None, ge=0)
    max_tokens_per_doc: int | None = Field(None, ge=0)
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # For an embedding model, vLLM's activation is the vector's normalisation, which a
    # cosine does not see: any value scores the same.
    use_activation: bool | None = None
    # Removed by vLLM, which refuses it, as here.
    normalize: Any = None

    def refuse_unsupported(self) -> None:
        if "normalize" in self.model_fields_set:
            raise OpenAIError(fields.REMOVED_NORMALIZE, param="normalize")
        fields.refuse_by_table(self, NEVER_SERVED, DEFAULT_ONLY)

    # The form's two fields: the first texts, then the second.
    KEYS: ClassVar[tuple[str, str]]

    def pair(self) -> tuple[str, _Text | list[_Text], str, _Text | list[_Text]]:
        """The first texts and the second, each with its field's name."""
        first, second = self.KEYS
        return first, getattr(self, first), second, getattr(self, second)


class ScoreQueriesDocuments(_Scoring):
    KEYS = ("queries", "documents")
    queries: _Text | list[_Text]
    documents: _Text | list[_Text]


class ScoreQueriesItems(_Scoring):
    KEYS = ("queries", "items")
    queries: _Text | list[_Text]
    items: _Text | list[_Text]


class ScoreData(_Scoring):
    KEYS = ("data_1", "data_2")
    data_1: _Text | list[_Text]
    data_2: _Text | list[_Text]


class ScoreText(_Scoring):
    KEYS = ("text_1", "text_2")
    text_1: _Text | list[_Text]
    text_2: _Text | list[_Text]


class RerankRequest(_Scoring):
    KEYS = ("query", "documents")
    query: _Text
    documents: _Text | list[_Text]
    top_n: int = Field(0, ge=0)


ScoreForm = (
    type[ScoreQueriesDocuments] | type[ScoreQueriesItems] | type[ScoreData] | type[ScoreText]
)


_FORMS: tuple[ScoreForm, ...] = (ScoreQueriesDocuments, ScoreQueriesItems, ScoreData, ScoreText)


class ScoreRequest(RootModel[ScoreQueriesDocuments | ScoreQueriesItems | ScoreData | ScoreText]):
    """Any of vLLM's forms, as the OpenAPI document describes /score's body."""


def form(document: Any) -> ScoreForm:
    """Which of vLLM's forms a /score body is: the first, in vLLM's order, whose two
    fields it has; else `queries` and `documents` (vLLM's documented form), whose missing
    field is then named."""
    if isinstance(document, dict):
        for schema in _FORMS:
            if all(key in document for key in schema.KEYS):
                return schema
    return ScoreQueriesDocuments


async def score(catalog: Catalog, request: Request, body: _Scoring) -> dict[str, Any]:
    """vLLM's ScoreResponse: one `score` object per pair, in the pairs' order."""
    name, scores, tokens = await _scores(catalog, body, "Score API")
    return {
        "id": "score-" + (request_id(request, body.request_id) or uuid.uuid4().hex),
        "object": "list",
        "created": int(time.time()),
        "model": name,
        "data": [
            {"index": index, "object": "score", "score": value}
            for index, value in enumerate(scores)
        ],
        # vLLM's UsageInfo, as it dumps it.
        "usage": {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "completion_tokens": 0,
            "completion_tokens_details": None,
        },
    }


async def rerank(catalog: Catalog, request: Request, body: RerankRequest) -> dict[str, Any]:
    """vLLM's RerankResponse: the documents by relevance, highest first, the first `top_n`
    of them (0: all)."""
    name, scores, tokens = await _scores(catalog, body, "Rerank (Score) API")
    documents = body.documents if isinstance(body.documents, list) else [body.documents]
    # Sorted as (index, score) pairs, a stable sort: equal scores keep the documents' order.
    ranked = sorted(enumerate(scores), key=lambda pair: pair[1], reverse=True)
    if 0 < body.top_n < len(ranked):
        ranked = ranked[: body.top_n]
    results = [
        {
            "index": index,
            "document": {"text": documents[index], "multi_modal": None},
            "relevance_score": value,
        }
        for index, value in ranked
    ]
    return {
        "id": "score-" + (request_id(request, body.request_id) or uuid.uuid4().hex),
        "model": name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": results,
    }


async def _scores(catalog: Catalog, body: _Scoring, api: str) -> tuple[str, list[float], int]:
    """(the model's name, each pair's cosine, the texts' tokens)."""
    name, model, found = await served(catalog, body.model, api)
    first_name, first, second_name, second = body.pair()
    firsts, seconds = _texts(first_name, first), _texts(second_name, second)
    _check_lengths(len(firsts), len(seconds), second_name)
    # Each distinct text once, named by the first field that holds it.
    distinct: dict[str, str] = {}
    for text, param in (*firsts, *seconds):
        distinct.setdefault(text, param)
    embedded = await embed(catalog, model, found, list(distinct), list(distinct.values()))
    vectors = dict(zip(distinct, embedded, strict=True))
    # vLLM's count: its prompts, one query (1:N) or one per pair, and every second text.
    tokens = sum(vectors[text][1] for text, _ in (*firsts, *seconds))
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    pairs = zip(firsts, seconds, strict=True)
    scores = [_cosine(vectors[a][0], vectors[b][0]) for (a, _), (b, _) in pairs]
    return name, scores, tokens


def _texts(name: str, value: _Text | list[_Text]) -> list[tuple[str, str]]:
    """(text, the field that holds it) of a string or a list; multimodal input refused."""
    given = value if isinstance(value, list) else [value]
    found = []
    for index, text in enumerate(given):
        param = f"{name}[{index}]" if isinstance(value, list) else name
        if not isinstance(text, str):
            # vLLM's words for a model that takes text only.
            raise unsupported(param, "MultiModalParam is not supported: give text")
        found.append((text, param))
    return found


def _check_lengths(first: int, second: int, second_name: str) -> None:
    """vLLM's pairing rules, in its words; and embeddings' bound on a request's texts."""
    if first > 1 and first != second:
        raise OpenAIError("Input lengths must be either 1:1, 1:N or N:N", param=second_name)
    if first == 0:
        raise OpenAIError("At least one text element must be given")
    if second == 0:
        raise OpenAIError("At least one text_pair element must be given", param=second_name)
    if first + second > MAX_EMBEDDING_INPUTS:
        raise OpenAIError(
            f"The request holds {first + second} texts; at most {MAX_EMBEDDING_INPUTS}",
            param=second_name,
        )


def _cosine(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    """vLLM's score: torch's cosine_similarity, in float32."""
    a, b = a.astype(np.float32), b.astype(np.float32)
    norms = float(np.linalg.norm(a)) * float(np.linalg.norm(b))
    return float(np.float32(np.dot(a, b)) / np.float32(max(norms, _EPS)))


async def served(
    catalog: Catalog, name: str | None, api: str
) -> tuple[str, ModelVersion, Embedder]:
    """The embedding model a request of vLLM's `api` names (or, without a name, the
    server's one embedding model), and how it is called."""
    name = catalog.embedder_name(name)
    model = catalog.model(name)
    found = embedder(model)
    if found is None:
        if is_generative(model):
            # vLLM's words where a model serves no such route (its 501; a client's 400
            # here, since another model of this server does).
            raise OpenAIError(
                f"The model does not support {api}: '{name}' is not an embedding model",
                param="model",
            )
        raise model_not_found(name)
    return name, model, found
