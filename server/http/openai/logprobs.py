"""OpenAI's logprobs objects, made from the `logprobs` output of a generative model (Triton's
vLLM backend's JSON: per response, one {token_id: {logprob, rank, decoded_token}} per
new token, the sampled token first, then the top N), as vLLM's OpenAI server makes them
from its engine's dicts (where Triton's front end differs, sorting by rank, vLLM's is
taken: the sampled token first).

- chat: `content`, one {token, logprob, bytes, top_logprobs} per token, `top_logprobs`
  the first `top_logprobs` entries of its dict ({token, logprob, bytes});
- completions: `tokens`, `token_logprobs`, `top_logprobs` (per token, a dict of the first
  `logprobs + 1` entries, token to logprob) and `text_offset` (where each token's text
  begins in the answer's text, counted on from the chunks before).

With vLLM's `logprob_token_ids` the model's dict is the sampled token and those ids, and
all of it is shown (a count of -1), as vLLM's `return_all`.

Logprobs are floored at -9999.0, as vLLM floors them (JSON has no -inf).
"""

from __future__ import annotations

import json
from typing import Any

from .errors import OpenAIError

# vLLM's floor for a logprob (its -inf).
FLOOR = -9999.0
Entry = dict[str, dict[str, Any]]


def parse(raw: bytes) -> list[Entry] | None:
    """The entries of one response's `logprobs` output; None for "null" or anything that
    is not the vLLM backend's list of dicts."""
    try:
        # json, not orjson: the engine's JSON (Python's) may hold -Infinity.
        found = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(found, list) or not all(isinstance(e, dict) for e in found):
        return None
    return found


def parse_prompt(raw: bytes) -> list[Entry | None] | None:
    """The `prompt_logprobs` output: vLLM's list, None for the first prompt token."""
    try:
        found = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(found, list) or not all(e is None or isinstance(e, dict) for e in found):
        return None
    return found


def echoed(
    prompt: str, found: list[Entry | None], first: int | None = None, text: str = ""
) -> list[Entry]:
    """The echoed prompt's entries for completions' `logprobs`: the first token (no
    logprob, vLLM's None) as the text its followers do not account for, else as its own
    `text` (a BOS the tokenizer adds, which the prompt's text lacks), under its id
    `first` where known (`return_tokens_as_token_ids` shows it)."""
    rest = [e for e in found if e]
    texts = "".join(str(next(iter(e.values())).get("decoded_token", "")) for e in rest)
    head = prompt[: len(prompt) - len(texts)] if prompt.endswith(texts) else ""
    head = head or text
    key = "" if first is None else str(first)
    return [{key: {"logprob": None, "decoded_token": head}}, *rest]


def _token(key: str, value: dict[str, Any], as_ids: bool) -> str:
    """The token's text, or vLLM's `token_id:<id>` (its `return_tokens_as_token_ids`)."""
    if as_ids:
        return f"token_id:{key}"
    token = value.get("decoded_token")
    return token if isinstance(token, str) else ""


def _logprob(value: dict[str, Any]) -> float | None:
    number = value.get("logprob")
    if number is None and "logprob" in value:
        return None  # the echoed prompt's first token
    return max(float(number), FLOOR) if isinstance(number, int | float) else FLOOR


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def chat_content(entries: list[Entry], top: int, as_ids: bool = False) -> list[dict[str, Any]]:
    """Chat's `logprobs.content` for the tokens of `entries`."""
    content: list[dict[str, Any]] = []
    for entry in entries:
        items = [(_token(k, v, as_ids), _logprob(v)) for k, v in entry.items()]
        if not items:
            continue
        token, logprob = items[0]
        # vLLM's: the sampled token's bytes are its text's, even shown as `token_id:<id>`
        # (its top_logprobs' bytes are what they show).
        text = _token(*next(iter(entry.items())), False) if as_ids else token
        content.append(
            {
                "token": token,
                "logprob": logprob,
                "bytes": _bytes(text),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": _bytes(t)}
                    for t, lp in (items if top == -1 else items[:top])
                ],
            }
        )
    return content


