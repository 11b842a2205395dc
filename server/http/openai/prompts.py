"""The prompts of a /v1/completions request, in vLLM's (and OpenAI's) forms: a string, a
list of strings, a list of token ids (one prompt), or a list of lists of token ids.

Each prompt is generated `n` times, each sequence a request in the model's queue, so a
request holds at most MAX_PROMPTS prompts and MAX_SEQUENCES sequences (prompts x n):
OpenAI's bound on an embeddings request's inputs, far past a batch of lm-eval-harness's.

A token-id prompt goes to the model's `input_ids` input (generation.py), for a model that
has one; its ids are checked here only for being integers >= 0 (the model checks its
vocabulary). `echo` shows it as its ids decoded with the model's tokenizer, as vLLM does.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic_core import PydanticCustomError

from ge_serve.server.inference.model import ModelVersion

from .catalog import text_generation
from .errors import CONTEXT_LENGTH_EXCEEDED, OpenAIError

# A prompt: text, or token ids.
Prompt = str | list[int]

MAX_PROMPTS = 2048
MAX_SEQUENCES = 2048
# Texts (and id lists) longer than this are tokenized (decoded) on a worker thread; the
# llm backend's tokenizer releases the GIL for those (backends/llm/text.py).
THREADED = 1024
# Token-id prompts of more ids than this, in all, are converted to arrays on a worker thread.
IDS_INLINE = 1 << 16
TOKENIZER_MISSING = "tokenizer_missing"
# Past any model's vocabulary, and past what an INT32 `input_ids` and the tokenizer's decode
# take: such an id is refused here in vLLM's words, which the model would otherwise word
# as its input's range.
_ID_BOUND = 2**31
# orjson reads a JSON integer past 64 bits as a float.
_BIG = 2.0**63
_FORMS = (
    "Input should be a string, a list of strings, a list of token ids (integers) or a list "
    "of lists of token ids"
)


def _kind(item: object) -> str:
    if isinstance(item, str):
        return "text"
    if isinstance(item, int) and not isinstance(item, bool):
        return "id"
    if isinstance(item, float) and item.is_integer() and abs(item) >= _BIG:
        return "id"
    if isinstance(item, list) and all(_kind(i) == "id" for i in item):
        return "ids"
    return "other"


def form(value: Any) -> Any:
    """A `prompt` list checked before its type: one form throughout, ids >= 0 (a mixed
    list would otherwise be reported as "not a valid string")."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise PydanticCustomError("prompt_form", _FORMS)
    kinds = {_kind(item) for item in value}
    if len(kinds) > 1 or "other" in kinds:
        raise PydanticCustomError("prompt_form", _FORMS + ", not a mix")
    lists = value if kinds == {"ids"} else [value] if kinds == {"id"} else []
    ids = [i for item in lists for i in item]
    negative = next((i for i in ids if i < 0), None)
    if negative is not None:
        raise PydanticCustomError(
            "prompt_id", "token id {id} should be greater than or equal to 0", {"id": negative}
        )
    top = max(ids, default=0)
    if top >= _ID_BOUND:
        raise PydanticCustomError(
            "prompt_id", "Token id {id} is out of vocabulary", {"id": int(top)}
        )
    return value


def prompt_list(prompt: str | list[str] | list[int] | list[list[int]], n: int) -> list[Prompt]:
    """The request's prompts, checked: none empty, within the bounds."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompts: list[Prompt] = [prompt]  # type: ignore[list-item]
    else:
        prompts = list(prompt)  # type: ignore[arg-type]
    if not prompts:
        raise OpenAIError("'prompt' must not be an empty list", param="prompt")
    if len(prompts) > MAX_PROMPTS:
        raise OpenAIError(
            f"prompt list length {len(prompts)} exceeds the maximum allowed count of {MAX_PROMPTS}",
            param="prompt",
        )
    if len(prompts) * n > MAX_SEQUENCES:
        raise OpenAIError(
            f"{len(prompts)} prompts with n={n} are {len(prompts) * n} sequences; a request "
            f"generates at most {MAX_SEQUENCES}",
            param="prompt",
        )
    for item in prompts:
        if isinstance(item, list) and not item:
            # vLLM's words for a token-id prompt without ids.
            raise OpenAIError("The decoder prompt cannot be empty", param="prompt")
        if not item:
            # Triton's OpenAI front end refuses it so; a model would, in its own words.
            raise OpenAIError("'prompt' must not be empty", param="prompt")
    return prompts


def check_fit(prompts: list[Prompt], max_model_len: int) -> None:
    """Refuse a token-id prompt that leaves no room to generate, in the engine's (vLLM's)
    words, before its ids are copied into a request per sequence: a body of megabytes of
    ids would otherwise hold the event loop for seconds, n times over, to be refused."""
    for item in prompts:
        if isinstance(item, list) and 0 < max_model_len <= len(item):
            raise OpenAIError(
                f"This model's maximum context length is {max_model_len} tokens. However, "
                f"the prompt is {len(item)} tokens, which leaves no room to generate.",
                param="prompt",
                code=CONTEXT_LENGTH_EXCEEDED,
            )


async def echo_texts(model: ModelVersion, prompts: list[Prompt]) -> list[str]:
    """What `echo` shows of each prompt: the text, or the ids decoded (vLLM's), with the
    tokenizer the server holds for the model; all on a worker thread when they are many."""
    if all(isinstance(item, str) for item in prompts):
        return [str(item) for item in prompts]
    generation = text_generation(model)
    tokenizer = None if generation is None else generation.tokenizer
    if tokenizer is None:
        raise OpenAIError(
            f"'echo' of a token-id prompt needs the model's tokenizer, and the model "
            f"'{model.name}' has none ge-serve can use: it tokenizes inside the model",
            param="echo",
            code=TOKENIZER_MISSING,
        )

    def decoded() -> list[str]:
        # `form` bounded the ids. An id the tokenizer does not name decodes to nothing, as
        # in vLLM, and the model decides whether it is in its vocabulary.
        return [p if isinstance(p, str) else tokenizer.decode(p, False) for p in prompts]

    if sum(len(item) for item in prompts if isinstance(item, list)) > THREADED:
        return await asyncio.to_thread(decoded)
    return decoded()
