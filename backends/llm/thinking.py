"""vLLM's `thinking_token_budget`: a thinking model's thoughts end after so many tokens.

vLLM's engine knows where thoughts start and end from its `--reasoning-parser` (its
ReasoningConfig); this engine knows no parser, so a request names them beside the
budget, in ge-serve's own sampling keys `reasoning_start_str` and `reasoning_end_str`
(/v1 fills them from its parser: `<think>` and `</think>`). Both are tokenized once, when
the request becomes a sequence, without special tokens, as vLLM tokenizes them; each
must be a token of its own in the model's tokenizer, alone and beside other text (an
added token, as a thinking model's `<think>` is): vLLM's reasoning parsers refuse a
tokenizer without their tags as tokens, and a marker that merges with its neighbours
would be missed, or forced into the answer. The start must not be the end's token.
A grammar that applies from the first token (structured outputs without
`structured_outputs_after`) cannot take a budget: vLLM forces the end over the grammar,
this engine would not force it; the request is refused.

Counting and forcing are vLLM's (its samplers' ThinkingBudgetState): the thoughts are
open where the last match of the start ids in the prompt and the generated tokens comes
after the last match of the end ids (a template that opens `<think>` in the prompt opens
them too). The budget counts every token after the start ids, the prompt's included.
Once that count reaches the budget, each step takes the next of the end ids, and no
other token: where the tokens already end with a beginning of the end ids, the rest of
them. Once all the end ids are written the thoughts are closed and sampling goes on as
the request says. A budget of 0 closes thoughts that the prompt opened at once.

Requests without a budget carry no state and cost nothing per step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

BUDGET = "thinking_token_budget"
START = "reasoning_start_str"
END = "reasoning_end_str"
KEYS = (BUDGET, START, END)
MAX_MARKER_CHARS = 256
# vLLM's words for a budget that is not one.
NOT_A_BUDGET = "`thinking_token_budget` must be a non-negative integer or -1 for unlimited."
# The engine's words for a budget without the thoughts' markers (vLLM's server says it
# lacks a reasoning config; /v1 says so in its words before the engine is asked).
NO_MARKERS = (
    f"{BUDGET} is set but the reasoning markers are not: give {START} and {END} "
    "(the thoughts' start and end strings) with it"
)
# The budget with a grammar that applies from the first token (the module's doc).
GRAMMAR_FIRST = (
    f"{BUDGET} cannot be enforced under structured_outputs that apply from the first "
    "token: give structured_outputs_after (the thoughts' end) so that the grammar waits "
    "for the thoughts to close, or leave the budget out"
)
_GRAMMAR, _AFTER = "structured_outputs", "structured_outputs_after"
# Where a marker stands beside other text: a word, a space, blank lines.
_NEIGHBOURS = ("a{}a", " {} ", "\n{}\n\n")
# vLLM's clamp of a budget (its int32 buffers).
_INT32_MAX = 2**31 - 1

Encode = Callable[[str, bool], list[int]]


@dataclass(frozen=True, slots=True)
class Thinking:
    """A request's budget and the strings that open and close its thoughts."""

    budget: int
    start: str
    end: str


def budget_of(value: Any) -> int | None:
    """vLLM's validate_thinking_token_budget: None (unset, or -1: unlimited) or the
    budget; ValueError in vLLM's words for anything else (booleans and floats too)."""
    if value is None:
        return None
    if isinstance(value, (bool, float)) or not isinstance(value, int):
        raise ValueError(NOT_A_BUDGET)
    if value == -1:
        return None
    if value < 0:
        raise ValueError(NOT_A_BUDGET)
    return min(value, _INT32_MAX)


