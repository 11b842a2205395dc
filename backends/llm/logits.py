"""vLLM's logits processors for one sequence: the allowed-token mask, `logit_bias`, the
min_tokens ban, the penalties and `bad_words`, in vLLM's order (its v1 sampler: the
mask, the bias and the ban first, then the penalties, which scale what the bias added,
then the bad words). The temperature, `min_p` and top-k/top-p come after, in the sampler
(sampling.py), and greedy decoding takes the argmax of the processed row, as vLLM's.

Meanings are vLLM's: `presence_penalty` and `frequency_penalty` count the generated
tokens only, `repetition_penalty` the prompt's and the generated ones (a positive logit
is divided by it, a negative one multiplied); a bad word's last token is banned where the
generated tokens end with the rest of it.

`checked` resolves what needs the tokenizer and the vocabulary (the request's token ids
inside it, the bad words tokenized as vLLM tokenizes them), where a request becomes a
sequence; `LogitsProcessor` then runs on the engine thread, once per token, only for a
sequence that asked for one. It never writes the step's logits: it copies its own row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from .sampling import (
    MAX_BAD_WORD_TOKENS,
    MAX_BAD_WORDS,
    SamplingError,
    SamplingParams,
)

Encode = Callable[[str, bool], list[int]]


def checked(params: SamplingParams, vocab: int, encode: Encode) -> tuple[tuple[int, ...], ...]:
    """Check the request's token ids against the vocabulary (vLLM's words), and tokenize
    its bad words; SamplingError says what is wrong."""
    outside = [token for token, _ in params.logit_bias if not 0 <= token < vocab]
    if outside:
        raise SamplingError(
            f"token_id(s) {outside} in logit_bias contain out-of-vocab token ids. "
            f"Vocabulary size: {vocab}"
        )
    allowed = params.allowed_token_ids or ()
    if any(not 0 <= token < vocab for token in allowed):
        raise SamplingError("allowed_token_ids contains out-of-vocab token id!")
    return bad_words_ids(params.bad_words, encode)


def bad_words_ids(words: tuple[str, ...], encode: Encode) -> tuple[tuple[int, ...], ...]:
    """vLLM's tokenization of bad words: each word without special tokens, as it is
    (stripped of leading whitespace) and after a space, the latter kept where it starts
    with another token and has as many tokens (a word in mid-text)."""
    found: list[list[int]] = []
    for word in words:
        for prefix in ("", " "):
            ids = encode(prefix + word.lstrip(), False)
            if not ids:
                if not prefix:
                    raise SamplingError("bad_words entries must tokenize to at least one token.")
                continue
            if not prefix or (ids[0] != found[-1][0] and len(ids) == len(found[-1])):
                found.append(ids)
                if len(found) > MAX_BAD_WORDS:
                    raise SamplingError(
                        f"Too many bad words after tokenization: {len(found)}. "
                        f"The max number is {MAX_BAD_WORDS}."
                    )
    total = sum(len(ids) for ids in found)
    if total > MAX_BAD_WORD_TOKENS:
        raise SamplingError(
            f"Too many total bad word tokens: {total}. The max is {MAX_BAD_WORD_TOKENS}."
        )
    return tuple(tuple(ids) for ids in found)


class LogitsProcessor:
    """One sequence's processing of its logits row, before the sampler."""

    __slots__ = (
        "_allowed",
        "_bad_words",
        "_bias",
        "_bias_ids",
        "_counted",
        "_counts",
        "_frequency",
        "_presence",
        "_prompt_seen",
        "_repetition",
    )

    def __init__(
        self, params: SamplingParams, bad_words: tuple[tuple[int, ...], ...], vocab: int
    ) -> None:
        allowed = params.allowed_token_ids
        self._allowed = None if allowed is None else np.array(sorted(set(allowed)), np.intp)
        self._bias_ids = np.array([token for token, _ in params.logit_bias], np.intp)
        self._bias = np.array([bias for _, bias in params.logit_bias], np.float32)
        self._presence = params.presence_penalty
        self._frequency = params.frequency_penalty
        self._repetition = params.repetition_penalty
        self._bad_words = bad_words
        # The generated tokens' counts, kept up to date as tokens come (a preempted
        # sequence keeps its tokens, so what was counted stays counted).
        self._counts: npt.NDArray[np.int64] | None = None
        self._counted = 0
        self._prompt_seen: npt.NDArray[np.bool_] | None = None
        if self._presence or self._frequency or self._repetition != 1.0:
            self._counts = np.zeros(vocab, np.int64)

    def apply(
        self,
        logits: npt.NDArray[np.float32],
        tokens: list[int],
        prompt_len: int,
        banned: tuple[int, ...] = (),
    ) -> npt.NDArray[np.float32]:
        """The processed row (a new array; `logits` is left as it is). `tokens`: the
        prompt's then the generated ones; `banned`: the stop ids min_tokens holds off."""
        if self._allowed is not None:
            row = np.full(logits.shape, -np.inf, np.float32)
            row[self._allowed] = logits[self._allowed]
        else:
            row = logits.astype(np.float32, copy=True)
        if self._bias_ids.size:
            row[self._bias_ids] += self._bias
        if banned:
            row[list(banned)] = -np.inf
        if self._counts is not None:
            self._penalise(row, tokens, prompt_len)
        for word in self._bad_words:
            prefix = word[:-1]
            start = len(tokens) - len(prefix)
            if start >= prompt_len and tuple(tokens[start:]) == prefix:
                row[word[-1]] = -np.inf
        return row

    def _penalise(self, row: npt.NDArray[np.float32], tokens: list[int], prompt_len: int) -> None:
        counts = self._counts
        assert counts is not None
        new = tokens[prompt_len + self._counted :]
        if new:
            np.add.at(counts, np.array(new, np.intp), 1)
            self._counted += len(new)
        generated = counts > 0
        if self._repetition != 1.0:
            if self._prompt_seen is None:
                self._prompt_seen = np.zeros(row.shape[0], np.bool_)
                self._prompt_seen[np.array(tokens[:prompt_len], np.intp)] = True
            seen = self._prompt_seen | generated
            penalty = np.float32(self._repetition)
            row[:] = np.where(seen, np.where(row > 0, row / penalty, row * penalty), row).astype(
                np.float32
            )
        if self._frequency:
            row -= np.float32(self._frequency) * counts.astype(np.float32)
        if self._presence:
            row -= np.float32(self._presence) * generated.astype(np.float32)


def nothing_possible(row: npt.NDArray[np.float32]) -> bool:
    """Whether processing left no token that may be sampled (every logit -inf)."""
    return not bool(np.isfinite(row).any())
