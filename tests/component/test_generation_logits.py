"""vLLM's logits processors in the generation engine: the penalties, `min_p`,
`logit_bias`, `allowed_token_ids` and `bad_words`, with vLLM's meanings and order, and
its checks. The tiny model (tests/llmrepo.py), driven in process; each greedy answer is
the numpy reference's, processed by vLLM's rule written out here, step by step."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import llama_reference
import llmrepo
import numpy as np
import numpy.typing as npt
import pytest
from recording_sink import RecordingSink

from ge_serve.backends.base import RequestContext
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = pytest.mark.timeout(180)

# The greedy answer to "Hello" repeats "U" (token 52) from its fourth token on.
HELLO, U = "Hello", 52
Rule = Callable[[npt.NDArray[np.float64], list[int], list[int]], npt.NDArray[np.float64]]


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[GenerationScheduler]:
    folder = llmrepo.write_tiny_llm(tmp_path, "m")
    built = llmrepo.engine_of(folder)
    yield built
    await built.close(1)


# A greedy, non-streamed answer: its text, its tokens and its finish reason.
generate = llmrepo.greedy_answer


def reference(prompt: str, steps: int, rule: Rule) -> list[int]:
    """The reference model's greedy answer with `rule` applied to each step's logits."""
    model = llmrepo.tiny_model()
    prompt_ids = llmrepo.prompt_ids(prompt)
    out: list[int] = []
    for _ in range(steps):
        ids = prompt_ids + out
        logits = llama_reference.forward(model.weights, model.cfg, ids, first=len(ids) - 1)[-1]
        token = int(np.argmax(rule(logits.astype(np.float64), prompt_ids, out)))
        out.append(token)
        if token == model.eos_id:
            break
    return out


def vllm_penalties(repetition: float = 1.0, frequency: float = 0.0, presence: float = 0.0) -> Rule:
    """vLLM's penalties: repetition over prompt and output (positive logits divided,
    negative multiplied), frequency and presence over the output's counts."""

    def rule(
        logits: npt.NDArray[np.float64], prompt: list[int], out: list[int]
    ) -> npt.NDArray[np.float64]:
        counts = np.bincount(np.array(out, dtype=np.intp), minlength=logits.size)
        seen = counts > 0
        seen[prompt] = True
        logits = np.where(seen & (logits > 0), logits / repetition, logits)
        logits = np.where(seen & (logits <= 0), logits * repetition, logits)
        penalised: npt.NDArray[np.float64] = logits - frequency * counts - presence * (counts > 0)
        return penalised

    return rule


@pytest.mark.parametrize(
    "penalty",
    [{"repetition_penalty": 2.0}, {"frequency_penalty": 1.5}, {"presence_penalty": 2.0}],
    ids=["repetition", "frequency", "presence"],
)
async def test_a_penalty_stops_a_repeating_greedy_answer_as_vllms_rule_says(
    scheduler: GenerationScheduler, penalty: dict[str, float]
) -> None:
    assert llmrepo.reference_ids(HELLO, 12)[3:11] == [U] * 8
    _, ids, _ = await generate(scheduler, HELLO, max_tokens=12, **penalty)
    key, value = next(iter(penalty.items()))
    rule = vllm_penalties(**{key.removesuffix("_penalty"): value})
    assert ids == reference(HELLO, 12, rule)
    assert ids[3:11] != [U] * 8


async def test_logit_bias_makes_greedy_pick_its_token(scheduler: GenerationScheduler) -> None:
    _, ids, reason = await generate(scheduler, HELLO, max_tokens=6, logit_bias={"120": 100})
    assert (ids, reason) == ([120] * 6, "length")
    # Clamped to vLLM's -100, as a bias of -1e9 would be: the greedy's first token goes.
    first = llmrepo.reference_ids(HELLO, 1)[0]
    _, ids, _ = await generate(scheduler, HELLO, max_tokens=4, logit_bias={str(first): -1e9})

    def banned_first(logits: Any, prompt: list[int], out: list[int]) -> Any:
        logits = logits.copy()
        logits[first] -= 100
        return logits

    assert ids == reference(HELLO, 4, banned_first) and ids[0] != first


async def test_logit_bias_comes_before_the_penalties(scheduler: GenerationScheduler) -> None:
    # vLLM adds the bias, then scales by the repetition penalty: the two do not commute.
    bias = {str(U): 3.0}
    _, ids, _ = await generate(
        scheduler, HELLO, max_tokens=10, logit_bias=bias, repetition_penalty=1.5
    )
    penalties = vllm_penalties(repetition=1.5)

    def rule(logits: Any, prompt: list[int], out: list[int]) -> Any:
        logits = logits.copy()
        logits[U] += 3.0
        return penalties(logits, prompt, out)

    assert ids == reference(HELLO, 10, rule)


