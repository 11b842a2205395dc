"""The `llm` engine's thinking budget on its own (backends/llm/thinking.py): vLLM's
counting (every token after the last start marker, the prompt's included, while no end
marker follows it) and forcing (the end ids one per step, a begun prefix continued)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ge_serve.backends.llm.thinking import (
    GRAMMAR_FIRST,
    NO_MARKERS,
    NOT_A_BUDGET,
    Thinking,
    ThinkingBudget,
    budget_of,
    single_id,
    thinking_of,
)

START, END = (1, 2), (3, 4, 5)


def run(budget: int, prompt: list[int], sampled: list[int], steps: int) -> list[int]:
    """`steps` tokens: the forced one where there is one, else the next of `sampled`."""
    state = ThinkingBudget(budget, START, END)
    tokens, given = list(prompt), iter(sampled)
    for _ in range(steps):
        forced = state.forced(tokens)
        tokens.append(next(given) if forced is None else forced)
    return tokens[len(prompt) :]


def test_a_prompt_that_opens_the_thoughts_is_counted_from_its_marker() -> None:
    filler = [9] * 10
    assert run(0, [7, 1, 2], filler, 5) == [3, 4, 5, 9, 9]
    assert run(2, [7, 1, 2], filler, 7) == [9, 9, 3, 4, 5, 9, 9]
    # Tokens after the marker in the prompt count too (vLLM's total length).
    assert run(2, [1, 2, 8], filler, 5) == [9, 3, 4, 5, 9]


def test_thoughts_opened_by_the_answer_and_closed_by_the_model() -> None:
    assert run(1, [7], [8, 1, 2, 9, 9, 9], 6) == [8, 1, 2, 9, 3, 4]
    # Closed before the budget: nothing is forced, and a closed prompt forces nothing.
    assert run(5, [7], [1, 2, 3, 4, 5, 9, 9, 9, 9], 9) == [1, 2, 3, 4, 5, 9, 9, 9, 9]
    assert run(0, [1, 2, 6, 3, 4, 5], [9, 9], 2) == [9, 9]
    # Opened again after a close: counted anew.
    assert run(1, [1, 2, 3, 4, 5], [9, 1, 2, 9, 9, 9], 6) == [9, 1, 2, 9, 3, 4]


def test_a_begun_end_marker_is_continued() -> None:
    # The model wrote the end's first id itself as the budget ran out.
    assert run(2, [1, 2], [9, 3, 9, 9], 5) == [9, 3, 4, 5, 9]


def test_markers_split_across_steps_are_found() -> None:
    state = ThinkingBudget(1, START, END)
    tokens = [7, 1]
    assert state.forced(tokens) is None
    tokens += [2]  # the start completes in a later step
    assert state.forced(tokens) is None
    tokens += [9]
    assert state.forced(tokens) == 3


@pytest.mark.parametrize("value", [-2, 1.5, 2.0, True, "3", [1]])
def test_a_budget_that_is_not_one_is_refused_in_vllms_words(value: Any) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(NOT_A_BUDGET)}$"):
        budget_of(value)


def test_unlimited_and_the_markers() -> None:
    assert budget_of(-1) is None and budget_of(None) is None and budget_of(0) == 0
    assert budget_of(2**40) == 2**31 - 1  # vLLM's int32 clamp
    markers = {"reasoning_start_str": "<think>", "reasoning_end_str": "</think>"}
    assert thinking_of(markers) is None
    assert thinking_of({**markers, "thinking_token_budget": -1}) is None
    assert thinking_of({**markers, "thinking_token_budget": 4}) == Thinking(
        4, "<think>", "</think>"
    )
    with pytest.raises(ValueError, match=re.escape(NO_MARKERS)):
        thinking_of({"thinking_token_budget": 4, "reasoning_end_str": "</think>"})
    with pytest.raises(ValueError, match="reasoning_end_str must be a string"):
        thinking_of({**markers, "reasoning_end_str": ""})


def merging_bpe(added: bool) -> Any:
    """A BPE whose merges make `<think>` a token, and `<think>` with a newline another
    (as a BPE trained on chat text does); `added`: `<think>` an added token as well."""
    from tokenizers import Tokenizer, models

    pieces = ["<", "t", "h", "i", "n", "k", ">", "\n", "a", " ", "/"]
    merges = [("<", "t"), ("<t", "h"), ("<th", "i"), ("<thi", "n"), ("<thin", "k")]
    merges += [("<think", ">"), ("<think>", "\n")]
    vocab = {piece: at for at, piece in enumerate(pieces)}
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    if added:
        tokenizer.add_tokens(["<think>"])
    return tokenizer


def test_a_marker_that_merges_with_its_neighbours_is_refused() -> None:
    merging = merging_bpe(added=False)

    def encode(text: str, special: bool) -> list[int]:
        return list(merging.encode(text, add_special_tokens=special).ids)

    alone = encode("<think>", False)
    assert len(alone) == 1 and alone[0] not in encode("\n<think>\n\n", False)
    assert single_id("<think>", encode) is None
    thinking = Thinking(4, "<think>", "a")
    with pytest.raises(ValueError, match="reasoning_start_str '<think>' is not a single token"):
        ThinkingBudget.of(thinking, encode)
    added = merging_bpe(added=True)
    found = single_id("<think>", lambda text, _: list(added.encode(text).ids))
    assert found is not None and found == added.token_to_id("<think>")


def test_a_budget_under_a_grammar_from_the_first_token_is_refused() -> None:
    values = {"thinking_token_budget": 4, "reasoning_start_str": "<think>"}
    values |= {"reasoning_end_str": "</think>", "structured_outputs": {"regex": "a"}}
    with pytest.raises(ValueError, match=f"^{re.escape(GRAMMAR_FIRST)}$"):
        thinking_of(values)
    assert thinking_of(values | {"structured_outputs_after": "</think>"}) is not None
