"""/v1's choices as vLLM 0.34's OpenAI server shapes them, over the llm backend's tiny
model (tests/llmrepo.py), read with the official `openai` client:

- vLLM sends its objects whole, so every choice has `stop_reason` (the stop string or
  stop token id that ended it, else null), `token_ids`, and completions' `prompt_logprobs`
  and `prompt_token_ids` (null unless asked); chat's answer has `prompt_logprobs` and
  `prompt_token_ids` beside its choices, and its message `reasoning`;
- a stream's last token comes with the finish reason, in one chunk, not a chunk of its
  own after it (vLLM's test_parallel_streaming counts `max_tokens` chunks);
- `echo` with `return_tokens_as_token_ids` shows the prompt's first token as
  `token_id:<id>` too.

The prompts are ones whose greedy continuations are printable, one character a token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import llmrepo
import pytest
import pytest_asyncio
from openai_inprocess import openai_client

# Untyped: the client's own httpx is not the test's (openai_inprocess's in-process app).
openai = pytest.importorskip("openai", reason="the openai client is not installed (test extra)")
pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

# Greedy continuations: "zz" -> "|://", "D" -> "nn  ", chat "K" -> "7Mq".
PROMPTS = ["zz", "D"]
CHAT = [{"role": "user", "content": "K"}]
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-vllm-choices")
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(repo: Path) -> AsyncIterator[Any]:
    async with openai_client(repo, ["tiny"]) as http:
        yield openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http)


def continuation(prompt: str, tokens: int) -> list[str]:
    """The reference's greedy tokens' texts, one character each (checked)."""
    texts = [llmrepo.answer_text([i]) for i in llmrepo.reference_ids(prompt, tokens)]
    assert all(len(text) == 1 and text.isprintable() for text in texts), texts
    return texts


async def test_choices_carry_vllms_null_fields(client: Any) -> None:
    answer = await client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=3, **GREEDY)
    for choice, prompt in zip(answer.choices, PROMPTS, strict=True):
        assert choice.text == "".join(continuation(prompt, 3))
        assert choice.finish_reason == "length" and choice.stop_reason is None
        assert choice.prompt_logprobs is None and choice.prompt_token_ids is None
        assert choice.token_ids is None
    chat = await client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3, **GREEDY)
    choice = chat.choices[0]
    assert choice.message.content == "".join(continuation(llmrepo.rendered(CHAT), 3))
    assert choice.stop_reason is None and choice.token_ids is None
    assert choice.message.reasoning is None
    assert chat.prompt_logprobs is None and chat.prompt_token_ids is None


async def test_stop_reason_names_the_stop_string_or_token_id(client: Any) -> None:
    ids = llmrepo.reference_ids("zz", 4)
    # "|://": the stop token ":" (its id), then the stop string "/".
    by_id = await client.completions.create(
        model="tiny", prompt="zz", max_tokens=4, temperature=0,
        extra_body={"ignore_eos": True, "stop_token_ids": [ids[1]]},
    )  # fmt: skip
    choice = by_id.choices[0]
    assert (choice.text, choice.finish_reason, choice.stop_reason) == ("|", "stop", ids[1])
    by_text = await client.completions.create(
        model="tiny", prompt="zz", max_tokens=4, stop=["/"], **GREEDY
    )
    choice = by_text.choices[0]
    assert (choice.text, choice.finish_reason, choice.stop_reason) == ("|:", "stop", "/")
    chat = await client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=3, stop=["q"], **GREEDY
    )
    assert (chat.choices[0].message.content, chat.choices[0].stop_reason) == ("7M", "q")
    stream = await client.completions.create(
        model="tiny", prompt="zz", max_tokens=4, stop=["/"], stream=True, **GREEDY
    )
    chunks = [chunk.choices[0] async for chunk in stream]
    assert [c.stop_reason for c in chunks] == [None] * (len(chunks) - 1) + ["/"]
    assert chunks[-1].finish_reason == "stop"
    stream = await client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=3, stop=["q"], stream=True, **GREEDY
    )
    last = [chunk.choices[0] async for chunk in stream][-1]
    assert (last.finish_reason, last.stop_reason) == ("stop", "q")


async def test_the_last_streamed_token_carries_the_finish_reason(client: Any) -> None:
    # vLLM's test_parallel_streaming: max_tokens chunks per choice, the last finishing.
    stream = await client.completions.create(
        model="tiny", prompt=PROMPTS, max_tokens=3, stream=True, logprobs=0,
        stream_options={"include_usage": True}, **GREEDY,
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    for index, prompt in enumerate(PROMPTS):
        mine = [c.choices[0] for c in chunks[:-1] if c.choices[0].index == index]
        texts = continuation(prompt, 3)
        assert [c.text for c in mine] == texts
        assert [c.logprobs.tokens for c in mine] == [[t] for t in texts]
        assert [c.finish_reason for c in mine] == [None, None, "length"]
    stream = await client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=3, stream=True, **GREEDY
    )
    deltas = [chunk.choices[0] async for chunk in stream]
    texts = continuation(llmrepo.rendered(CHAT), 3)
    assert [c.delta.content for c in deltas] == ["", *texts]  # the role's chunk first
    assert [c.finish_reason for c in deltas] == [None, None, None, "length"]


async def test_a_token_whose_text_is_held_is_a_chunk_of_its_own(client: Any) -> None:
    # vLLM's: a chunk for every output with tokens, its text "" where a possible stop
    # string holds it back, so a stream is as many chunks as tokens, one token's
    # logprobs each. "zz" -> "|://": the third token's "/" could begin "/x".
    ids = llmrepo.reference_ids("zz", 4)
    stream = await client.completions.create(
        model="tiny", prompt="zz", max_tokens=4, stop=["/x"], stream=True, logprobs=0,
        **GREEDY,
    )  # fmt: skip
    chunks = [chunk.choices[0] async for chunk in stream]
    assert [c.text for c in chunks] == ["|", ":", "", "//"]
    tokens = [c.logprobs.tokens for c in chunks]
    assert tokens == [[llmrepo.answer_text([i])] for i in ids], tokens
    assert [c.finish_reason for c in chunks] == [None, None, None, "length"]
    # Chat, "K" -> "7Mq": the "M" could begin "Mz".
    stream = await client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=3, stop=["Mz"], stream=True, **GREEDY
    )
    deltas = [chunk.choices[0] async for chunk in stream]
    assert [c.delta.content for c in deltas] == ["", "7", "", "Mq"]  # the role's first


async def test_echoed_first_token_as_token_id(client: Any) -> None:
    ids = llmrepo.prompt_ids("zz")
    for prompt in ("zz", ids):
        answer = await client.completions.create(
            model="tiny", prompt=prompt, echo=True, logprobs=0, max_tokens=1,
            extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}, temperature=0,
        )  # fmt: skip
        generated = llmrepo.reference_ids("zz", 1)
        tokens = [f"token_id:{i}" for i in [*ids, *generated]]
        assert answer.choices[0].logprobs.tokens == tokens
        stream = await client.completions.create(
            model="tiny", prompt=prompt, echo=True, logprobs=0, max_tokens=1, stream=True,
            extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True}, temperature=0,
        )  # fmt: skip
        assert [t async for c in stream for t in c.choices[0].logprobs.tokens] == tokens
