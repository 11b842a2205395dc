"""The /v1 request fields by what becomes of them: the sampling keys passed on to a model,
vLLM's extensions never served or served only at their default, and the chat template's
variables the server sets (schemas.py checks the bodies against these tables, with
`refuse_by_table`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ge_serve.server.control.chat import SERVER_VARIABLES

from .errors import OpenAIError, unsupported

# vLLM's bounds of a seed and of a request's priority: a signed 64-bit integer.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# The most choices one request may ask for: OpenAI's bound. vLLM's (VLLM_MAX_N_SEQUENCES,
# 16384) would let one request put thousands of generations in the model's queue; each
# choice is a request of its own to the model here, and the engine runs only so many at
# once anyway.
MAX_N = 128
# vLLM's: a temperature below this is greedy sampling.
GREEDY_BELOW = 1e-5

# The fields `Sampling.sampling` gives, by their vLLM sampling key (`stop` as a list, and
# `max_tokens` only where the client set a limit).
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "logit_bias",
    "length_penalty",
    "use_beam_search",
    "bad_words",
    "spaces_between_special_tokens",
    "allowed_token_ids",
    "truncate_prompt_tokens",
)
# vLLM's extensions that no model contract carries: refused whenever given.
NEVER_SERVED = {
    "prompt_embeds": "prompt embeddings",
    "repetition_detection": "repetition detection",
    "truncation_side": "prompt truncation side",
    "logits_processors": "logits processors",
}
# vLLM's fields that no model contract carries either, served only at the values that
# change nothing (vLLM's defaults; None: not given).
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "watermarking": (None, False),
    "vllm_xargs": (None, {}),
}


# vLLM's pooling extensions of /v1/embeddings (its EmbeddingCompletionRequest) that no
# embedding model's interface carries: the text goes to the model whole, as it was sent.
EMBEDDING_NEVER_SERVED = {
    "truncate_prompt_tokens": "prompt truncation",
    "truncation_side": "prompt truncation",
    "padding": "the tokenizer's padding",
}
# ... and those served only at their default: the model adds its tokenizer's special
# tokens and gives its vector as it pools it (the MiniLM ensemble's, normalised), so only
# vLLM's defaults describe what it does.
EMBEDDING_DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "add_special_tokens": (None, True),
    "use_activation": (None, True),
}
# vLLM's words for `normalize`, which it removed (a `false` would pass unnoticed).
REMOVED_NORMALIZE = "Parameter `normalize` was removed; use `use_activation` instead."


def refuse_by_table(
    body: object, never: Mapping[str, str], default_only: Mapping[str, tuple[Any, ...]]
) -> None:
    """A 400 `unsupported_parameter` for the first field of `body` that `never` lists and
    the request set, or that `default_only` lists at a value other than its defaults."""
    for name, feature in never.items():
        if getattr(body, name) is not None:
            raise unsupported(name, f"'{name}' ({feature}) is not supported")
    for name, neutral in default_only.items():
        if getattr(body, name) not in neutral:
            only = json.dumps(neutral[1])
            raise unsupported(name, f"'{name}' is not supported: only {only} (the default)")


def check_n(n: int | None, temperature: float | None) -> None:
    """vLLM's rules for `n` (>= 1 is pydantic's check): at most MAX_N, and 1 with greedy
    sampling, where the n answers would all be the same; in vLLM's words."""
    if n is None or n == 1:
        return
    if n > MAX_N:
        raise OpenAIError(f"n must be at most {MAX_N}, got {n}.", param="n")
    if temperature is not None and temperature < GREEDY_BELOW:
        raise OpenAIError(f"n must be 1 when using greedy sampling, got {n}.", param="n")


def check_best_of(best_of: int | None, n: int | None) -> None:
    """`best_of` (completions; vLLM 0.34 no longer reads it): only where it asks for no
    ranking, the n choices themselves."""
    if best_of is not None and best_of != (n or 1):
        raise unsupported(
            "best_of", "Only best_of equal to n is supported: the choices are not ranked"
        )


def refuse_template_controls(
    continue_final_message: bool,
    add_generation_prompt: bool,
    kwargs: Mapping[str, Any] | None,
    default_note: str = "",
) -> None:
    """vLLM's rules for a request's chat template controls (chat's, and the chat forms of
    the embedding routes), each a 400 naming its field; `default_note` says where
    `add_generation_prompt` defaults to true. (A request's own `chat_template` is
    refused where the template is chosen, unless trusted: catalog.py.)"""
    if continue_final_message and add_generation_prompt:
        raise OpenAIError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True"
            f"{default_note}.",
            param="continue_final_message",
        )
    clashing = sorted(SERVER_VARIABLES.intersection(kwargs or {}))
    if clashing:
        raise OpenAIError(
            f"Found unexpected chat template kwargs from request: {clashing}. These "
            "are set by the server or by the request's own fields",
            param=f"chat_template_kwargs.{clashing[0]}",
        )
