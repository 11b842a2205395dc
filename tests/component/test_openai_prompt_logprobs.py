"""/v1's prompt log probabilities over the llm backend's tiny model (tests/llmrepo.py),
read with the official `openai` client, as vLLM's OpenAI server gives them: completions'
`echo` with `logprobs` (the prompt's tokens first, the first with no logprob; with
`max_tokens: 0`, lm-eval-harness's loglikelihood request, the prompt's alone), whole and
streamed, and `prompt_logprobs` (per completions choice; beside chat's choices), each
value the numpy reference's log-softmax (tests/llama_reference.py) at that position."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import numpy as np
import numpy.typing as npt
import pytest
import pytest_asyncio
from openai_inprocess import openai_client

# Untyped: the client's own httpx is not the test's (openai_inprocess's in-process app).
openai = pytest.importorskip("openai", reason="the openai client is not installed (test extra)")
pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CONTEXT = "The capital of France is"
CONTINUATION = " Paris, of course"
PROMPT = CONTEXT + CONTINUATION
TOKENS = 4
GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-prompt-logprobs")
    # Triton's vLLM backend's interface, auto-completed (with ge-serve's prompt_logprobs).
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["tiny"]) as found:
        yield found


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(http: httpx.AsyncClient) -> Any:
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http)


def log_softmax(ids: list[int]) -> npt.NDArray[np.float64]:
    """The reference's log-softmax at every position of `ids` (row p: token p + 1's)."""
    import llama_reference

    model = llmrepo.tiny_model()
    logits = llama_reference.forward(model.weights, model.cfg, ids, first=0)
    peak = logits.max(-1, keepdims=True)
    result: npt.NDArray[np.float64] = (
        logits - peak - np.log(np.exp(logits - peak).sum(-1, keepdims=True))
    )
    return result


def expected_logprobs(ids: list[int]) -> list[float | None]:
    """vLLM's `token_logprobs` of the whole of `ids`: None first, then each token's."""
    rows = log_softmax(ids)
    return [None, *(float(rows[p][ids[p + 1]]) for p in range(len(ids) - 1))]


def approx(found: Sequence[float | None], expected: Sequence[float | None]) -> None:
    assert len(found) == len(expected)
    assert found[0] is None and expected[0] is None
    assert found[1:] == pytest.approx(expected[1:], abs=1e-3)


async def test_echo_with_logprobs_begins_with_the_prompts_tokens(
    client: Any,
) -> None:
    answer = await client.completions.create(
        model="tiny", prompt=PROMPT, echo=True, logprobs=1, max_tokens=TOKENS, **GREEDY
    )
    choice = answer.choices[0]
    found = choice.logprobs
    assert found is not None and found.tokens and found.token_logprobs and found.top_logprobs
    prompt = llmrepo.prompt_ids(PROMPT)
    generated = llmrepo.reference_ids(PROMPT, TOKENS)
    assert len(found.tokens) == len(prompt) + TOKENS
    # The byte tokenizer: one ASCII character a token.
    assert found.tokens[: len(prompt)] == list(PROMPT)
    assert choice.text.startswith(PROMPT)
    approx(found.token_logprobs, expected_logprobs(prompt + generated))
    assert found.top_logprobs[0] is None and all(found.top_logprobs[1:])
    assert found.text_offset == [
        sum(len(t) for t in found.tokens[:i]) for i in range(len(prompt) + TOKENS)
    ]
    # vLLM's: the choice carries the prompt's entries too (echo asks `logprobs` of them).
    entries = (choice.model_extra or {})["prompt_logprobs"]
    assert len(entries) == len(prompt) and entries[0] is None
    assert all(len(e) <= 2 for e in entries[1:])


async def test_loglikelihood_request_gives_the_prompts_entries_only(
    client: Any,
) -> None:
    # lm-eval-harness's loglikelihood request, as it sends it.
    answer = await client.completions.create(
        model="tiny", prompt=PROMPT, echo=True, logprobs=1, max_tokens=0, temperature=0
    )
    choice = answer.choices[0]
    found = choice.logprobs
    assert found is not None and found.tokens is not None and found.token_logprobs is not None
    prompt = llmrepo.prompt_ids(PROMPT)
    assert choice.text == PROMPT and found.tokens == list(PROMPT)
    approx(found.token_logprobs, expected_logprobs(prompt))
    # What lm-eval sums: the continuation's tokens' logprobs, given the context.
    start = len(llmrepo.prompt_ids(CONTEXT))
    rows = log_softmax(prompt)
    expected = sum(float(rows[p - 1][prompt[p]]) for p in range(start, len(prompt)))
    total = sum(v for v in found.token_logprobs[start:] if v is not None)
    assert total == pytest.approx(expected, abs=1e-3) and total < 0


async def test_loglikelihood_requests_as_lm_eval_batches_token_ids(client: Any) -> None:
    # lm-eval-harness's defaults: its own tokenizer's ids (`tokenized_requests`), several
    # requests in one body (`batch_size` > 1), each answered as its own choice, in order.
    prompts = [PROMPT, CONTEXT + " Rome"]
    ids = [llmrepo.prompt_ids(p) for p in prompts]
    answer = await client.completions.create(
        model="tiny", prompt=ids, echo=True, logprobs=1, max_tokens=0, temperature=0
    )
    assert [c.index for c in answer.choices] == [0, 1]
    for choice, text, tokens in zip(answer.choices, prompts, ids, strict=True):
        found = choice.logprobs
        assert found is not None and found.token_logprobs is not None
        assert choice.text == text and found.tokens == list(text)
        approx(found.token_logprobs, expected_logprobs(tokens))
    assert answer.usage.prompt_tokens == sum(len(t) for t in ids)


async def test_token_ids_are_bounded_by_the_models_vocabulary(client: Any) -> None:
    ids = llmrepo.prompt_ids("Hi")
    # A padding row's id (past the tokenizer's 257, below the model's 320 logits) is in
    # the vocabulary, as vLLM bounds it, and decodes to nothing.
    answer = await client.completions.create(
        model="tiny", prompt=[*ids, 300], echo=True, max_tokens=1, temperature=0
    )
    assert answer.choices[0].text.startswith("Hi")
    assert answer.usage.prompt_tokens == len(ids) + 1
    for bad in (llmrepo.VOCAB, 2**40):
        with pytest.raises(openai.BadRequestError) as info:
            await client.completions.create(
                model="tiny", prompt=[*ids, bad], echo=True, max_tokens=1
            )
        assert f"Token id {bad} is out of vocabulary" in str(info.value)


async def test_token_ids_past_the_context_never_reach_the_model(
    client: Any, http: httpx.AsyncClient
) -> None:
    # Refused before its ids are copied into n requests (megabytes of ids would hold the
    # event loop for seconds): the model counts no request, failed or not.
    async def requests() -> int:
        stats = (await http.get("/v2/models/tiny/stats")).json()["model_stats"][0]
        counts = stats["inference_stats"]
        return int(counts["success"]["count"]) + int(counts["fail"]["count"])

    before = await requests()
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model="tiny", prompt=[[5] * 300, [6]], n=4, echo=True)
    assert info.value.code == "context_length_exceeded"
    assert "the prompt is 300 tokens" in str(info.value)
    assert await requests() == before


async def test_echo_with_logprobs_streamed_sends_the_prompts_entries_first(
    client: Any,
) -> None:
    whole = await client.completions.create(
        model="tiny", prompt=PROMPT, echo=True, logprobs=1, max_tokens=TOKENS, **GREEDY
    )
    stream = await client.completions.create(
        model="tiny", prompt=PROMPT, echo=True, logprobs=1, max_tokens=TOKENS, stream=True,
        **GREEDY,
    )  # fmt: skip
    chunks = [c async for c in stream]
    parts = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs]
    first = parts[0]
    assert first.tokens and first.tokens[: len(PROMPT)] == list(PROMPT)
    assert first.token_logprobs and first.token_logprobs[0] is None
    assert whole.choices[0].logprobs and whole.choices[0].logprobs.token_logprobs
    joined = [v for p in parts for v in p.token_logprobs or []]
    expected = whole.choices[0].logprobs.token_logprobs
    assert joined[0] is None and joined[1:] == pytest.approx(expected[1:], abs=1e-5)


async def test_prompt_logprobs_sit_where_vllm_puts_them(client: Any) -> None:
    prompt = llmrepo.prompt_ids(PROMPT)
    answer = await client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=TOKENS, temperature=0,
        extra_body={"ignore_eos": True, "prompt_logprobs": 2},
    )  # fmt: skip
    choice = answer.choices[0]
    assert choice.logprobs is None and choice.text == llmrepo.reference_text(PROMPT, TOKENS)
    check(prompt, (choice.model_extra or {})["prompt_logprobs"], 2)
    chat = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=TOKENS,
        temperature=0, extra_body={"prompt_logprobs": 0},
    )  # fmt: skip
    rendered = llmrepo.prompt_ids(f"user: {PROMPT}\nassistant: ")
    assert chat.usage is not None and chat.usage.prompt_tokens == len(rendered)
    # vLLM's chat answer has them beside its choices, not in one.
    assert "prompt_logprobs" not in (chat.choices[0].model_extra or {})
    check(rendered, (chat.model_extra or {})["prompt_logprobs"], 0)


def check(ids: list[int], entries: list[Any], top: int) -> None:
    """vLLM's list: None, then per token {token_id: {logprob, rank, decoded_token}}, the
    prompt's token first, then the top `top`."""
    rows, tokenizer = log_softmax(ids), llmrepo.byte_tokenizer()
    assert len(entries) == len(ids) and entries[0] is None
    for position, (token, entry) in enumerate(zip(ids[1:], entries[1:], strict=True)):
        assert next(iter(entry)) == str(token) and len(entry) <= top + 1
        for key, value in entry.items():
            assert set(value) == {"logprob", "rank", "decoded_token"}
            assert value["logprob"] == pytest.approx(rows[position][int(key)], abs=1e-3)
        assert entry[str(token)]["decoded_token"] == tokenizer.decode([token])
