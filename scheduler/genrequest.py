"""A generation request's inputs read into a `Sequence`, on the event loop.

Everything a client can get wrong is found here and answered INVALID_ARG before the
request reaches the engine: a missing or empty prompt (or both a text and token ids, or
an id outside the model's vocabulary), bad sampling values, a prompt that leaves no room in the
context, or a `max_tokens` the context cannot hold (vLLM's rule: prompt plus max_tokens
at most max_model_len). Without `max_tokens` a request gets the model's default, cut to
the room its prompt leaves. A prompt whose UTF-8 length alone shows it cannot fit
(`Tokenizer.min_tokens`) is refused before it is tokenized, which for megabytes would
take seconds. A prompt given as token ids (`input_ids`, where the config declares it) is
taken as it is: no tokenizer call, no special tokens added (vLLM's token prompts).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ge_serve.backends.base import ResponseSink
from ge_serve.backends.llm.backend import LlmModel
from ge_serve.backends.llm.logits import LogitsProcessor, checked
from ge_serve.backends.llm.logprobs import TokenLogprobs, check_count, check_token_ids
from ge_serve.backends.llm.prompt_logprobs import NO_HIDDEN_STATES, PromptLogprobs
from ge_serve.backends.llm.sampler import Sampler
from ge_serve.backends.llm.sampling import (
    SamplingError,
    SamplingParams,
    check_min_tokens,
    sampling_params,
)
from ge_serve.backends.llm.text import Detokenizer, StopStrings
from ge_serve.backends.llm.thinking import ThinkingBudget
from ge_serve.server.errors import invalid_arg

from .genseq import Sequence
from .work import Array

_ONE_PROMPT = (
    "a request carries exactly one of the inputs 'text_input' (the prompt as text) and "
    "'input_ids' (the prompt as token ids)"
)
# Prompts up to this many bytes are tokenized on the event loop (tens of microseconds);
# longer ones on a worker thread, by a call that releases the GIL (Tokenizer.encode), or
# the loop would stall as long all the same.
_INLINE_BYTES = 2048
# Likewise prompts given as more token ids than this: checked, and decoded where the answer
# repeats the prompt, on a worker thread.
_INLINE_IDS = 1024
STREAM_ECHO_REFUSED = (
    "Error generating stream: When streaming, `exclude_input_in_output` = False is not allowed."
)


def read_sequence(
    model: LlmModel,
    inputs: Mapping[str, Array],
    parameters: Mapping[str, Any],
    sink: ResponseSink,
    serial: int,
    on_done: Callable[[], None],
    requested: tuple[str, ...] = (),
) -> Sequence:
    raw = _bytes(inputs.get("text_input"), "text_input")
    given_ids = inputs.get("input_ids") if model.takes_ids else None
    if (raw is None) == (given_ids is None):
        if not model.takes_ids:
            raise invalid_arg("input 'text_input' is required: the prompt")
        raise invalid_arg(f"{_ONE_PROMPT}; it has {'neither' if raw is None else 'both'}")
    prompt = None if raw is None else _decoded(raw, "text_input")
    stream = bool(_flag(inputs.get("stream"), "stream", parameters.get("stream")))
    exclude = _flag(
        inputs.get("exclude_input_in_output"),
        "exclude_input_in_output",
        parameters.get("exclude_input_in_output"),
        default=None,
    )
    if stream and exclude is False:
        # Triton's vLLM backend refuses it in these words (a stream never repeats the
        # prompt); left out, a stream simply excludes it.
        raise invalid_arg(STREAM_ECHO_REFUSED)
    reason, input_count, output_count = extra_outputs(model, inputs)
    # finish_reason on every response: its flag asked for it (`reason` is then that flag),
    # or, for a model without the flag, the client named it among its outputs.
    reason_always = reason if "finish_reason" in model.opt_in else "finish_reason" in requested
    sampling_json = _bytes(inputs.get("sampling_parameters"), "sampling_parameters")
    max_tokens = _int(inputs.get("max_tokens"), "max_tokens")
    settings = model.settings
    try:
        params = sampling_params(settings.defaults, parameters, sampling_json, max_tokens)
    except SamplingError as exc:
        raise invalid_arg(str(exc)) from None
    vocab = model.runner.shape.vocab
    if params.logprobs is not None:
        try:
            check_count(params.logprobs, vocab, settings.max_logprobs)
        except ValueError as exc:
            raise invalid_arg(str(exc)) from None
    if params.logprob_token_ids is not None:
        try:
            check_token_ids(params.logprob_token_ids, params.logprobs, vocab)
        except ValueError as exc:
            raise invalid_arg(str(exc)) from None
    # vLLM's num_logprobs: `logprobs`, or one per `logprob_token_ids`.
    top = params.num_logprobs
    if params.prompt_logprobs is not None:
        if not model.runner.shape.hidden:
            raise invalid_arg(NO_HIDDEN_STATES)
        try:
            check_count(params.prompt_logprobs, vocab, settings.max_logprobs, "prompt")
        except ValueError as exc:
            raise invalid_arg(str(exc)) from None
    send_logprobs, send_cumulative = logprob_outputs(model, inputs, top is not None)
    send_prompt = _returned(model, inputs, "prompt_logprobs", params.prompt_logprobs is not None)
    send_ids = _returned(model, inputs, "output_ids", True)
    cached = "num_cached_tokens" in model.outputs  # built only where the config has it
    send_cached = cached and _returned(model, inputs, "num_cached_tokens", True)
    outside = sorted(i for i in params.stop_token_ids if i >= vocab)
    if outside:
        # Checked here: the engine would index the logits with it, in a step shared
        # with other requests.
        raise invalid_arg(
            f"stop_token_ids {outside[:8]} are outside the vocabulary: this model's token "
            f"ids are below {vocab}"
        )
    processor = _processor(model, params, vocab)
    limit = settings.max_model_len
    if raw is not None and prompt is not None:
        _refuse_what_cannot_fit(model, len(raw), limit, params.max_tokens)
        ids = model.tokenizer.encode(prompt, params.add_special_tokens)
        if not ids:
            raise invalid_arg("the prompt is empty: text_input must hold at least one token")
    else:
        assert given_ids is not None  # decoded only where the answer repeats it
        ids = _token_ids(given_ids, vocab)
    if len(ids) >= limit:
        raise invalid_arg(
            f"This model's maximum context length is {limit} tokens. However, the prompt is "
            f"{len(ids)} tokens, which leaves no room to generate."
        )
    room = limit - len(ids)
    if params.max_tokens is not None and params.max_tokens > room:
        raise invalid_arg(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{len(ids) + params.max_tokens} tokens ({len(ids)} in the prompt, "
            f"{params.max_tokens} for the completion)."
        )
    budget = (
        params.max_tokens
        if params.max_tokens is not None
        else min(settings.defaults.max_tokens, room)
    )
    try:
        check_min_tokens(params.min_tokens, budget)
    except SamplingError as exc:
        raise invalid_arg(str(exc)) from None
    return Sequence(
        serial=serial,
        tokens=ids,
        prompt_len=len(ids),
        max_tokens=budget,
        params=params,
        sampler=Sampler(params),
        detokenizer=Detokenizer(
            model.tokenizer, params.skip_special_tokens, ids, _kept(model, params)
        ),
        stops=StopStrings(params.stop, params.include_stop_str_in_output),
        sink=sink,
        stream=stream,
        echo="" if (stream or exclude) else _prompt_text(model, prompt, ids),
        arrival_s=time.monotonic(),
        on_done=on_done,
        reason_always=reason_always,
        reason=reason,
        input_count=input_count,
        output_count=output_count,
        logprobs=None
        if top is None
        else TokenLogprobs(top, model.tokenizer, vocab, params.logprob_token_ids or ()),
        send_logprobs=send_logprobs,
        send_cumulative=send_cumulative,
        prompt_logprobs=None
        if params.prompt_logprobs is None
        else PromptLogprobs(params.prompt_logprobs, model.tokenizer, vocab),
        send_prompt_logprobs=send_prompt,
        send_ids=send_ids,
        send_cached=send_cached,
        processor=processor,
        thinking=_thinking(model, params),
    )


def _token_ids(array: Array, limit: int) -> list[int]:
    """A prompt given as token ids ([L]: the core holds the shape to the config's [-1]),
    each below `limit` in vLLM's words. vLLM's bound is the larger of the tokenizer's ids and
    the model's logits: the logits here, since the load refuses a larger tokenizer (an id
    the tokenizer does not name decodes to nothing). Checked on the array as sent, so an
    INT64 id past int32 is out of the vocabulary, never wrapped."""
    flat = array.reshape(-1)
    if flat.dtype.kind not in "iu":
        raise invalid_arg("input 'input_ids' must hold integers (INT32 or INT64)")
    if not flat.size:
        raise invalid_arg("The decoder prompt cannot be empty: input_ids holds no token ids")
    low, high = int(flat.min()), int(flat.max())
    # vLLM's check and words (its renderer's validate_token_ids): a negative id first.
    if low < 0:
        raise invalid_arg(f"Token id {low} is out of vocabulary")
    if high >= limit:
        raise invalid_arg(f"Token id {high} is out of vocabulary")
    ids: list[int] = flat.tolist()
    return ids


def _kept(model: LlmModel, params: SamplingParams) -> frozenset[int]:
    """The ids of the special tokens whose text decoding keeps; a text that is no special
    token of the model's keeps nothing (a parser's tags another model does not have)."""
    tokenizer = model.tokenizer
    found = (tokenizer.token_id(text) for text in params.kept_special_tokens)
    return frozenset(i for i in found if i is not None) & tokenizer.special_ids


def _prompt_text(model: LlmModel, prompt: str | None, ids: list[int]) -> str:
    """The prompt as the answer repeats it: its text, or for token ids their decoding with
    special tokens kept (vLLM detokenizes a token prompt so for `echo`)."""
    return prompt if prompt is not None else model.tokenizer.decode(ids, False)


def long_prompt(inputs: Mapping[str, Array]) -> bool:
    """Whether reading the request takes long enough to leave the event loop for a worker
    thread: a long text to tokenize, or many ids to check (and decode, for an echo)."""
    array = inputs.get("text_input")
    if array is None:
        ids = inputs.get("input_ids")
        return ids is not None and ids.size > _INLINE_IDS
    if array.size != 1:
        return False
    value = array.reshape(-1)[0]
    return isinstance(value, bytes) and len(value) > _INLINE_BYTES


def _processor(model: LlmModel, params: SamplingParams, vocab: int) -> LogitsProcessor | None:
    """The request's logits processors, their token ids checked against the vocabulary
    and its bad words tokenized (vLLM's words where vLLM refuses); None without any."""
    if not params.processes_logits:
        return None
    try:
        bad_words = checked(params, vocab, model.tokenizer.encode)
    except SamplingError as exc:
        raise invalid_arg(str(exc)) from None
    return LogitsProcessor(params, bad_words, vocab)


def _thinking(model: LlmModel, params: SamplingParams) -> ThinkingBudget | None:
    """The request's thinking budget, its markers tokenized (a few short strings: on the
    loop); None without one."""
    if params.thinking is None:
        return None
    try:
        return ThinkingBudget.of(params.thinking, model.tokenizer.encode)
    except ValueError as exc:
        raise invalid_arg(str(exc)) from None


def extra_outputs(model: LlmModel, inputs: Mapping[str, Array]) -> tuple[bool, bool, bool]:
    """Whether the request gets finish_reason, num_input_tokens and num_output_tokens.
    An output whose `return_*` input the config declares is sent only when the request
    sets that flag true (Triton's vLLM backend's rule); one whose flag the config does
    not declare is always sent, as ge-serve's configs without the flags expect."""
    if not model.opt_in:
        return True, True, True
    return (
        _returned(model, inputs, "finish_reason", True),
        _returned(model, inputs, "num_input_tokens", True),
        _returned(model, inputs, "num_output_tokens", True),
    )


def logprob_outputs(model: LlmModel, inputs: Mapping[str, Array], asked: bool) -> tuple[bool, bool]:
    """Whether the request gets `logprobs` and `cumulative_logprob`: its flag set true
    where the config declares the flag (Triton's vLLM backend's rule: then "null" and NaN
    when the sampling parameters ask for no `logprobs`); without the flag, whenever they
    do (`asked`)."""
    return (
        _returned(model, inputs, "logprobs", asked),
        _returned(model, inputs, "cumulative_logprob", asked),
    )


def _returned(model: LlmModel, inputs: Mapping[str, Array], output: str, otherwise: bool) -> bool:
    """Whether `output` is sent: its `return_*` flag set true where the config declares
    the flag, else `otherwise`."""
    if output not in model.opt_in:
        return otherwise
    flag = f"return_{output}"
    return bool(_flag(inputs.get(flag), flag, None))


def _refuse_what_cannot_fit(
    model: LlmModel, utf8_bytes: int, limit: int, max_tokens: int | None
) -> None:
    """Refuse, before tokenizing it, a prompt whose length alone shows it cannot fit: a
    prompt of megabytes takes seconds to tokenize, only to be refused after."""
    least = model.tokenizer.min_tokens(utf8_bytes)
    if least >= limit:
        raise invalid_arg(
            f"This model's maximum context length is {limit} tokens. However, the prompt is "
            f"at least {least} tokens ({utf8_bytes} bytes, at most "
            f"{model.tokenizer.max_token_bytes} a token), which leaves no room to generate."
        )
    if max_tokens is not None and least + max_tokens > limit:
        raise invalid_arg(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"at least {least + max_tokens} tokens (at least {least} in the prompt, "
            f"{max_tokens} for the completion)."
        )


def _first(array: Array | None, name: str) -> Any:
    if array is None:
        return None
    if array.size != 1:
        raise invalid_arg(f"input '{name}' must hold exactly one element, got {array.size}")
    return array.reshape(-1)[0]


def _bytes(array: Array | None, name: str) -> bytes | None:
    value = _first(array, name)
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8")
    if not isinstance(value, bytes | np.bytes_):
        raise invalid_arg(f"input '{name}' must be a string")
    return bytes(value)


def _decoded(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid_arg(f"input '{name}' is not valid UTF-8") from None


def _flag(
    array: Array | None, name: str, parameter: Any, default: bool | None = False
) -> bool | None:
    """The boolean input `name` (or request parameter), `default` when neither is given."""
    value = _first(array, name)
    if value is None:
        value = parameter
    if value is None:
        return default
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise invalid_arg(f"'{name}' must be a boolean")


def _int(array: Array | None, name: str) -> int | None:
    value = _first(array, name)
    return None if value is None else int(value)
