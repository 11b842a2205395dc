"""Per-request sampling parameters (vLLM's names and meanings), which sampler.py follows.

Parameters come from three places, later ones winning: the model's defaults, the
request's parameters (Triton's generate `parameters` object, where vLLM's backend reads
them too), then the `sampling_parameters` JSON input and the `max_tokens` input. In the
request's parameters, keys this engine does not know are left alone: that map also
carries the request id and whatever else a client tags its request with. In
`sampling_parameters`, whose only purpose is sampling, an unknown key is an error, so a
misspelt `temprature` is not silently ignored; vLLM keys whose feature is not
implemented are accepted only at their neutral value. The logits processors' keys
(penalties, `min_p`, `logit_bias`, `allowed_token_ids`, `bad_words`) are checked here
with vLLM's ranges and words; what needs the vocabulary is checked in logits.py.
Numbers may be given as strings (Triton's vLLM examples send `{"temperature": "0.1"}`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .settings import SamplingDefaults
from .structured import Structured, parse_structured
from .thinking import KEYS as THINKING_KEYS
from .thinking import Thinking, thinking_of


class SamplingError(ValueError):
    """A request's sampling parameters are invalid (answered as INVALID_ARG)."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    # None: as many as the context leaves room for, up to the model's default.
    max_tokens: int | None
    temperature: float = 1.0
    top_p: float = 1.0
    # 0: no top-k cut.
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # ge-serve's `kept_special_tokens`: special tokens whose text stays where the others'
    # is skipped (a parser's tags: Mistral's `[THINK]`, `[TOOL_CALLS]`).
    kept_special_tokens: tuple[str, ...] = ()
    # vLLM's request field `add_special_tokens`: false, a text prompt goes without the BOS.
    add_special_tokens: bool = True
    # vLLM's: the top-N log probabilities per sampled token (0: the sampled one's only,
    # -1: the whole vocabulary); None: none computed.
    logprobs: int | None = None
    # vLLM's `prompt_logprobs`: the same per prompt token (its first excepted); None: none.
    prompt_logprobs: int | None = None
    # vLLM's `logprob_token_ids`: the ids whose log probabilities each sampled token's
    # entry holds beside its own, in place of the top N (logprobs.py checks them).
    logprob_token_ids: tuple[int, ...] | None = None
    # vLLM's logits processors (logits.py applies them; min_p is the sampler's).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    # token id -> bias, clamped to [-100, 100] as vLLM clamps it.
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()

    @property
    def num_logprobs(self) -> int | None:
        """vLLM's: how many log probabilities each sampled token gets besides its own,
        `logprobs`, or without it, one per `logprob_token_ids`; None: none computed."""
        if self.logprobs is not None:
            return self.logprobs
        return len(self.logprob_token_ids) if self.logprob_token_ids else None

    @property
    def processes_logits(self) -> bool:
        """Whether a logits processor runs before the sampler (min_p is the sampler's)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
            or self.allowed_token_ids is not None
            or self.bad_words
        )

    # vLLM's `structured_outputs` (structured.py); None: unconstrained.
    structured: Structured | None = None
    # ge-serve's `structured_outputs_after`: the grammar waits until the answer's text
    # has written this (a thinking model's `</think>`); None: it applies from the start.
    structured_after: str | None = None
    # vLLM's `thinking_token_budget`, with ge-serve's keys for its markers (thinking.py).
    thinking: Thinking | None = None
    # vLLM's request priority (lower first), which `scheduling_policy` "priority" orders
    # the waiting queue by; "fcfs" ignores it.
    priority: int = 0

    @property
    def greedy(self) -> bool:
        # vLLM's rule: below this the logits divided by the temperature overflow to
        # inf (1e-310 gave NaN probabilities and garbage), and the answer is the
        # argmax anyway.
        return self.temperature < _GREEDY_BELOW


# vLLM's _SAMPLING_EPS.
_GREEDY_BELOW = 1e-5
# What one request may ask to be checked for after every token: each stop string is
# searched for at each step (vLLM sets no limit; OpenAI allows 4 strings).
MAX_STOPS = 64
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024

_FLOATS = ("temperature", "top_p")
# Given only where the request gives them (their defaults are SamplingParams').
_PROCESSOR_FLOATS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_p")
# vLLM's limits on what one request's processors hold (its v1 sampler's buffers, and
# VLLM_MAX_NUM_BAD_WORDS / VLLM_MAX_BAD_WORDS_TOTAL_TOKENS): each is looked at every token.
MAX_LOGIT_BIAS = 1024
MAX_ALLOWED_TOKEN_IDS = 1024
MAX_BAD_WORDS = 128
MAX_BAD_WORD_TOKENS = 1024
MAX_BAD_WORD_BYTES = 64 * 1024
# vLLM's clamp of a logit bias.
_BIAS_BOUND = 100.0
_INTS = ("max_tokens", "top_k", "seed", "min_tokens")
_BOOLS = ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens")
# ge-serve's key: structured outputs after a thinking model's thoughts (vLLM's servers
# know the end of the thoughts from their --reasoning-parser; the engine does not).
AFTER = "structured_outputs_after"
MAX_AFTER_CHARS = 256
# ge-serve's key: the special tokens decoding keeps (vLLM's decoding of mistral-common's
# tokenizer keeps its tool-call and thinking tags; a tokenizer.json's has no such list).
KEPT = "kept_special_tokens"
MAX_KEPT = 16
MAX_KEPT_CHARS = 64
# vLLM's request priority (not one of its SamplingParams: its generate() takes it beside
# them), taken in `sampling_parameters` only: a request parameter `priority` is Triton's
# (types.py reads it as the request's priority level).
PRIORITY = "priority"
SPECIAL = "add_special_tokens"  # likewise a request field of vLLM's, taken in either place
# vLLM's bounds of it on /v1: a signed 64-bit integer.
PRIORITY_BOUNDS = (-(2**63), 2**63 - 1)
# vLLM keys accepted only at their neutral value (the feature is not implemented).
_NEUTRAL: dict[str, Any] = {
    "n": 1,
    "best_of": 1,
    "spaces_between_special_tokens": True,
    "detokenize": True,
}
_LISTS = ("stop", "stop_token_ids", "logit_bias", "allowed_token_ids", "bad_words")
KNOWN_KEYS = frozenset(
    (
        *_FLOATS,
        *_PROCESSOR_FLOATS,
        *_INTS,
        *_BOOLS,
        *_LISTS,
        "logprobs",
        "prompt_logprobs",
        "logprob_token_ids",
        "structured_outputs",
        AFTER,
        KEPT,
        *THINKING_KEYS,
        *_NEUTRAL,
    )
)


def sampling_params(
    defaults: SamplingDefaults,
    parameters: Mapping[str, Any],
    sampling_json: bytes | None,
    max_tokens: int | None,
) -> SamplingParams:
    """The request's parameters; SamplingError says what is wrong."""
    values: dict[str, Any] = {
        "temperature": defaults.temperature,
        "top_p": defaults.top_p,
        "top_k": defaults.top_k,
    }
    for key, value in parameters.items():
        if key in KNOWN_KEYS or key == SPECIAL:
            values[key] = value
    if sampling_json is not None:
        try:
            doc = json.loads(sampling_json) if sampling_json.strip() else {}
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise SamplingError(f"sampling_parameters is not valid JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise SamplingError("sampling_parameters must be a JSON object")
        unknown = sorted(set(doc) - KNOWN_KEYS - {PRIORITY, SPECIAL})
        if unknown:
            known = sorted((*KNOWN_KEYS, PRIORITY, SPECIAL))
            raise SamplingError(f"sampling_parameters: unknown key(s) {unknown}; known: {known}")
        values.update(doc)
    if max_tokens is not None:
        values["max_tokens"] = max_tokens
    return _validated(values)


def _validated(values: dict[str, Any]) -> SamplingParams:
    out: dict[str, Any] = {}
    for key in _FLOATS:
        out[key] = _float(key, values[key])
    for key in _INTS:
        if key in values and values[key] is not None:
            out[key] = _int(key, values[key])
    for key in (*_BOOLS, SPECIAL):
        if key in values:
            out[key] = _bool(key, values[key])
    for key in ("logprobs", "prompt_logprobs"):
        count = values.get(key)
        if count is not None:
            # vLLM's: true is 1 (its SamplingParams), false 0.
            out[key] = int(count) if isinstance(count, bool) else _int(key, count)
    chosen = values.get("logprob_token_ids")
    if chosen is not None:
        if not isinstance(chosen, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in chosen
        ):
            raise SamplingError("logprob_token_ids must be a list of token ids")
        out["logprob_token_ids"] = tuple(chosen)  # bounds: logprobs.check_token_ids
    prompt = out.get("prompt_logprobs")
    if prompt is not None and prompt < 0 and prompt != -1:
        raise SamplingError(f"prompt_logprobs must be non-negative or -1, got {prompt}.")
    for key, neutral in _NEUTRAL.items():
        if (
            key in values
            and values[key] != neutral
            and not (neutral is not None and _same_number(values[key], neutral))
        ):
            raise SamplingError(
                f"sampling parameter {key}={values[key]!r} is not supported (only {neutral!r})"
            )
    temperature, top_p = out["temperature"], out["top_p"]
    if temperature < 0 or not math.isfinite(temperature):
        raise SamplingError(f"temperature must be a finite number >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise SamplingError(f"top_p must be in (0, 1], got {top_p}")
    out.setdefault("max_tokens", None)
    if out["max_tokens"] is not None and out["max_tokens"] < 1:
        raise SamplingError(f"max_tokens must be at least 1, got {out['max_tokens']}")
    top_k = out.get("top_k", 0)
    if top_k == -1:  # vLLM's "off"
        out["top_k"] = 0
    elif top_k < 0:
        raise SamplingError(f"top_k must be -1, 0 (off) or positive, got {top_k}")
    if out.get("min_tokens", 0) < 0:
        raise SamplingError("min_tokens must not be negative")
    if out["max_tokens"] is not None:
        check_min_tokens(out.get("min_tokens", 0), out["max_tokens"])
    seed = out.get("seed")
    if seed is not None and seed < 0:
        raise SamplingError(f"seed must not be negative, got {seed}")
    out["stop"] = _stop(values.get("stop"))
    ids = values.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise SamplingError("stop_token_ids must be a list of token ids")
    if len(ids) > MAX_STOP_TOKEN_IDS:
        raise SamplingError(
            f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} token ids, got {len(ids)}"
        )
    out["stop_token_ids"] = tuple(ids)
    _processors(values, out)
    if values.get("structured_outputs") is not None:
        try:
            out["structured"] = parse_structured(values["structured_outputs"])
        except ValueError as exc:
            raise SamplingError(str(exc)) from None
    after = values.get(AFTER)
    if after is not None:
        if not isinstance(after, str) or not 0 < len(after) <= MAX_AFTER_CHARS:
            raise SamplingError(f"{AFTER} must be a string of 1 to {MAX_AFTER_CHARS} characters")
        if "structured" not in out:
            raise SamplingError(f"{AFTER} is given without structured_outputs")
        out["structured_after"] = after
    kept = values.get(KEPT)
    if kept is not None:
        if (
            not isinstance(kept, list)
            or len(kept) > MAX_KEPT
            or not all(
                isinstance(token, str) and 0 < len(token) <= MAX_KEPT_CHARS for token in kept
            )
        ):
            raise SamplingError(
                f"{KEPT} must be a list of at most {MAX_KEPT} token texts of 1 to "
                f"{MAX_KEPT_CHARS} characters"
            )
        out["kept_special_tokens"] = tuple(dict.fromkeys(kept))
    try:
        out["thinking"] = thinking_of(values)
    except ValueError as exc:
        raise SamplingError(str(exc)) from None
    if values.get(PRIORITY) is not None:
        out["priority"] = _priority(values[PRIORITY])
    return SamplingParams(**out)


def _priority(value: Any) -> int:
    found = _int(PRIORITY, value)
    low, high = PRIORITY_BOUNDS
    if not low <= found <= high:
        raise SamplingError(f"{PRIORITY} must be a signed 64-bit integer, got {found}")
    return found


def _processors(values: dict[str, Any], out: dict[str, Any]) -> None:
    """The logits processors' keys, with vLLM's ranges and words (its SamplingParams)."""
    for key in _PROCESSOR_FLOATS:
        if values.get(key) is not None:
            out[key] = _float(key, values[key])
    for key in ("presence_penalty", "frequency_penalty"):
        if key in out and not -2.0 <= out[key] <= 2.0:
            raise SamplingError(f"{key} must be in [-2, 2], got {out[key]}.")
    repetition = out.get("repetition_penalty", 1.0)
    if not math.isfinite(repetition):
        raise SamplingError(f"repetition_penalty must be a finite number, got {repetition}.")
    if repetition <= 0.0:
        raise SamplingError(f"repetition_penalty must be greater than zero, got {repetition}.")
    if "min_p" in out and not 0.0 <= out["min_p"] <= 1.0:
        raise SamplingError(f"min_p must be in [0, 1], got {out['min_p']}.")
    if out["temperature"] < _GREEDY_BELOW:
        out["min_p"] = 0.0  # vLLM's: greedy takes the argmax, whatever min_p says
    if values.get("logit_bias") is not None:
        out["logit_bias"] = _logit_bias(values["logit_bias"])
    allowed = values.get("allowed_token_ids")
    if allowed is not None:
        if not isinstance(allowed, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in allowed
        ):
            raise SamplingError("allowed_token_ids must be a list of token ids")
        if not allowed:
            raise SamplingError("allowed_token_ids is not None and empty!")
        if len(allowed) > MAX_ALLOWED_TOKEN_IDS:
            raise SamplingError(
                f"Too many allowed token IDs: {len(allowed)}. "
                f"The max size is {MAX_ALLOWED_TOKEN_IDS}."
            )
        out["allowed_token_ids"] = tuple(allowed)
    words = values.get("bad_words")
    if words is not None:
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise SamplingError("bad_words must be a list of strings")
        if any(not word for word in words):
            raise SamplingError(f"bad_words cannot contain an empty string. Got bad_words={words}")
        size = sum(len(word.encode("utf-8", "surrogatepass")) for word in words)
        if size > MAX_BAD_WORD_BYTES:
            # Checked before tokenizing (which may run on the event loop): 1,024 tokens
            # of vLLM's bound never take this much text.
            raise SamplingError(
                f"bad_words: at most {MAX_BAD_WORD_BYTES} bytes of text in all, got {size}"
            )
        out["bad_words"] = tuple(dict.fromkeys(words))  # vLLM drops repeats


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's map of token id (a string in JSON) to bias, as vLLM reads it: keys as
    integers, biases clamped to [-100, 100]."""
    if not isinstance(value, dict):
        raise SamplingError("logit_bias must be an object of token id to bias")
    if len(value) > MAX_LOGIT_BIAS:
        raise SamplingError(
            f"Too many logit bias tokens: {len(value)}. The max size is {MAX_LOGIT_BIAS}."
        )
    invalid = []
    bias: dict[int, float] = {}
    for key, given in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            invalid.append(key)
            continue
        number = _float("logit_bias", given)
        if math.isnan(number):
            raise SamplingError(f"logit_bias must be a number, got {given!r}")
        bias[token] = min(_BIAS_BOUND, max(-_BIAS_BOUND, number))
    if invalid:
        raise SamplingError(
            f"logit_bias contains key(s) that cannot be converted to integer token IDs: {invalid!r}"
        )
    if len(bias) > MAX_LOGIT_BIAS:
        raise SamplingError(
            f"Too many logit bias tokens: {len(bias)}. The max size is {MAX_LOGIT_BIAS}."
        )
    return tuple(bias.items())


def check_min_tokens(min_tokens: int, max_tokens: int) -> None:
    """vLLM's rule and words: `min_tokens` within the limit, the one given or, without
    one, the one the request gets (the model's default, cut to the room left)."""
    if min_tokens > max_tokens:
        raise SamplingError(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
        )


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise SamplingError("stop must be a string or a list of strings")
    if any(not s for s in value):
        raise SamplingError("stop strings must not be empty")
    if len(value) > MAX_STOPS:
        raise SamplingError(f"stop: at most {MAX_STOPS} strings, got {len(value)}")
    if any(len(s) > MAX_STOP_CHARS for s in value):
        raise SamplingError(f"stop strings must be at most {MAX_STOP_CHARS} characters long")
    return tuple(value)


def _same_number(value: Any, neutral: Any) -> bool:
    try:
        return float(value) == float(neutral)
    except (TypeError, ValueError):
        return False


def _float(key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise SamplingError(f"{key} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise SamplingError(f"{key} must be a number, got {value!r}") from None


def _int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise SamplingError(f"{key} must be an integer, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise SamplingError(f"{key} must be an integer, got {value!r}")
        return int(value)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SamplingError(f"{key} must be an integer, got {value!r}") from None


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise SamplingError(f"{key} must be true or false, got {value!r}")