async def test_allowed_token_ids_restrict_every_token(scheduler: GenerationScheduler) -> None:
    allowed = [65, 66, 67, 70]
    _, ids, _ = await generate(scheduler, HELLO, max_tokens=8, allowed_token_ids=allowed)
    assert len(ids) == 8 and set(ids) <= set(allowed)
    for seed in range(3):
        _, ids, _ = await generate(
            scheduler, HELLO, max_tokens=8, temperature=1.0, seed=seed, allowed_token_ids=allowed
        )
        assert len(ids) == 8 and set(ids) <= set(allowed), ids


async def test_bad_words_never_appear(scheduler: GenerationScheduler) -> None:
    text, ids, _ = await generate(scheduler, HELLO, max_tokens=12, bad_words=["U"])
    assert U not in ids and "U" not in text
    # A word of two tokens: its last is banned only after the first, so "U" comes, "UU" not.
    text, ids, _ = await generate(scheduler, HELLO, max_tokens=12, bad_words=["UU"])
    assert "U" in text and "UU" not in text, text


async def test_min_p_keeps_only_tokens_within_its_ratio(scheduler: GenerationScheduler) -> None:
    model = llmrepo.tiny_model()
    ids = llmrepo.prompt_ids(HELLO)
    logits = llama_reference.forward(model.weights, model.cfg, ids, first=len(ids) - 1)[-1]
    probs = np.exp(logits - logits.max())  # at temperature 1, relative to the most likely
    firsts = set()
    for seed in range(12):
        _, out, _ = await generate(
            scheduler, HELLO, max_tokens=1, temperature=1.0, seed=seed, min_p=0.3
        )
        firsts.add(out[0])
    assert all(probs[t] >= 0.3 * 0.999 for t in firsts), sorted(probs[list(firsts)])
    # Without it, the same seeds pick some token below the ratio.
    plain = set()
    for seed in range(12):
        _, out, _ = await generate(scheduler, HELLO, max_tokens=1, temperature=1.0, seed=seed)
        plain.add(out[0])
    assert any(probs[t] < 0.3 for t in plain)


async def test_a_request_that_leaves_no_token_possible_stops(
    scheduler: GenerationScheduler,
) -> None:
    eos = llmrepo.tiny_model().eos_id
    # Only the EOS allowed, and min_tokens bans it: nothing may come, and nothing does.
    assert await generate(
        scheduler, HELLO, max_tokens=4, min_tokens=2, allowed_token_ids=[eos]
    ) == ("", [], "stop")
    # The only allowed token is a bad word: nothing may come from the first token on.
    text, ids, reason = await generate(
        scheduler, HELLO, max_tokens=8, allowed_token_ids=[U], bad_words=["U"]
    )
    assert (text, ids, reason) == ("", [], "stop")


REFUSED = [
    ({"presence_penalty": 3}, "presence_penalty must be in [-2, 2], got 3.0."),
    ({"frequency_penalty": -2.5}, "frequency_penalty must be in [-2, 2], got -2.5."),
    ({"repetition_penalty": 0}, "repetition_penalty must be greater than zero, got 0.0."),
    ({"min_p": 1.5}, "min_p must be in [0, 1], got 1.5."),
    (
        {"logit_bias": {"x": 1}},
        "logit_bias contains key(s) that cannot be converted to integer token IDs: ['x']",
    ),
    (
        {"logit_bias": {"320": 1, "5": 2}},
        "token_id(s) [320] in logit_bias contain out-of-vocab token ids. Vocabulary size: 320",
    ),
    ({"allowed_token_ids": [1, 320]}, "allowed_token_ids contains out-of-vocab token id!"),
    ({"allowed_token_ids": []}, "allowed_token_ids is not None and empty!"),
    ({"bad_words": ["a", ""]}, "bad_words cannot contain an empty string. Got bad_words=['a', '']"),
    (
        {"bad_words": [f"w{i}" for i in range(129)]},
        "Too many bad words after tokenization: 129. The max number is 128.",
    ),
]


@pytest.mark.parametrize(("sampling", "message"), REFUSED, ids=[m[:24] for _, m in REFUSED])
async def test_bad_values_are_refused_in_vllms_words(
    scheduler: GenerationScheduler, sampling: dict[str, Any], message: str
) -> None:
    with pytest.raises(ServerError) as refused:
        await generate(scheduler, HELLO, **sampling)
    assert refused.value.code is ErrorCode.INVALID_ARG
    assert refused.value.message == message


async def test_logprobs_stay_those_of_the_raw_logits(scheduler: GenerationScheduler) -> None:
    sink = RecordingSink()
    sampling = {"temperature": 0, "logprobs": 0, "logit_bias": {"120": 100}, "max_tokens": 2}
    inputs = {
        "text_input": np.array([HELLO.encode()], dtype=object),
        "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=object),
        "return_logprobs": np.array([True]),
    }
    await scheduler.submit(WorkItem(inputs, 1, context=RequestContext(responses=sink)))
    await sink.until_final()
    (response,) = sink.responses
    entries = json.loads(response["logprobs"][0])
    raw = llmrepo.reference_logprobs(HELLO, [120, 120])
    found = [entry["120"]["logprob"] for entry in entries]
    assert np.allclose(found, [raw[0][120], raw[1][120]], atol=1e-3)
