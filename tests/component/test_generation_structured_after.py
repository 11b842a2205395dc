"""Structured outputs after a thinking model's thoughts: the `llm` engine's key
`structured_outputs_after` (ge-serve's; /v1 sends `</think>` with --reasoning-parser).
Until the answer's text has written the marker the grammar masks nothing and consumes
nothing; from the next token on it constrains. The tiny model's tokenizer is byte-level,
so a marker of several characters comes over several tokens. Driven in process, as
tests/component/test_generation_structured.py."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import llmrepo
import numpy as np
import pytest
from recording_sink import RecordingSink

from ge_serve.backends.base import RequestContext
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = pytest.mark.timeout(120)

PATTERN = r"[a-c]{2,5}-\d{3}"
REGEX = {"regex": PATTERN}
TOKENS = 40


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[GenerationScheduler]:
    built = llmrepo.engine_of(llmrepo.write_tiny_llm(tmp_path, "m"))
    yield built
    await built.close(1)


async def generate(
    scheduler: GenerationScheduler, stream: bool = False, **sampling: Any
) -> tuple[str, str]:
    """A greedy answer's text (the deltas joined when streamed) and finish reason."""
    sink = RecordingSink()
    document = {"temperature": 0, "max_tokens": TOKENS, **sampling}
    inputs = {
        # The tiny model's greedy answer to it is ASCII ("ooUUUUUUUUooooo").
        "text_input": np.array([b"Hello"], dtype=object),
        "exclude_input_in_output": np.array([True]),
        "stream": np.array([stream]),
        "sampling_parameters": np.array([json.dumps(document)], dtype=object),
    }
    await scheduler.submit(WorkItem(inputs, 1, context=RequestContext(responses=sink)))
    await sink.until_final(20)
    assert not sink.errors, sink.errors
    text = "".join(r["text_output"][0].decode() for r in sink.responses)
    return text, sink.responses[-1]["finish_reason"][0].decode()


def early_marker(free: str) -> tuple[str, int]:
    """Three printable ASCII characters of the unconstrained answer, early in it but
    after its first token (so three tokens, after one unconstrained), and where the
    answer first has them end."""
    for at in range(1, len(free) - 3):
        piece = free[at : at + 3]
        if all(" " <= c <= "~" for c in piece) and not re.fullmatch(PATTERN, piece):
            return piece, free.index(piece) + 3
    raise AssertionError(f"no ASCII piece in {free!r}")


async def test_no_marker_constrains_from_the_first_token(scheduler: GenerationScheduler) -> None:
    text, reason = await generate(scheduler, structured_outputs=REGEX)
    assert re.fullmatch(PATTERN, text) and reason == "stop", text


async def test_thoughts_that_never_end_are_never_constrained(
    scheduler: GenerationScheduler,
) -> None:
    free, reason = await generate(scheduler)
    assert reason == "length" and "</think>" not in free
    text, reason = await generate(
        scheduler, structured_outputs=REGEX, structured_outputs_after="</think>"
    )
    assert (text, reason) == (free, "length")


@pytest.mark.parametrize("stream", [False, True])
async def test_the_grammar_starts_after_the_marker(
    scheduler: GenerationScheduler, stream: bool
) -> None:
    free, _ = await generate(scheduler, max_tokens=12)
    marker, end = early_marker(free)
    text, reason = await generate(
        scheduler, stream, structured_outputs=REGEX, structured_outputs_after=marker
    )
    assert text[:end] == free[:end], (text, free)
    assert re.fullmatch(PATTERN, text[end:]) and reason == "stop", (text, marker)


async def test_the_key_is_checked(scheduler: GenerationScheduler) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"structured_outputs_after": "</think>"}, "without structured_outputs"),
        ({"structured_outputs": REGEX, "structured_outputs_after": ""}, "1 to 256"),
        ({"structured_outputs": REGEX, "structured_outputs_after": 3}, "must be a string"),
    ]
    for sampling, words in cases:
        with pytest.raises(ServerError) as caught:
            await generate(scheduler, **sampling)
        assert caught.value.code is ErrorCode.INVALID_ARG
        assert words in caught.value.message
