"""`n` > 1 on /v1/chat/completions and /v1/completions, with the official `openai` client:
over the `llm` engine (the tiny random-weight model of tests/llmrepo.py, sampled with a
seed) and over a Python model (tests/textgen.py's stand-in, which repeats its prompt).

vLLM's meanings are checked against the server itself: choice i of a seeded request is the
answer of one request seeded with seed + i, the prompt is counted once and the choices'
tokens summed, and each streamed chunk carries one choice's index."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import textgen
from llmrepo import write_tiny_llm
from polling import poll
from promtext import scrape
from serverproc import ServerProcess, running_server

if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletionMessageParam
else:
    # Typed as the module when installed; skipped, not failed, where the extra is not.
    openai = pytest.importorskip("openai", reason="the openai client is not installed (test extra)")
pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi there"}]
SAMPLED: dict[str, Any] = {"temperature": 1.0, "max_tokens": 12}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    llm = tmp_path_factory.mktemp("n-llm")
    # The config auto-completed, as Triton's vLLM backend's: with a `logprobs` output.
    write_tiny_llm(
        llm, parameters={"max_model_len": "1024", "kv_cache_blocks": "256"}, interface=False
    )
    python = textgen.write(tmp_path_factory.mktemp("n-python"))
    with running_server([llm, python], timeout=120.0) as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused") as c:
        yield c


def test_chat_n_answers_n_choices_seeded_as_vllm(client: openai.OpenAI) -> None:
    def chat(n: int, seed: int) -> Any:
        return client.chat.completions.create(
            model="tiny_llm", messages=MESSAGES, n=n, seed=seed, **SAMPLED
        )

    answer = chat(3, 40)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    texts = [c.message.content for c in answer.choices]
    # vLLM's parallel sampling: choice i is sampled with seed + i.
    singles = [chat(1, 40 + i) for i in range(3)]
    assert texts == [s.choices[0].message.content for s in singles]
    assert [c.finish_reason for c in answer.choices] == [
        s.choices[0].finish_reason for s in singles
    ]
    assert len(set(texts)) > 1
    # The prompt counted once, the choices' generated tokens summed.
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert answer.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    # Seeded, the whole answer repeats.
    assert [c.message.content for c in chat(3, 40).choices] == texts


def test_completion_n_answers_n_choices(client: openai.OpenAI) -> None:
    def complete(n: int, seed: int) -> Any:
        return client.completions.create(
            model="tiny_llm", prompt="abc", n=n, seed=seed, echo=True, **SAMPLED
        )

    answer = complete(3, 7)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    singles = [complete(1, 7 + i) for i in range(3)]
    # Each choice echoes the prompt (vLLM's echo, per choice).
    assert [c.text for c in answer.choices] == [s.choices[0].text for s in singles]
    assert all(c.text.startswith("abc") for c in answer.choices)
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert answer.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)


def test_a_streamed_chat_interleaves_the_choices_each_finishing_once(
    client: openai.OpenAI,
) -> None:
    chunks = list(
        client.chat.completions.create(
            model="tiny_llm",
            messages=MESSAGES,
            n=2,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
            **SAMPLED,
        )
    )
    whole = client.chat.completions.create(
        model="tiny_llm", messages=MESSAGES, n=2, seed=3, **SAMPLED
    )
    assert all(len(c.choices) == 1 for c in chunks[:-1])
    # Each choice opens with the role, as vLLM's (all openings first).
    assert [(c.choices[0].index, c.choices[0].delta.role) for c in chunks[:2]] == [
        (0, "assistant"),
        (1, "assistant"),
    ]
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks[:-1] if c.choices[0].index == index]
        finished = [c.finish_reason for c in mine if c.finish_reason is not None]
        assert finished == [whole.choices[index].finish_reason]
        assert mine[-1].finish_reason is not None
        assert "".join(c.delta.content or "" for c in mine) == whole.choices[index].message.content
    # One usage chunk, at the end: the prompt once, both choices' tokens.
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None
    assert [c for c in chunks if c.usage is not None] == [usage]
    assert usage.usage.model_dump() == whole.usage.model_dump()


def test_a_streamed_completion_with_continuous_usage_counts_each_choice(
    server: ServerProcess,
) -> None:
    body = {
        "model": "tiny_llm",
        "prompt": "abc",
        "n": 2,
        "seed": 5,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **SAMPLED,
    }
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [httpx.Response(200, content=e).json() for e in events[:-1]]
    *streamed, last = chunks
    counts = {0: 0, 1: 0}
    for chunk in streamed:
        (choice,) = chunk["choices"]
        # vLLM's continuous usage: the chunk's own choice's tokens so far.
        assert chunk["usage"]["completion_tokens"] >= counts[choice["index"]]
        counts[choice["index"]] = chunk["usage"]["completion_tokens"]
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == counts[0] + counts[1]
    assert [c["choices"][0]["finish_reason"] is not None for c in streamed].count(True) == 2


def test_n_with_logprobs_gives_each_choice_its_own(client: openai.OpenAI) -> None:
    def chat(n: int, seed: int) -> Any:
        return client.chat.completions.create(
            model="tiny_llm",
            messages=MESSAGES,
            n=n,
            seed=seed,
            logprobs=True,
            top_logprobs=2,
            **SAMPLED,
        )

    answer = chat(2, 11)
    for index, choice in enumerate(answer.choices):
        single = chat(1, 11 + index).choices[0]
        assert choice.logprobs is not None and choice.logprobs.content
        assert [t.token for t in choice.logprobs.content] == [
            t.token for t in single.logprobs.content
        ]
        assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)


def test_a_streamed_completion_counts_offsets_per_choice(server: ServerProcess) -> None:
    body = {
        "model": "tiny_llm",
        "prompt": "abc",
        "n": 2,
        "seed": 9,
        "logprobs": 1,
        "stream": True,
        **SAMPLED,
    }
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    offsets: dict[int, list[int]] = {0: [], 1: []}
    for event in events[:-1]:
        (choice,) = httpx.Response(200, content=event).json()["choices"]
        if choice["logprobs"]:
            offsets[choice["index"]] += choice["logprobs"]["text_offset"]
    # Each choice's offsets count its own text from 0.
    for found in offsets.values():
        assert found and found[0] == 0 and found == sorted(found)


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"n": 129}, "n must be at most 128, got 129."),
        ({"n": 2, "temperature": 0}, "n must be 1 when using greedy sampling, got 2."),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_n_past_the_bound_or_greedy_is_400(
    server: ServerProcess, path: str, extra: dict[str, Any], words: str
) -> None:
    body = {"model": "tiny_llm", "messages": MESSAGES, "prompt": "abc"} | extra
    answer = httpx.post(server.base_url + path, json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "n"
    assert answer.json()["error"]["message"] == words


def test_a_python_model_answers_n_choices(client: openai.OpenAI) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]
    single = client.chat.completions.create(model="textgen", messages=messages, max_tokens=3)
    answer = client.chat.completions.create(model="textgen", messages=messages, max_tokens=3, n=2)
    assert [c.index for c in answer.choices] == [0, 1]
    assert [c.message.content for c in answer.choices] == [single.choices[0].message.content] * 2
    assert answer.usage is not None and single.usage is not None
    assert answer.usage.prompt_tokens == single.usage.prompt_tokens
    assert answer.usage.completion_tokens == 2 * single.usage.completion_tokens
    chunks = list(
        client.completions.create(model="textgen", prompt="one two three", n=2, stream=True)
    )
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        assert "".join(c.text for c in mine) == "one two three"
        assert [c.finish_reason for c in mine if c.finish_reason] == ["stop"]


def test_a_client_that_leaves_cancels_every_choice(server: ServerProcess) -> None:
    def engine() -> tuple[float, float]:
        """(running sequences, aborted requests) from /metrics."""
        found = scrape(server.metrics_url)
        aborted = found.find("vllm:request_success_total", finished_reason="abort")
        running = found.value("vllm:num_requests_running", model_name="tiny_llm")
        return running, sum(value for _, value in aborted)

    _, aborted = engine()
    body = {
        "model": "tiny_llm",
        "prompt": "Cancel us",
        "n": 3,
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if line)
    poll(lambda: engine() == (0, aborted + 3), 20, "the three sequences leave the engine")


def test_a_choice_that_fails_ends_the_stream_with_its_error(server: ServerProcess) -> None:
    body = {"model": "textgen", "prompt": "FAIL_MIDSTREAM now then", "n": 2, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert "[DONE]" not in events
    last = httpx.Response(200, content=events[-1]).json()
    assert "the model failed mid-stream" in last["error"]["message"]
    for event in events[:-1]:
        (choice,) = httpx.Response(200, content=event).json()["choices"]
        assert choice["finish_reason"] is None
