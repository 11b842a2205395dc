"""`min_tokens` in the generation engine, by vLLM's rules (its v1 detokenizer, its
MinTokensLogitsProcessor, its SamplingParams checks): no stop string ends within the
first `min_tokens` tokens, no stop id (EOS whatever `ignore_eos` says, and
`stop_token_ids`) is sampled before then, and a `min_tokens` past the request's limit is
refused. The tiny model (tests/llmrepo.py), driven in process; its greedy answers are the
numpy reference's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import llmrepo
import pytest

from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.server.errors import ErrorCode, ServerError

pytestmark = pytest.mark.timeout(120)

# The greedy answer to "Hello" is "ooUUUUUUUUo": its first token is an unused row (it
# decodes to nothing), and "U" (token 52) is the fourth.
HELLO, U = "Hello", 52
# The greedy answer to "t" has the EOS third.
EOS_THIRD = "t"


@pytest.fixture
async def scheduler(tmp_path: Path) -> AsyncIterator[GenerationScheduler]:
    folder = llmrepo.write_tiny_llm(tmp_path, "m")
    built = llmrepo.engine_of(folder)
    yield built
    await built.close(1)


# A greedy, non-streamed answer: its text, its tokens and its finish reason.
generate = llmrepo.greedy_answer


async def test_no_stop_string_ends_within_min_tokens(scheduler: GenerationScheduler) -> None:
    assert llmrepo.reference_ids(HELLO, 8)[3] == U
    assert await generate(scheduler, HELLO, stop=["U"], max_tokens=12) == (
        "oo",
        llmrepo.reference_ids(HELLO, 4),
        "stop",
    )
    # vLLM's: the stop string counts only where it ends after the sixth token, so the
    # seventh token's "U" ends the answer, which shows the "U"s of tokens 4 to 6.
    text, ids, reason = await generate(scheduler, HELLO, stop=["U"], min_tokens=6, max_tokens=12)
    assert (text, ids, reason) == ("ooUUU", llmrepo.reference_ids(HELLO, 7), "stop")
    # A stop string that begins within min_tokens and ends after them counts.
    text, ids, reason = await generate(scheduler, HELLO, stop=["UUU"], min_tokens=5, max_tokens=12)
    assert (text, len(ids), reason) == ("oo", 6, "stop")


async def test_stop_token_ids_are_held_off_whatever_ignore_eos_says(
    scheduler: GenerationScheduler,
) -> None:
    for ignore_eos in (False, True):
        _, ids, reason = await generate(
            scheduler, HELLO, stop_token_ids=[U], min_tokens=6, max_tokens=12, ignore_eos=ignore_eos
        )
        assert U not in ids[:6] and len(ids) > 6, (ignore_eos, ids, reason)


async def test_the_eos_is_held_off_with_ignore_eos_too(scheduler: GenerationScheduler) -> None:
    eos = llmrepo.tiny_model().eos_id
    assert llmrepo.reference_ids(EOS_THIRD, 3)[2] == eos
    # ignore_eos alone: the EOS is generated, and does not end the answer.
    _, ids, _ = await generate(scheduler, EOS_THIRD, ignore_eos=True, max_tokens=4)
    assert ids[2] == eos
    # With min_tokens it may not come before then, as vLLM bans every stop id.
    _, ids, _ = await generate(scheduler, EOS_THIRD, ignore_eos=True, min_tokens=4, max_tokens=6)
    assert eos not in ids[:4] and len(ids) == 6, ids


async def test_min_tokens_past_the_limit_is_refused(scheduler: GenerationScheduler) -> None:
    with pytest.raises(ServerError) as refused:
        await generate(scheduler, HELLO, max_tokens=3, min_tokens=5)
    assert refused.value.code is ErrorCode.INVALID_ARG
    assert refused.value.message == "min_tokens must be less than or equal to max_tokens=3, got 5."
    # Without max_tokens, the limit the request gets: here the room its 5 tokens leave
    # in the context of 256.
    with pytest.raises(ServerError) as refused:
        await generate(scheduler, HELLO, min_tokens=300)
    assert refused.value.message == (
        "min_tokens must be less than or equal to max_tokens=251, got 300."
    )
    # At the limit: answered, with every token.
    _, ids, reason = await generate(scheduler, HELLO, max_tokens=5, min_tokens=5, stop=["U"])
    assert (len(ids), reason) == (5, "length")
