"""Log probabilities of the sampled tokens, as vLLM computes them and Triton's vLLM
backend sends them.

vLLM's default `logprobs_mode` is `raw_logprobs`: a log-softmax of the model's logits
before temperature, top-k/top-p or any ban (min_tokens') touch them, so a token's
logprob does not depend on how it was sampled. Per sampled token vLLM gives the sampled
token's logprob and rank (its kernel counts the logits at or above the sampled one's:
1 for the argmax), then the `logprobs` most likely tokens (torch.topk's order; here ties
go to the lower id), ranked 1..N; a dict keyed by token id, the sampled token first, so
one in the top N appears once, with its top-N rank. Each entry carries the token decoded
alone (`tokenizer.decode([id])`, special tokens kept); one that decodes to a character
cut short (U+FFFD at the end: a byte-fallback piece) is decoded after up to 4 of the
sampled tokens before it, as vLLM repairs it: the whole character on the token that
completes it, "" on those before, so a response's tokens spell its text.
`cumulative_logprob` is the sum of the sampled tokens' logprobs. Triton's vLLM backend
sends, per response, the entries of the tokens that response adds as JSON (`logprobs`,
"null" where the request asked for none) and the running sum (`cumulative_logprob`,
NaN where none were asked for: its numpy float32 of vLLM's None).

vLLM's `logprob_token_ids` puts given ids in place of the top N: each entry is the
sampled token, then those ids in the order given (each once; the sampled token, where
among them, stays first), their logprobs gathered from the same log-softmax of the raw
logits. Their ranks are the kernel's count, as the sampled token's (vLLM gives them their
place in the list, 1..n, which says nothing of the token).

`prompt_logprobs` (prompt_logprobs.py) makes the same entries for the prompt's tokens.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import numpy.typing as npt

from .text import Tokenizer

# What a token cut inside a character decodes to, and how many tokens back vLLM looks to
# complete it (enough for any UTF-8 character).
_CUT = "\ufffd"
_CONTEXT = 4
# vLLM's MAX_LOGPROB_TOKEN_IDS: the most ids `logprob_token_ids` may give.
MAX_TOKEN_IDS = 128


def check_count(value: int, vocab: int, limit: int, what: str = "sample") -> None:
    """vLLM's bounds for `logprobs` (`what` "sample") and `prompt_logprobs` ("prompt"),
    its SamplingParams' checks and words: -1 is the whole vocabulary; at most `limit` (the
    model's `max_logprobs`, vLLM's --max-logprobs: 20 unless set; -1, the vocabulary).
    ValueError says what is wrong."""
    key = "logprobs" if what == "sample" else f"{what}_logprobs"
    if value < 0 and value != -1:
        raise ValueError(f"{key} must be non-negative or -1, got {value}.")
    wanted = vocab if value == -1 else value
    allowed = vocab if limit == -1 else limit
    if wanted > allowed:
        raise ValueError(
            f"Requested {what} logprobs of {wanted}, which is greater than max allowed: {allowed}"
        )


def check_token_ids(ids: tuple[int, ...], logprobs: int | None, vocab: int) -> None:
    """vLLM's checks of `logprob_token_ids` (its SamplingParams', in its order and words):
    at most MAX_TOKEN_IDS, each inside the vocabulary, and with `logprobs` as many as it
    says. ValueError says what is wrong."""
    count = len(ids)
    if count > MAX_TOKEN_IDS:
        raise ValueError(
            f"Requested logprob_token_ids of length {count}, which is greater than max "
            f"allowed: {MAX_TOKEN_IDS}"
        )
    outside = [token for token in ids if not 0 <= token < vocab]
    if outside:
        raise ValueError(
            f"token_id(s) {outside} in logprob_token_ids contain out-of-vocab token ids. "
            f"Vocabulary size: {vocab}"
        )
    if logprobs is not None and logprobs != count:
        raise ValueError(
            "When both logprobs and logprob_token_ids are set, logprobs must equal "
            f"len(logprob_token_ids). Got logprobs={logprobs}, len(logprob_token_ids)={count}."
        )


class TokenLogprobs:
    """One sequence's log probabilities: an entry per generated token, the running sum,
    until a response carries them."""

    __slots__ = ("chosen", "context", "cumulative", "entries", "tokenizer", "top")

    def __init__(
        self, top: int, tokenizer: Tokenizer, vocab: int, chosen: tuple[int, ...] = ()
    ) -> None:
        self.top = vocab if top == -1 else top
        # `logprob_token_ids`, each once, in the order given (empty: the top N instead).
        self.chosen: npt.NDArray[np.intp] = np.array(list(dict.fromkeys(chosen)), np.intp)
        self.tokenizer = tokenizer
        self.entries: list[dict[str, dict[str, Any]]] = []
        self.cumulative = 0.0
        # The last sampled tokens, oldest first: what a cut character is decoded after.
        self.context: list[int] = []

    def add(self, logits: npt.NDArray[np.float32], token: int) -> None:
        """The entry of `token`, sampled from the raw `logits` row."""
        row = logits.astype(np.float64)
        peak = float(row.max())
        lse = peak + math.log(float(np.exp(row - peak).sum()))
        chosen = float(row[token])
        logprob = chosen - lse
        rank = int(np.count_nonzero(row >= chosen))
        ids = [token]
        ranks = [rank]
        top = self.top
        if self.chosen.size:
            # One gather of the given ids (the sampled one is already first).
            others = self.chosen[self.chosen != token]
            ids.extend(int(i) for i in others)
            ranks.extend(int(np.count_nonzero(row >= value)) for value in row[others])
        elif top > 0:
            size = row.shape[0]
            part = np.argpartition(-row, top - 1)[:top] if top < size else np.arange(size)
            # Highest first; stable on ids sorted ascending, so ties go to the lower id.
            part = np.sort(part)
            best = part[np.argsort(-row[part], kind="stable")]
            ids.extend(int(i) for i in best)
            ranks.extend(range(1, len(best) + 1))
        entry: dict[str, dict[str, Any]] = {}
        for token_id, token_rank in zip(ids, ranks, strict=True):
            entry[str(token_id)] = {
                "logprob": logprob if token_id == token else float(row[token_id]) - lse,
                "rank": token_rank,
                "decoded_token": self._decoded(token_id),
            }
        self.entries.append(entry)
        self.cumulative += logprob
        self.context = [*self.context[-(_CONTEXT - 1) :], token]

    def _decoded(self, token: int) -> str:
        text = self._decode([token])
        return self._completed(token) if text.endswith(_CUT) else text

    def _completed(self, token: int) -> str:
        """vLLM's repair of a token that decodes to a cut character: its text after the
        fewest sampled tokens before it that complete the character, less what those
        tokens' own texts already gave; "" where none complete it."""
        context = self.context
        for count in range(1, len(context) + 1):
            before = context[-count:]
            whole = self._decode([*before, token])
            if whole.endswith(_CUT):
                continue
            clean = len(before)
            while clean > 0 and self._decode([before[clean - 1]]).endswith(_CUT):
                clean -= 1
            prefix = self._decode(before[:clean]) if clean else ""
            if whole.startswith(prefix):
                return whole[len(prefix) :]
            common = 0
            for a, b in zip(prefix, whole, strict=False):
                if a != b:
                    break
                common += 1
            return whole[common:]
        return ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def take(self) -> bytes:
        """The JSON of the entries not sent yet (Triton's vLLM backend's per-response
        delta), which are then let go: a long stream holds only what it has not sent."""
        taken, self.entries = self.entries, []
        return json.dumps(taken).encode("utf-8")