def thinking_of(values: Mapping[str, Any]) -> Thinking | None:
    """The request's Thinking from its sampling keys; None without a budget (the markers
    alone change nothing). ValueError says what is wrong."""
    markers = []
    for key in (START, END):
        given = values.get(key)
        if given is not None and (
            not isinstance(given, str) or not 0 < len(given) <= MAX_MARKER_CHARS
        ):
            raise ValueError(f"{key} must be a string of 1 to {MAX_MARKER_CHARS} characters")
        markers.append(given)
    budget = budget_of(values.get(BUDGET))
    if budget is None:
        return None
    start, end = markers
    if start is None or end is None:
        raise ValueError(NO_MARKERS)
    if values.get(_GRAMMAR) is not None and values.get(_AFTER) is None:
        raise ValueError(GRAMMAR_FIRST)
    return Thinking(budget, start, end)


def single_id(text: str, encode: Encode) -> int | None:
    """`text`'s token id where the tokenizer has it as a token of its own (without
    special tokens, as vLLM tokenizes), alone and beside other text; None otherwise."""
    ids = encode(text, False)
    if len(ids) != 1:
        return None
    for around in _NEIGHBOURS:
        if ids[0] not in encode(around.format(text), False):
            return None  # merged with its neighbours: a word piece, not a token
    return ids[0]


def marker_ids(text: str, key: str, encode: Encode) -> tuple[int, ...]:
    """`text`'s token id; ValueError where it is not a token of its own."""
    found = single_id(text, encode)
    if found is None:
        raise ValueError(
            f"{key} {text!r} is not a single token of the model's tokenizer (alone and "
            "beside other text), as the thoughts' markers of a thinking model are: vLLM's "
            "reasoning parsers refuse a tokenizer without their think start/end tokens"
        )
    return (found,)


def _last_match(tokens: list[int], marker: tuple[int, ...], offset: int, current: int) -> int:
    """The position of the last match of `marker` in `tokens` (which start at `offset`
    of the sequence), or `current` where there is none."""
    size = len(marker)
    first = marker[0]
    for at in range(len(tokens) - size + 1):
        if tokens[at] == first and tuple(tokens[at : at + size]) == marker:
            current = offset + at
    return current


class ThinkingBudget:
    """One sequence's budget: `forced` says, before each token is sampled, which token
    the step must take (None: sampling as usual). The markers' last positions are kept
    as tokens come, so each step looks at the new tokens only (a preempted sequence
    keeps its tokens, so what was found stays found)."""

    __slots__ = ("_budget", "_end", "_last_end", "_last_start", "_scanned", "_start")

    def __init__(self, budget: int, start: tuple[int, ...], end: tuple[int, ...]) -> None:
        self._budget = budget
        self._start = start
        # vLLM forces its reasoning_end_str and reads thoughts as closed at its parser's
        # end string; here both are `reasoning_end_str`.
        self._end = end
        self._last_start = -1
        self._last_end = -1
        self._scanned = 0

    @classmethod
    def of(cls, thinking: Thinking, encode: Encode) -> ThinkingBudget:
        start = marker_ids(thinking.start, START, encode)
        end = marker_ids(thinking.end, END, encode)
        if start == end:
            # A start inside the end would open the thoughts again with each end.
            raise ValueError(
                f"{START} {thinking.start!r} and {END} {thinking.end!r} are the same "
                "token: the thoughts' start must differ from their end"
            )
        return cls(thinking.budget, start, end)

    def forced(self, tokens: list[int]) -> int | None:
        """The token this step must take, given the sequence's tokens so far (the
        prompt's, then the generated ones); None where the thoughts are not open, or
        are open within the budget."""
        total = len(tokens)
        # A match may straddle what was scanned and what is new: scan again a marker's
        # length less one.
        window = tokens[self._scanned : total]
        self._last_start = _last_match(window, self._start, self._scanned, self._last_start)
        self._last_end = _last_match(window, self._end, self._scanned, self._last_end)
        self._scanned = max(0, total - (max(len(self._start), len(self._end)) - 1))
        start = self._last_start
        if start < 0 or start <= self._last_end:
            return None
        if total - start - len(self._start) < self._budget:
            return None
        end = self._end
        begun = 0
        for size in range(1, min(total, len(end) - 1) + 1):
            if tuple(tokens[total - size :]) == end[:size]:
                begun = size
        return end[begun]
