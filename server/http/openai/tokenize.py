"""vLLM's `POST /tokenize` and `POST /detokenize`, for the models whose tokenizer the
server holds (the `llm` backend's).

`/tokenize` takes vLLM's two forms: a completion's (`prompt`, `add_special_tokens`
default true) and a chat's (`messages` and the chat route's template controls,
`add_special_tokens` default false since the template writes the special tokens). A
chat is rendered by template.py exactly as /v1/chat/completions renders it, with its
rules and refusals (the body is the chat route's schema), and `tools` reach the
template as chat passes them (`tool_choice` is not checked: nothing is generated). The
answer is vLLM's `{count, max_model_len, tokens, token_strs}` (`token_strs` only with
`return_token_strs`, each id's token as the vocabulary spells it).

`/detokenize` answers `{prompt}`, the ids decoded with their special tokens, as vLLM's
decode does. An id the vocabulary does not have is a 400 in vLLM's words for token-id
prompts ("Token id N is out of vocabulary"); vLLM's /detokenize drops such an id from
the text, or fails with a 500 past 2**32.

A model that tokenizes inside itself (a Python model, the MiniLM ensemble's Python
step) has no tokenizer the server can reach: a 400 that says so. A model /v1 does not
serve at all is a 404, as on /v1.

`GET /tokenizer_info` (vLLM's, where it is enabled) answers what lm-eval-harness's remote
tokenizer reads of it, from what the server holds: the class transformers builds from a
`tokenizer.json`, the special tokens, the context length and the chat template. vLLM's
answer is the tokenizer's whole `tokenizer_config.json`, which ge-serve does not have.
vLLM serves it only with `--enable-tokenizer-info-endpoint` (as it may show the chat
template); here it is always served, and the flag is taken and changes nothing: the
template is what `/tokenize` renders chats with, and nothing else (no path) is shown.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from pydantic import Field, RootModel

from ge_serve.backends.base import TextGeneration, TextTokenizer

from .catalog import Catalog, embedder, is_generative, text_generation
from .errors import OpenAIError, model_not_found
from .prompts import THREADED, TOKENIZER_MISSING
from .schemas import Body, ChatCompletionRequest
from .text import chat_prompt
from .tools import template_tools

# The most ids one /detokenize takes, counted before they are checked: checking (and
# decoding) millions of ids holds the interpreter for seconds, stalling every other
# request. Far past any model's context, so only a runaway client meets it.
MAX_IDS = 2**18


class TokenizeCompletionRequest(Body):
    # vLLM's: optional, its one served model by default (lm-eval's remote tokenizer
    # sends none); here, the one model whose tokenizer the server holds.
    model: str | None = Field(None, min_length=1)
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(ChatCompletionRequest):
    """The chat route's body (its template controls, checked by its rules), plus the
    tools a template may print and /tokenize's own fields. Its sampling fields change
    nothing here."""

    add_special_tokens: bool = False  # type: ignore[assignment]
    return_token_strs: bool | None = False

    def refuse_unsupported(self) -> None:
        self._refuse_template_controls()
        self._refuse_message_parts()


def ids_bounded(document: Any) -> None:
    """Refuse a /detokenize of more than MAX_IDS ids before they are checked."""
    if isinstance(document, dict):
        tokens = document.get("tokens")
        if isinstance(tokens, list) and len(tokens) > MAX_IDS:
            raise OpenAIError(
                f"'tokens' holds {len(tokens)} ids; at most {MAX_IDS} are detokenized at once",
                param="tokens",
            )


class DetokenizeRequest(Body):
    model: str | None = Field(None, min_length=1)
    # vLLM's bounds.
    tokens: list[Annotated[int, Field(ge=0, le=2**63 - 1)]]


class TokenizeRequest(RootModel[TokenizeCompletionRequest | TokenizeChatRequest]):
    """Either form, as the OpenAPI document describes /tokenize's body."""


