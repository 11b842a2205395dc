"""The prompt tokens found in the prefix cache, as vLLM reports them: chat's and
completions' `usage.prompt_tokens_details.cached_tokens` and the Messages API's
`cache_read_input_tokens` with --enable-prompt-tokens-details (absent without it), the
Responses API's `input_tokens_details.cached_tokens` always, and the engine's opt-in
`num_cached_tokens` output behind `return_num_cached_tokens` over v2 generate.

The engine keeps a finished request's blocks cached (until evicted), so a chat sent after
another with the same system prompt finds it cached; and a second request finds the
first's prompt cached while the first is still generating. The model's prefill budget
(32 tokens) is below the prompt's length, so the two are never admitted in one step: the
second comes in once the first has prefilled a chunk at least, and finds the full blocks
the first has computed by then (never the last token, which is computed for the logits),
whichever of the two reaches the engine first."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import pytest
import pytest_asyncio
from openai_inprocess import openai_client

from ge_serve.server.http.openai.tools import ToolSettings

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

TEXT = "You are a helpful assistant who answers in one short sentence. " * 2  # 128 bytes


def text(tag: str) -> str:
    """The prompt of one test: the engine keeps what every earlier test computed cached,
    so each starts with its own first block."""
    return f"{tag:<8}{TEXT}"


def messages(tag: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text(tag)}]


# Long enough that the other request of a pair comes in while this one still generates.
SAMPLING: dict[str, Any] = {"max_tokens": 60, "temperature": 0, "ignore_eos": True}
USAGE = {"include_usage": True, "continuous_usage_stats": True}


def check_pair(counts: list[int], prompt_tokens: int) -> None:
    """The cached tokens of two requests of one prompt: the first finds none, the second
    full blocks (those the first has computed when it comes in), never the last token,
    which is computed for the logits."""
    first, second = sorted(counts)
    assert first == 0, counts
    assert 0 < second < prompt_tokens and second % llmrepo.BLOCK_SIZE == 0, counts
    assert second >= 32  # the first's first chunk at least: it prefilled before


def events(answer: httpx.Response) -> list[dict[str, Any]]:
    assert answer.status_code == 200, answer.text
    lines = answer.text.splitlines()  # the Responses API's have an `event:` line first
    found = [line[6:] for line in lines if line.startswith("data: {")]
    return [json.loads(text) for text in found]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-cached-tokens")
    # Auto-completed: `num_cached_tokens` behind `return_num_cached_tokens`, as SmolLM2's.
    llmrepo.write_tiny_llm(folder, "auto", {"max_num_batched_tokens": "32"}, interface=False)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["auto"], ToolSettings(prompt_tokens_details=True)) as client:
        yield client


async def test_chat_the_second_of_two_finds_the_prompt_cached(http: httpx.AsyncClient) -> None:
    body = {"model": "auto", "messages": messages("chat"), **SAMPLING}
    stream = body | {"stream": True, "stream_options": USAGE}
    whole, streamed = await asyncio.gather(
        http.post("/v1/chat/completions", json=body),
        http.post("/v1/chat/completions", json=stream),
    )
    assert whole.status_code == 200, whole.text
    usage = whole.json()["usage"]
    prompt_tokens = usage["prompt_tokens"]
    assert prompt_tokens > 100
    chunks = events(streamed)
    final = chunks[-1]["usage"]
    assert final["prompt_tokens"] == prompt_tokens
    counts = [usage["prompt_tokens_details"]["cached_tokens"]]
    counts.append(final["prompt_tokens_details"]["cached_tokens"])
    check_pair(counts, prompt_tokens)
    # vLLM's continuous usage: the details on the role's chunk alone, as in the final usage.
    role, *rest = [c for c in chunks if c["choices"]]
    assert role["choices"][0]["delta"]["role"] == "assistant"
    assert role["usage"]["prompt_tokens_details"] == {"cached_tokens": counts[1]}
    assert rest and all("prompt_tokens_details" not in c["usage"] for c in rest)


async def test_a_chat_after_another_finds_their_system_prompt_cached(
    http: httpx.AsyncClient,
) -> None:
    system = {"role": "system", "content": text("system")}
    counts, prompt_tokens = [], []
    for question in ("Who are you?", "What can you do?"):
        body = {"model": "auto", "messages": [system, {"role": "user", "content": question}]}
        answer = await http.post("/v1/chat/completions", json=body | SAMPLING)  # one by one
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
        counts.append(usage["prompt_tokens_details"]["cached_tokens"])
        prompt_tokens.append(usage["prompt_tokens"])
    assert counts[0] == 0
    # The second finds the first's full blocks of the system prompt (a byte a token).
    least = len(text("system")) // llmrepo.BLOCK_SIZE * llmrepo.BLOCK_SIZE
    assert least <= counts[1] < prompt_tokens[1] and counts[1] % llmrepo.BLOCK_SIZE == 0


async def test_messages_read_the_cached_tokens_out_of_the_input(http: httpx.AsyncClient) -> None:
    # vLLM's _build_anthropic_usage: `cache_read_input_tokens`, and `input_tokens` the
    # rest (min_tokens: the first still generates while the second comes in).
    body = {"model": "auto", "messages": messages("messages"), "max_tokens": 60}
    body["min_tokens"] = 60
    body["temperature"] = 0
    whole, streamed = await asyncio.gather(
        http.post("/v1/messages", json=body),
        http.post("/v1/messages", json=body | {"stream": True}),
    )
    assert whole.status_code == 200, whole.text
    usage = whole.json()["usage"]
    assert list(usage) == ["input_tokens", "output_tokens", "cache_read_input_tokens"]
    prompt_tokens = usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert prompt_tokens > 100 and usage["output_tokens"] == 60
    chunks = events(streamed)
    start, delta = chunks[0]["message"]["usage"], chunks[-2]["usage"]
    assert start == delta | {"output_tokens": 0}  # message_start's and message_delta's
    assert delta["input_tokens"] + delta["cache_read_input_tokens"] == prompt_tokens
    check_pair([usage["cache_read_input_tokens"], delta["cache_read_input_tokens"]], prompt_tokens)


async def test_completions_sum_each_prompts_cached_tokens(http: httpx.AsyncClient) -> None:
    # Three prompts, one request: the first in finds none, the other two all the blocks it
    # prefilled but its last chunk at most (the budget admits none beside a chunk of more
    # than 16 tokens), so their sum passes what one prompt can find (below its length):
    # summed, as vLLM's batch chat sums them, not the last prompt's (vLLM's completions).
    body = {"model": "auto", "prompt": [text("three")] * 3, **SAMPLING}
    whole = await http.post("/v1/completions", json=body)
    assert whole.status_code == 200, whole.text
    usage = whole.json()["usage"]
    per_prompt = usage["prompt_tokens"] // 3
    summed = usage["prompt_tokens_details"]["cached_tokens"]
    assert per_prompt <= summed < 2 * per_prompt and summed % llmrepo.BLOCK_SIZE == 0, summed
    # Two, streamed: one of the two finds the other's blocks.
    body["prompt"] = [text("two"), text("two")]
    streamed = body | {"stream": True, "stream_options": USAGE}
    chunks = events(await http.post("/v1/completions", json=streamed))
    found = chunks[-1]["usage"]["prompt_tokens_details"]
    check_pair([0, found["cached_tokens"]], per_prompt)
    assert list(found) == ["cached_tokens"]
    # Completions' continuous usage never carries them (vLLM's).
    assert all("prompt_tokens_details" not in c["usage"] for c in chunks[:-1])


async def test_without_the_flag_usage_has_no_details_and_responses_count(repo: Path) -> None:
    async with openai_client(repo, ["auto"]) as client:
        body = {"model": "auto", "prompt": [text("prompts")] * 2, **SAMPLING}
        whole = await client.post("/v1/completions", json=body)
        assert whole.status_code == 200, whole.text
        assert "prompt_tokens_details" not in whole.json()["usage"]  # vLLM leaves it out
        chat = {"model": "auto", "messages": messages("chat"), "stream": True}
        chat["stream_options"] = USAGE
        chunks = events(await client.post("/v1/chat/completions", json=chat | SAMPLING))
        assert all("prompt_tokens_details" not in c["usage"] for c in chunks)
        # The Responses API fills its count always, as vLLM's.
        asked = {"model": "auto", "input": text("input"), "max_output_tokens": 60}
        asked["temperature"] = 0
        asked["ignore_eos"] = True
        pair = await asyncio.gather(
            client.post("/v1/responses", json=asked),
            client.post("/v1/responses", json=asked | {"stream": True}),
        )
        assert pair[0].status_code == 200, pair[0].text
        usage = pair[0].json()["usage"]
        done = [e for e in events(pair[1]) if e.get("type") == "response.incomplete"]
        streamed = done[0]["response"]["usage"]
        assert streamed["input_tokens"] == usage["input_tokens"]
        counts = sorted(u["input_tokens_details"]["cached_tokens"] for u in (usage, streamed))
        check_pair(counts, usage["input_tokens"])


async def test_the_engine_reports_cached_tokens_only_where_asked(http: httpx.AsyncClient) -> None:
    sampling = json.dumps({"temperature": 0, "max_tokens": 60, "ignore_eos": True})
    v2 = {"text_input": text("plain"), "sampling_parameters": sampling}
    plain = await http.post("/v2/models/auto/generate", json=v2)
    v2["text_input"] = text("v2")
    assert plain.status_code == 200, plain.text
    assert "num_cached_tokens" not in plain.json()  # Triton's vLLM backend's answer
    asked = v2 | {"return_num_cached_tokens": True, "return_num_input_tokens": True}
    pair = await asyncio.gather(
        *(http.post("/v2/models/auto/generate", json=asked) for _ in range(2))
    )
    found = [answer.json() for answer in pair]
    assert all(answer.status_code == 200 for answer in pair), found
    prompt_tokens = found[0]["num_input_tokens"]
    check_pair([answer["num_cached_tokens"] for answer in found], prompt_tokens)
