"""The /v1 request fields by what becomes of them: the sampling keys passed on to a model,
vLLM's extensions never served or served only at their default, and the chat template's
variables the server sets (schemas.py checks the bodies against these tables)."""

from __future__ import annotations

from typing import Any

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
    "length_penalty",
    "use_beam_search",
    "bad_words",
    "spaces_between_special_tokens",
    "allowed_token_ids",
    "truncate_prompt_tokens",
)
# vLLM's extensions that no model contract carries: refused whenever given.
NEVER_SERVED = {
    "guided_json": "guided decoding",
    "guided_regex": "guided decoding",
    "guided_choice": "guided decoding",
    "guided_grammar": "guided decoding",
    "structured_outputs": "guided decoding",
    "prompt_logprobs": "logprobs",
    "logprob_token_ids": "logprobs",
    "prompt_embeds": "prompt embeddings",
    "repetition_detection": "repetition detection",
    "truncation_side": "prompt truncation side",
    "logits_processors": "logits processors",
}
# vLLM's fields that no model contract carries either, served only at the values that
# change nothing (vLLM's defaults; None: not given).
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "return_token_ids": (None, False),
    "watermarking": (None, False),
    "priority": (None, 0),
    "thinking_token_budget": (None, -1),
    "vllm_xargs": (None, {}),
}


# The chat template's variables that the server sets, never from `chat_template_kwargs`:
# vLLM refuses `chat_template` and `tokenize` there, and the rest are the request's own.
SERVER_VARIABLES = frozenset({"chat_template", "tokenize", "messages", "tools", "documents"})