def form(document: Any) -> type[TokenizeCompletionRequest] | type[TokenizeChatRequest]:
    """Which of vLLM's forms a /tokenize body is: a chat's when it has `messages`."""
    if isinstance(document, dict) and "messages" in document:
        if "prompt" in document:
            raise OpenAIError(
                "Give 'prompt' (a completion's) or 'messages' (a chat's), not both",
                param="prompt",
            )
        return TokenizeChatRequest
    return TokenizeCompletionRequest


async def named(catalog: Catalog, name: str | None) -> str:
    """The request's model; without one, the only model whose tokenizer the server holds
    (vLLM's default, its one served model), else the missing parameter's 400."""
    if name is not None:
        return name
    found = []
    for entry, model in catalog.ready():
        generation = text_generation(model) if is_generative(model) else None
        if generation is not None and generation.tokenizer is not None:
            found.append(entry)
    if len(found) != 1:
        raise OpenAIError(
            f"Missing required parameter: 'model' ({len(found)} models here have a "
            "tokenizer the server holds)",
            param="model",
        )
    return found[0]


def tokenizer_of(catalog: Catalog, name: str) -> tuple[TextGeneration, TextTokenizer]:
    model = catalog.model(name)
    if not is_generative(model):
        if embedder(model) is None:
            raise model_not_found(name)
    else:
        generation = text_generation(model)
        if generation is not None and generation.tokenizer is not None:
            return generation, generation.tokenizer
    raise OpenAIError(
        f"The model '{name}' has no tokenizer ge-serve can use: it tokenizes inside the "
        "model. /tokenize and /detokenize serve the models whose tokenizer the server "
        "holds (the llm backend's)",
        param="model",
        code=TOKENIZER_MISSING,
    )


async def tokenize(
    catalog: Catalog, body: TokenizeCompletionRequest | TokenizeChatRequest
) -> dict[str, Any]:
    name = await named(catalog, body.model)
    generation, tokenizer = tokenizer_of(catalog, name)
    if isinstance(body, TokenizeChatRequest):
        generation = catalog.chat_generation(name, catalog.model(name), body.chat_template)
        prompt = await chat_prompt(catalog, generation, body, template_tools(body.tools))
    else:
        prompt = body.prompt
    special = body.add_special_tokens
    if len(prompt) > THREADED:
        tokens = await asyncio.to_thread(tokenizer.encode, prompt, special)
    else:
        tokens = tokenizer.encode(prompt, special)
    return {
        "count": len(tokens),
        "max_model_len": generation.max_model_len,
        "tokens": tokens,
        "token_strs": tokenizer.token_strings(tokens) if body.return_token_strs else None,
    }


async def detokenize(catalog: Catalog, body: DetokenizeRequest) -> dict[str, Any]:
    _, tokenizer = tokenizer_of(catalog, await named(catalog, body.model))
    unknown = tokenizer.unknown_id(body.tokens)
    if unknown is not None:
        # vLLM's words for a token-id prompt's id past the vocabulary (the largest).
        raise OpenAIError(f"Token id {unknown} is out of vocabulary", param="tokens")
    if len(body.tokens) > THREADED:
        return {"prompt": await asyncio.to_thread(tokenizer.decode, body.tokens, False)}
    return {"prompt": tokenizer.decode(body.tokens, False)}


async def tokenizer_info(catalog: Catalog, name: str | None) -> dict[str, Any]:
    """vLLM's tokenizer configuration, as far as the server knows it (`model`: a query
    parameter, ge-serve's, for a server with several tokenizers)."""
    model = await named(catalog, name)
    generation, _ = tokenizer_of(catalog, model)
    found: dict[str, Any] = {
        # What transformers' AutoTokenizer builds from a lone tokenizer.json.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": generation.max_model_len,
    }
    for key, token in (("bos_token", generation.bos_token), ("eos_token", generation.eos_token)):
        if token:
            found[key] = token
    shown = catalog.templated(catalog.model(model))  # --chat-template's, as vLLM shows it
    if shown is not None and shown.chat_template is not None:
        found["chat_template"] = shown.chat_template
    return found
