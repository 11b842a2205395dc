"""/v1 log probabilities over the llm backend's tiny model (tests/llmrepo.py), as vLLM's
OpenAI server gives them: chat's `logprobs.content` and completions' `tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`, whole and streamed chunk by chunk,
checked against a log-softmax of the numpy reference's logits; and vLLM's refusals."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import numpy as np
import orjson
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import error, openai_client

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

PROMPT = "Count me"
TOKENS = 5
GREEDY = {"temperature": 0, "ignore_eos": True, "max_tokens": TOKENS}
CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = textgen.write(tmp_path_factory.mktemp("openai-logprobs"))
    # Triton's vLLM backend's interface (auto-completed): the flags and `logprobs`.
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["tiny", "textgen"]) as client:
        yield client


async def post(http: httpx.AsyncClient, path: str, **body: Any) -> dict[str, Any]:
    response = await http.post(path, json={"model": "tiny", **GREEDY, **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def chunks(http: httpx.AsyncClient, path: str, **body: Any) -> list[dict[str, Any]]:
    response = await http.post(path, json={"model": "tiny", **GREEDY, **body, "stream": True})
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.split("\n\n") if line.startswith("data: {")]
    return [orjson.loads(line) for line in lines]


async def test_completion_logprobs_are_the_reference_log_softmax(http: httpx.AsyncClient) -> None:
    answer = await post(http, "/v1/completions", prompt=PROMPT, logprobs=2)
    found = answer["choices"][0]["logprobs"]
    assert set(found) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    generated = llmrepo.reference_ids(PROMPT, TOKENS)
    expected = llmrepo.reference_logprobs(PROMPT, generated)
    tokenizer = llmrepo.byte_tokenizer()
    alone = [tokenizer.decode([i]) for i in generated]
    # A byte cut out of a character is repaired (the llm engine's tests check how).
    assert [t for t, a in zip(found["tokens"], alone, strict=True) if not a.endswith("\ufffd")] == [
        a for a in alone if not a.endswith("\ufffd")
    ]
    assert len(found["token_logprobs"]) == TOKENS == answer["usage"]["completion_tokens"]
    for at, token in enumerate(generated):
        assert found["token_logprobs"][at] == pytest.approx(expected[at][token], abs=1e-3)
        tops = found["top_logprobs"][at]
        # The sampled token (greedy: the top one) first, then the next two: logprobs + 1
        # at most, by their text (as vLLM's: two that decode to U+FFFD alone make one).
        # A later one of the same text wins its value, as in vLLM's dict.
        assert next(iter(tops)) == found["tokens"][at] and 1 <= len(tops) <= 3
        third = float(np.sort(expected[at])[-3])
        assert all(third - 1e-3 <= v <= found["token_logprobs"][at] for v in tops.values())
    lengths = [len(t) for t in found["tokens"]]
    assert found["text_offset"] == [sum(lengths[:i]) for i in range(TOKENS)]
    streamed = await chunks(http, "/v1/completions", prompt=PROMPT, logprobs=2)
    parts = [c["choices"][0]["logprobs"] for c in streamed if c["choices"][0]["logprobs"]]
    assert len(parts) > 1
    joined = {key: [v for part in parts for v in part[key]] for key in found}
    assert joined["tokens"] == found["tokens"]
    # Each chunk's offsets begin where the text sent before it ends (vLLM's), which is not
    # the whole answer's where a token's text is not what it added (a cut character's).
    sent = 0
    for chunk in streamed:
        choice = chunk["choices"][0]
        if choice["logprobs"] and choice["logprobs"]["text_offset"]:
            assert choice["logprobs"]["text_offset"][0] == sent
        sent += len(choice["text"])
    assert joined["token_logprobs"] == pytest.approx(found["token_logprobs"], abs=1e-5)


async def test_chat_logprobs_hold_the_sampled_token_and_the_top_n(http: httpx.AsyncClient) -> None:
    answer = await post(http, "/v1/chat/completions", messages=CHAT, logprobs=True, top_logprobs=3)
    content = answer["choices"][0]["logprobs"]["content"]
    assert len(content) == answer["usage"]["completion_tokens"] == TOKENS
    for item in content:
        assert set(item) == {"token", "logprob", "bytes", "top_logprobs"}
        assert item["bytes"] == list(item["token"].encode())
        tops = item["top_logprobs"]
        assert len(tops) == 3 and tops[0]["token"] == item["token"]
        assert tops[0]["logprob"] == item["logprob"] <= 0
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
    # Without top_logprobs: the sampled token's alone; without logprobs: null.
    bare = await post(http, "/v1/chat/completions", messages=CHAT, logprobs=True)
    assert [c["top_logprobs"] for c in bare["choices"][0]["logprobs"]["content"]] == [[]] * TOKENS
    plain = await post(http, "/v1/chat/completions", messages=CHAT)
    assert plain["choices"][0]["logprobs"] is None
    # vLLM's return_tokens_as_token_ids: the tokens as `token_id:<id>`.
    as_ids = await post(
        http, "/v1/completions", prompt=PROMPT, logprobs=0, return_tokens_as_token_ids=True
    )
    expected = [f"token_id:{i}" for i in llmrepo.reference_ids(PROMPT, TOKENS)]
    assert as_ids["choices"][0]["logprobs"]["tokens"] == expected
    streamed = await chunks(
        http, "/v1/chat/completions", messages=CHAT, logprobs=True, top_logprobs=3
    )
    parts = [c["choices"][0]["logprobs"] for c in streamed if c["choices"][0]["logprobs"]]
    assert len(parts) > 1
    joined = [item for part in parts for item in part["content"]]
    assert [i["token"] for i in joined] == [i["token"] for i in content]
    assert [i["logprob"] for i in joined] == pytest.approx([i["logprob"] for i in content])


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs", "`logprobs` must be set"),
        (
            "/v1/chat/completions",
            {"logprobs": True, "top_logprobs": -2},
            "top_logprobs",
            "`top_logprobs` must be a positive value or -1.",
        ),
        (
            "/v1/chat/completions",
            {"logprobs": True, "top_logprobs": 21},
            None,
            "Requested sample logprobs of 21, which is greater than max allowed: 20",
        ),
        ("/v1/completions", {"logprobs": -2}, "logprobs", "`logprobs` must be a positive"),
        (
            "/v1/completions",
            {"prompt_logprobs": 1, "stream": True},
            "prompt_logprobs",
            "`prompt_logprobs` are not available when `stream=True`.",
        ),
        (
            "/v1/chat/completions",
            {"prompt_logprobs": -2},
            "prompt_logprobs",
            "`prompt_logprobs` must be a positive value or -1.",
        ),
        (
            "/v1/completions",
            {"prompt_logprobs": 21},
            None,  # the engine's words, as vLLM's processor's
            "Requested prompt logprobs of 21, which is greater than max allowed: 20",
        ),
    ],
)
async def test_bad_logprobs_are_400(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], param: str | None, words: str
) -> None:
    prompt = {"messages": CHAT} if "chat" in path else {"prompt": PROMPT}
    response = await http.post(path, json={"model": "tiny", **prompt, **body})
    found = error(response)
    assert words in found["message"]
    if param is not None:
        assert found["param"] == param


async def test_a_model_without_a_logprobs_output_refuses_them(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/v1/completions", json={"model": "textgen", "prompt": PROMPT, "logprobs": 1}
    )
    found = error(response)
    assert found["param"] == "logprobs" and "no 'logprobs' output" in found["message"]


async def test_the_openai_client_reads_them(http: httpx.AsyncClient) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is not installed")
    client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http)
    chat = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=TOKENS,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == TOKENS
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].token == c.token for c in content)
    stream = await client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=TOKENS,
        temperature=0,
        logprobs=1,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    tokens = [
        t
        async for chunk in stream
        if chunk.choices[0].logprobs
        for t in chunk.choices[0].logprobs.tokens
    ]
    assert len(tokens) == TOKENS