def completion_logprobs(
    entries: list[Entry], count: int, offset: int, as_ids: bool = False
) -> dict[str, Any]:
    """Completions' `logprobs` object for the tokens of `entries`, the first token's text
    beginning at `offset` in the answer."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    tops: list[dict[str, float | None] | None] = []
    offsets: list[int] = []
    for entry in entries:
        items = [(_token(k, v, as_ids), _logprob(v)) for k, v in entry.items()]
        if not items:
            continue
        token = items[0][0]
        tokens.append(token)
        token_logprobs.append(items[0][1])
        first = items[0][1] is None
        tops.append(None if first else dict(items if count == -1 else items[: count + 1]))
        offsets.append(offset)
        offset += len(token)
    return {
        "text_offset": offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": tops,
    }


TOKEN_IDS = "logprob_token_ids"


def check_token_ids(
    token_ids: list[int] | None,
    beam_search: bool | None,
    logprobs_set: bool,
    chat: bool,
    echo_only: bool = False,
) -> None:
    """vLLM's checks of `logprob_token_ids` (its check_logprobs, in its order and words):
    not with beam search, nor with completions' `echo` and `max_tokens: 0` (`echo_only`),
    and only with `logprobs` (chat's true, completions' any count); an empty list is none
    (vLLM's). The engine checks the ids themselves."""
    if not token_ids:
        return
    if beam_search:
        raise OpenAIError(f"`{TOKEN_IDS}` is not supported with beam search.", param=TOKEN_IDS)
    if echo_only:
        raise OpenAIError(
            f"`{TOKEN_IDS}` is not supported when `echo=True` and `max_tokens=0` because "
            "no output tokens are generated.",
            param=TOKEN_IDS,
        )
    if not logprobs_set:
        needed = "set to true" if chat else "set"
        raise OpenAIError(
            f"when using `{TOKEN_IDS}`, `logprobs` must be {needed}.", param=TOKEN_IDS
        )


def check_chat(logprobs: bool | None, top: int | None) -> None:
    """vLLM's checks of chat's `logprobs` and `top_logprobs`, in its words."""
    if top is not None and top < 0 and top != -1:
        raise OpenAIError("`top_logprobs` must be a positive value or -1.", param="top_logprobs")
    if top is not None and top != 0 and not logprobs:
        raise OpenAIError(
            "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs"
        )


def check_completion(logprobs: int | None) -> None:
    """vLLM's check of completions' `logprobs` (with `echo`, the prompt's tokens come
    first, with their log probabilities: vLLM's `prompt_logprobs`)."""
    if logprobs is not None and logprobs < 0 and logprobs != -1:
        raise OpenAIError("`logprobs` must be a positive value or -1.", param="logprobs")


def check_prompt(prompt_logprobs: int | None, stream: bool | None) -> None:
    """vLLM's checks of `prompt_logprobs`, in its words."""
    if prompt_logprobs is None:
        return
    if stream and (prompt_logprobs > 0 or prompt_logprobs == -1):
        raise OpenAIError(
            "`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs"
        )
    if prompt_logprobs < 0 and prompt_logprobs != -1:
        raise OpenAIError(
            "`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs"
        )


class Logprobs:
    """What one answer asks of logprobs (chat's `top_logprobs`, or completions'
    `logprobs`)."""

    __slots__ = ("as_ids", "chat", "count")

    def __init__(self, chat: bool, count: int, as_ids: bool = False) -> None:
        self.chat = chat
        self.count = count
        # vLLM's `return_tokens_as_token_ids`: tokens as `token_id:<id>`.
        self.as_ids = as_ids

    def of(self, entries: list[Entry], offset: int = 0) -> dict[str, Any]:
        """The `logprobs` object of a choice holding `entries`' tokens (the whole
        answer's, or one chunk's, whose completions offsets begin at `offset`)."""
        if self.chat:
            return {"content": chat_content(entries, self.count, self.as_ids)}
        return completion_logprobs(entries, self.count, offset, self.as_ids)
