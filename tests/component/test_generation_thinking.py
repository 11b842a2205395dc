"""The `llm` engine's `thinking_token_budget` (backends/llm/thinking.py) on the tiny model
(tests/llmrepo.py), greedy, against the numpy reference: the thoughts the prompt opened
hold exactly the budget's tokens, then the end marker's token, then the answer goes on
as the model would; thoughts the model closes itself are left alone; the forced token's
log probability is the model's own (vLLM's raw logprobs); a grammar waiting for
`</think>` starts after it. The tokenizer has `<think>` and `</think>` as tokens; markers
that are not tokens of their own, the same token for both, and a grammar from the first
token are refused."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import llmrepo
import numpy as np
import pytest
import pytest_asyncio

from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="module")]

PROMPT = "user: hi\nassistant: <think>"
END = llmrepo.prompt_ids("</think>", think=True)
MARKERS = {"reasoning_start_str": "<think>", "reasoning_end_str": "</think>"}
STEPS = 16


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[GenerationScheduler]:
    folder = llmrepo.write_tiny_llm(tmp_path_factory.mktemp("thinking"), "m", think=True)
    with (folder / "config.pbtxt").open("a") as config:
        config.write('output { name: "logprobs" data_type: TYPE_STRING dims: [ -1 ] }\n')
    scheduler = llmrepo.engine_of(folder)
    yield scheduler
    await scheduler.close(1)


def greedy_after(ids: list[int], forced: range) -> None:
    """Every token of `ids` but the `forced` ones is the reference's greedy choice."""
    expected = llmrepo.reference_logprobs(PROMPT, ids, think=True)
    for at, token in enumerate(ids):
        if at not in forced:
            assert token == int(np.argmax(expected[at])), (at, ids)


@pytest.mark.parametrize("budget", [0, 3])
async def test_the_thoughts_hold_the_budget_then_the_end_then_the_answer(
    engine: GenerationScheduler, budget: int
) -> None:
    free = llmrepo.reference_ids(PROMPT, STEPS, think=True)
    assert END == [258] and END[0] not in free[: budget + 1]  # no end begun by the model itself
    text, ids, reason = await llmrepo.greedy_answer(
        engine, PROMPT, max_tokens=STEPS, thinking_token_budget=budget, **MARKERS
    )
    assert ids[:budget] == free[:budget]
    assert ids[budget : budget + len(END)] == END
    assert reason == "length" and len(ids) == STEPS
    greedy_after(ids, range(budget, budget + len(END)))
    thoughts, closed, answer = text.partition("</think>")
    assert closed and thoughts == llmrepo.answer_text(free[:budget], think=True)
    assert answer == llmrepo.answer_text(ids[budget + 1 :], think=True)


async def test_unlimited_or_no_budget_leaves_the_answer_alone(engine: GenerationScheduler) -> None:
    free = llmrepo.reference_ids(PROMPT, STEPS, think=True)
    for extra in ({}, {"thinking_token_budget": -1, **MARKERS}, MARKERS):
        _, ids, _ = await llmrepo.greedy_answer(engine, PROMPT, max_tokens=STEPS, **extra)
        assert ids == free, extra
    # A prompt with no open thoughts: nothing to close.
    closed = "user: <think>x</think>\nassistant: "
    _, ids, _ = await llmrepo.greedy_answer(
        engine, closed, max_tokens=STEPS, thinking_token_budget=0, **MARKERS
    )
    assert ids == llmrepo.reference_ids(closed, STEPS, think=True)


async def test_thoughts_the_model_closes_itself_are_left_alone(
    engine: GenerationScheduler,
) -> None:
    # A small bias on `</think>` makes the model close its thoughts at the 6th token;
    # a budget of 7 would force `</think>` as the 8th, where the model writes another.
    prompt, nudge = "user: hello\nassistant: <think>", {"logit_bias": {str(END[0]): 1.0}}
    _, own, _ = await llmrepo.greedy_answer(engine, prompt, max_tokens=10, **nudge)
    assert own.index(END[0]) == 5 and own[7] != END[0]
    _, ids, _ = await llmrepo.greedy_answer(
        engine, prompt, max_tokens=10, thinking_token_budget=7, **nudge, **MARKERS
    )
    assert ids == own


async def test_forced_tokens_carry_the_models_own_log_probabilities(
    engine: GenerationScheduler,
) -> None:
    response, _ = await llmrepo.greedy_reply(
        engine, PROMPT, max_tokens=12, logprobs=1, thinking_token_budget=2, **MARKERS
    )
    ids = [int(i) for i in response["output_ids"]]
    assert ids[2:3] == END
    entries = json.loads(response["logprobs"][0])
    expected = llmrepo.reference_logprobs(PROMPT, ids, think=True)
    for at, (token, entry) in enumerate(zip(ids, entries, strict=True)):
        found = entry[str(token)]
        assert found["logprob"] == pytest.approx(expected[at][token], abs=1e-3)
        assert found["rank"] == int(np.count_nonzero(expected[at] >= expected[at][token]))
    assert entries[2][str(END[0])]["rank"] > 1  # not the model's own choice


async def test_a_grammar_after_the_thoughts_starts_with_the_forced_end(
    engine: GenerationScheduler,
) -> None:
    pattern = r"[a-c]{2,5}-[0-9]{3}"
    text, ids, reason = await llmrepo.greedy_answer(
        engine,
        PROMPT,
        max_tokens=40,
        thinking_token_budget=2,
        structured_outputs={"regex": pattern},
        structured_outputs_after="</think>",
        **MARKERS,
    )
    assert ids[2:3] == END and reason == "stop"
    assert re.fullmatch(pattern, text.partition("</think>")[2]), text


@pytest.mark.parametrize(
    ("sampling", "words"),
    [
        ({"thinking_token_budget": -2, **MARKERS}, "`thinking_token_budget` must be a non-"),
        ({"thinking_token_budget": 1.5, **MARKERS}, "or -1 for unlimited."),
        ({"thinking_token_budget": True, **MARKERS}, "or -1 for unlimited."),
        ({"thinking_token_budget": 4}, "reasoning_start_str and reasoning_end_str"),
        ({**MARKERS, "reasoning_start_str": 7}, "reasoning_start_str must be a string"),
        # Not a token of its own: vLLM's parsers refuse such a tokenizer.
        (
            {"thinking_token_budget": 4, **MARKERS, "reasoning_start_str": "<think"},
            "reasoning_start_str '<think' is not a single token of the model's tokenizer",
        ),
        (
            {"thinking_token_budget": 4, **MARKERS, "reasoning_end_str": "</think>\n"},
            "reasoning_end_str '</think>\\n' is not a single token",
        ),
        # The start inside the end: the end would open the thoughts again.
        (
            {"thinking_token_budget": 2, **MARKERS, "reasoning_start_str": "</think>"},
            "are the same token: the thoughts' start must differ from their end",
        ),
        # A grammar from the first token: the end could not be forced through it.
        (
            {"thinking_token_budget": 2, "structured_outputs": {"regex": "a+"}, **MARKERS},
            "thinking_token_budget cannot be enforced under structured_outputs that apply",
        ),
    ],
)
async def test_a_bad_budget_is_refused(
    engine: GenerationScheduler, sampling: dict[str, Any], words: str
) -> None:
    with pytest.raises(ServerError, match=re.escape(words)) as refused:
        await llmrepo.greedy_answer(engine, PROMPT, max_tokens=4, **sampling)
    assert refused.value.code is ErrorCode.INVALID_ARG
