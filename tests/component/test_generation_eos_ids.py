"""Several EOS ids in the generation engine, by vLLM's rules (SamplingParams'
update_from_generation_config): the tokenizer's EOS (the `eos_token`'s id) ends an
answer with no `stop_reason`; the generation config's other EOS ids (the rest of
`eos_token_ids`) are stop token ids to vLLM, so an answer they end carries that id as its
`stop_reason`; `ignore_eos` lets them through too, and `min_tokens` holds them off. The
tiny model (tests/llmrepo.py), driven in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import llmrepo
import pytest

from ge_serve.scheduler.generation import GenerationScheduler

pytestmark = pytest.mark.timeout(120)

# The greedy answer to "Hello" has "U" (token 52) fourth; the answer to "t" has the
# tokenizer's EOS (256) third.
HELLO, U = "Hello", 52
EOS_THIRD = "t"


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[GenerationScheduler]:
    # "U" is a second EOS id, as Llama 3.1's generation config lists <|eom_id|>.
    eos = llmrepo.tiny_model().eos_id
    folder = llmrepo.write_tiny_llm(tmp_path, "m", {"eos_token_ids": f"{eos},{U}"})
    built = llmrepo.engine_of(folder)
    yield built
    await built.close(1)


async def answer(
    engine: GenerationScheduler, prompt: str, **sampling: Any
) -> tuple[list[int], str, object]:
    """A greedy, non-streamed answer's tokens, finish reason and `stop_reason`."""
    response, parameters = await llmrepo.greedy_reply(engine, prompt, **sampling)
    ids = [int(i) for i in response["output_ids"]]
    return ids, response["finish_reason"][0].decode(), parameters.get("stop_reason")


async def test_another_eos_id_is_the_stop_reason(scheduler: GenerationScheduler) -> None:
    assert llmrepo.reference_ids(HELLO, 4)[3] == U
    assert await answer(scheduler, HELLO, max_tokens=12) == (
        llmrepo.reference_ids(HELLO, 4),
        "stop",
        U,
    )
    # The tokenizer's EOS ends an answer with no stop_reason, as before.
    assert llmrepo.reference_ids(EOS_THIRD, 3)[2] == llmrepo.tiny_model().eos_id
    assert await answer(scheduler, EOS_THIRD, max_tokens=6) == (
        llmrepo.reference_ids(EOS_THIRD, 3),
        "stop",
        None,
    )


async def test_ignore_eos_and_min_tokens_cover_every_eos_id(
    scheduler: GenerationScheduler,
) -> None:
    # vLLM adds the other EOS ids to stop_token_ids only without ignore_eos.
    ids, reason, stop = await answer(scheduler, HELLO, max_tokens=6, ignore_eos=True)
    assert ids == llmrepo.reference_ids(HELLO, 6) and (reason, stop) == ("length", None)
    # They are in its all_stop_token_ids, which min_tokens bans.
    ids, _, _ = await answer(scheduler, HELLO, max_tokens=8, min_tokens=6)
    assert U not in ids[:6] and len(ids) > 6, ids
