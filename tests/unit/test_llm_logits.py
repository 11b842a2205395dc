"""The logits processors of backends/llm/logits.py against vLLM's formulas written out in
numpy on a hand-made row, and the sampler's min_p; vLLM's tokenization of bad words."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ge_serve.backends.llm.logits import LogitsProcessor, bad_words_ids
from ge_serve.backends.llm.sampler import Sampler
from ge_serve.backends.llm.sampling import SamplingError, SamplingParams, sampling_params
from ge_serve.backends.llm.settings import SamplingDefaults

DEFAULTS = SamplingDefaults(max_tokens=16, temperature=1.0, top_p=1.0, top_k=0)
ROW = np.array([2.0, -1.5, 0.5, -0.25, 3.0, 0.0, -4.0, 1.0], dtype=np.float32)
PROMPT = [0, 1, 1]
GENERATED = [2, 3, 2, 5]


def params(**given: object) -> SamplingParams:
    return sampling_params(DEFAULTS, {}, json.dumps(given).encode(), None)


def test_the_penalties_are_vllms_formula() -> None:
    given = params(repetition_penalty=1.3, frequency_penalty=0.4, presence_penalty=-0.7)
    processor = LogitsProcessor(given, (), ROW.size)
    row = ROW.copy()
    out = processor.apply(row, PROMPT + GENERATED, len(PROMPT))
    # vLLM's: tokens of the prompt or the output have a positive logit divided by the
    # repetition penalty, a negative one multiplied; then minus frequency x the output's
    # count and presence where the output has it.
    expected = ROW.astype(np.float64)
    counts = np.bincount(GENERATED, minlength=ROW.size)
    seen = (counts > 0) | np.isin(np.arange(ROW.size), PROMPT)
    expected = np.where(seen, np.where(expected > 0, expected / 1.3, expected * 1.3), expected)
    expected = expected - 0.4 * counts - (-0.7) * (counts > 0)
    assert np.allclose(out, expected, rtol=1e-5, atol=1e-6)
    assert np.array_equal(row, ROW)  # the step's row is never written
    # A token generated later is counted on from where it was.
    out = processor.apply(ROW, [*PROMPT, *GENERATED, 4], len(PROMPT))
    counts[4] += 1
    seen[4] = True
    again = ROW.astype(np.float64)
    again = np.where(seen, np.where(again > 0, again / 1.3, again * 1.3), again)
    assert np.allclose(out, again - 0.4 * counts + 0.7 * (counts > 0), rtol=1e-5, atol=1e-6)


def test_the_mask_and_the_bias_come_before_the_penalties() -> None:
    given = params(
        allowed_token_ids=[0, 2, 4], logit_bias={"2": 1.0, "4": -500}, repetition_penalty=2.0
    )
    out = LogitsProcessor(given, (), ROW.size).apply(ROW, PROMPT + GENERATED, len(PROMPT))
    # 2: (0.5 + 1) seen, so / 2; 4: 3 - 100 (clamped), unseen; 0: 2 seen, / 2.
    assert out.tolist() == [1.0, -math.inf, 0.75, -math.inf, -97.0, -math.inf, -math.inf, -math.inf]


def test_a_bad_words_last_token_is_banned_where_the_output_ends_with_its_prefix() -> None:
    given = params(bad_words=["x"])
    processor = LogitsProcessor(given, ((7,), (3, 2, 6), (5, 1)), ROW.size)
    out = processor.apply(ROW, PROMPT + GENERATED, len(PROMPT))
    # 7 always; 6 after 3, 2 (no); 1 after 5 (the output ends with 5: yes).
    assert np.isneginf(out).nonzero()[0].tolist() == [1, 7]
    # A prefix matched by the prompt only does not count.
    out = LogitsProcessor(given, ((1, 6),), ROW.size).apply(ROW, PROMPT, len(PROMPT))
    assert not np.isneginf(out).any()


def test_bad_words_are_tokenized_as_vllm_does() -> None:
    vocab = {"hi": [1], " hi": [2], "two words": [3, 4, 5], " two words": [6, 4, 5], "a": [7]}

    def encode(text: str, special: bool) -> list[int]:
        assert not special
        return vocab.get(text, [9, 9, 9, 9])

    # " hi" is a new token of the same length: kept; " a" tokenizes longer: dropped.
    assert bad_words_ids((" hi", "two words", "a"), encode) == (
        (1,),
        (2,),
        (3, 4, 5),
        (6, 4, 5),
        (7,),
    )
    with pytest.raises(SamplingError, match="must tokenize to at least one token"):
        bad_words_ids(("z",), lambda text, special: [])


def test_min_p_keeps_tokens_within_its_ratio_of_the_most_likely() -> None:
    logits = np.log(np.array([0.5, 0.2, 0.14, 0.1, 0.06], dtype=np.float32))
    sampler = Sampler(params(temperature=1.0, min_p=0.3, seed=1))
    assert {sampler.sample(logits) for _ in range(300)} == {0, 1}
    # Greedy: vLLM sets min_p to 0, and the argmax is the answer.
    assert params(temperature=0, min_p=0.9).min_p == 0.0


def test_a_request_without_processors_samples_as_before() -> None:
    assert not params(presence_penalty=0, repetition_penalty=1, bad_words=[]).processes_logits
    assert params(logit_bias={"1": 0}).processes_logits
