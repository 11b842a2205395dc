"""A streamed answer of the generation engine is one response per token, as Triton's
vLLM backend sends one per vLLM output (each new token, in DELTA mode): a token whose
text is held back (it could begin a stop string) gets a response of empty text with its
`output_ids` and `num_output_tokens`. The tiny model (tests/llmrepo.py), in process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import llmrepo
import numpy as np
import pytest
from recording_sink import RecordingSink

from ge_serve.backends.base import RequestContext
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.work import WorkItem

pytestmark = pytest.mark.timeout(120)

# The greedy answer to "zz" begins "|://", one character a token.
PROMPT = "zz"


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[GenerationScheduler]:
    built = llmrepo.engine_of(llmrepo.write_tiny_llm(tmp_path, "m"))
    yield built
    await built.close(1)


async def test_a_token_whose_text_is_held_gets_a_response(
    scheduler: GenerationScheduler,
) -> None:
    ids = llmrepo.reference_ids(PROMPT, 4)
    assert llmrepo.answer_text(ids) == "|://"
    sink = RecordingSink()
    sampling = {"temperature": 0, "ignore_eos": True, "stop": ["/x"], "max_tokens": 4}
    inputs = {
        "text_input": np.array([PROMPT.encode()], dtype=object),
        "stream": np.array([True]),
        "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=object),
    }
    await scheduler.submit(WorkItem(inputs, 1, context=RequestContext(responses=sink)))
    await sink.until_final()
    assert not sink.errors, sink.errors
    # The third token's "/" could begin "/x": held, then shown with the fourth's.
    responses = sink.responses
    assert [r["text_output"][0].decode() for r in responses] == ["|", ":", "", "//"]
    assert [[int(i) for i in r["output_ids"]] for r in responses] == [[i] for i in ids]
    assert [int(r["num_output_tokens"][0]) for r in responses] == [1, 1, 1, 1]
