"""An engine `Sequence` for the unit tests of the generation engine's decisions
(scheduler/genplan.py, the prefix cache): greedy, 8 tokens, arrived at second `serial`,
nothing to send its responses to."""

from __future__ import annotations

from typing import Any

from ge_serve.backends.llm.sampler import Sampler
from ge_serve.backends.llm.sampling import SamplingParams
from ge_serve.backends.llm.text import StopStrings
from ge_serve.scheduler.genseq import Sequence


def sequence(
    serial: int, tokens: int | list[int], priority: int = 0, *, computed: int = 0
) -> Sequence:
    """`tokens`: the prompt's ids, or its length (ids 0..n-1)."""
    prompt = list(range(tokens)) if isinstance(tokens, int) else list(tokens)
    params = SamplingParams(max_tokens=8, temperature=0.0, priority=priority)
    none: Any = None
    return Sequence(
        serial=serial, tokens=prompt, prompt_len=len(prompt), max_tokens=8, params=params,
        sampler=Sampler(params), detokenizer=none, stops=StopStrings(()), sink=none,
        stream=False, echo="", arrival_s=float(serial), on_done=lambda: None,
        computed=computed,
    )  # fmt: skip
