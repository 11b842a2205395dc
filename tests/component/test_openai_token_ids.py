"""vLLM's `return_token_ids` and reasoning token counts on /v1 (server/http/openai/
tokenids.py), over the llm backend's tiny model (tests/llmrepo.py), read with the
official `openai` client where it reads them (vLLM's fields are its `model_extra`):

- completions: each choice's `token_ids` (generated) and `prompt_token_ids`; streamed,
  each chunk's own ids, the prompt's on each choice's first chunk;
- chat: each choice's `token_ids`, the prompt's ids beside the choices; streamed, on
  each role chunk;
- a model that reports no `output_ids` is a 400 on `return_token_ids`;
- with --reasoning-parser, `usage.completion_tokens_details.reasoning_tokens` (and the
  Responses API's `output_tokens_details`) count the thought tokens as vLLM does, on
  the ids: a tokenizer whose `<think>` and `</think>` are tokens of their own."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import llmrepo
import pytest
import pytest_asyncio
from openai_inprocess import error, openai_client

from ge_serve.server.http.openai.tools import ToolSettings

openai = pytest.importorskip("openai", reason="the openai client is not installed (test extra)")
pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="module")]

GREEDY: dict[str, Any] = {"temperature": 0, "extra_body": {"ignore_eos": True}}
CHAT = [{"role": "user", "content": "K"}]
RENDERED = "user: K\nassistant: "  # tests/llmrepo.py's chat template
THINK, END = 257, 258  # the thinker's tokenizer's `<think>` and `</think>`


def ids_of(text: str) -> list[int]:
    return list(llmrepo.byte_tokenizer().encode(text).ids)


def extra(item: Any, name: str) -> Any:
    return (item.model_extra or {})[name]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-token-ids")
    llmrepo.write_tiny_llm(folder, "tiny")  # declares `output_ids`
    llmrepo.write_tiny_llm(folder, "auto", interface=False)  # auto-completed: opt-in ids
    config = llmrepo.write_tiny_llm(folder, "noids") / "config.pbtxt"
    lines = config.read_text(encoding="utf-8").splitlines(keepends=True)
    config.write_text("".join(x for x in lines if '"output_ids"' not in x), encoding="utf-8")
    llmrepo.write_tiny_llm(folder, "thinker")
    tokenizer = llmrepo.byte_tokenizer()
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.save(str(folder / "thinker" / "1" / "tokenizer.json"))
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(repo: Path) -> AsyncIterator[Any]:
    async with openai_client(repo, ["tiny", "auto"]) as http:
        yield openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=http)


async def test_completions_give_each_prompts_and_choices_ids(client: Any) -> None:
    prompts = ["zz", "D"]
    body = {"return_token_ids": True, "ignore_eos": True}
    answer = await client.completions.create(
        model="tiny", prompt=prompts, max_tokens=3, temperature=0, extra_body=body
    )
    for choice, prompt in zip(answer.choices, prompts, strict=True):
        assert extra(choice, "token_ids") == llmrepo.reference_ids(prompt, 3)
        assert extra(choice, "prompt_token_ids") == ids_of(prompt)
    # n = 2, sampled: each choice's ids are its own text's; the prompt's the same.
    answer = await client.completions.create(
        model="tiny", prompt="zz", max_tokens=4, n=2, seed=5, extra_body=body
    )
    texts = set()
    for choice in answer.choices:
        ids = extra(choice, "token_ids")
        assert len(ids) == 4 and llmrepo.answer_text(ids) == choice.text
        assert extra(choice, "prompt_token_ids") == ids_of("zz")
        texts.add(choice.text)
    assert len(texts) == 2
    # Not asked: null, as vLLM's.
    plain = await client.completions.create(model="tiny", prompt="zz", max_tokens=2, **GREEDY)
    assert extra(plain.choices[0], "token_ids") is None
    assert extra(plain.choices[0], "prompt_token_ids") is None


async def test_completions_streamed_with_echo(client: Any) -> None:
    chunks = await client.completions.create(
        model="tiny", prompt=["zz", "D"], max_tokens=3, echo=True, stream=True,
        temperature=0, extra_body={"return_token_ids": True, "ignore_eos": True},
    )  # fmt: skip
    ids: dict[int, list[int]] = {0: [], 1: []}
    firsts: dict[int, Any] = {}
    async for chunk in chunks:
        (choice,) = chunk.choices
        if choice.index in firsts:
            assert extra(choice, "prompt_token_ids") is None  # the first chunk's alone
        else:
            firsts[choice.index] = extra(choice, "prompt_token_ids")
            assert choice.text.startswith(["zz", "D"][choice.index])  # the echo kept
        ids[choice.index] += extra(choice, "token_ids")
    assert firsts == {0: ids_of("zz"), 1: ids_of("D")}
    assert ids == {0: llmrepo.reference_ids("zz", 3), 1: llmrepo.reference_ids("D", 3)}


async def test_chat_ids_whole_and_streamed(client: Any) -> None:
    body = {"return_token_ids": True, "ignore_eos": True}
    answer = await client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=3, temperature=0, extra_body=body
    )
    whole = extra(answer.choices[0], "token_ids")
    assert whole == llmrepo.reference_ids(RENDERED, 3)
    assert extra(answer, "prompt_token_ids") == ids_of(RENDERED)
    chunks = await client.chat.completions.create(
        model="tiny", messages=CHAT, max_tokens=3, temperature=0, n=2, seed=1, stream=True,
        extra_body=body | {"temperature": 1},
    )  # fmt: skip
    streamed: dict[int, list[int]] = {0: [], 1: []}
    roles = 0
    async for chunk in chunks:
        (choice,) = chunk.choices
        if choice.delta.role:
            roles += 1
            assert extra(chunk, "prompt_token_ids") == ids_of(RENDERED)
        else:
            streamed[choice.index] += extra(choice, "token_ids") or []
    assert roles == 2 and all(len(ids) == 3 for ids in streamed.values())


async def test_a_model_without_output_ids_refuses(repo: Path) -> None:
    async with openai_client(repo, ["noids"]) as http:
        asks = (("/v1/completions", {"prompt": "zz"}), ("/v1/chat/completions", {"messages": CHAT}))
        for path, prompt in asks:
            body = {"model": "noids", "return_token_ids": True, **prompt}
            found = error(await http.post(path, json=body))
            assert found["param"] == "return_token_ids", found
            assert "output_ids" in found["message"]
        # Only asked for: without it the model answers.
        answer = await http.post("/v1/completions", json={"model": "noids", "prompt": "zz"})
        assert answer.status_code == 200
        assert answer.json()["usage"]["completion_tokens_details"] is None


async def test_an_auto_completed_model_gives_ids_only_where_asked(repo: Path) -> None:
    # Triton's vLLM backend's interface, auto-completed: ge-serve adds `output_ids`
    # behind the flag `return_output_ids`, so /v1 reads the ids, and v2 sees them only
    # where asked, as that backend's other outputs.
    sampling = json.dumps({"temperature": 0, "max_tokens": 3, "ignore_eos": True})
    async with openai_client(repo, ["auto"]) as http:
        body = {"model": "auto", "prompt": "zz", "max_tokens": 3, "temperature": 0}
        answer = await http.post(
            "/v1/completions", json=body | {"ignore_eos": True, "return_token_ids": True}
        )
        assert answer.status_code == 200, answer.text
        ids = answer.json()["choices"][0]["token_ids"]
        assert len(ids) == 3
        assert llmrepo.byte_tokenizer().decode(ids) == answer.json()["choices"][0]["text"]
        v2 = {"text_input": "zz", "sampling_parameters": sampling}
        plain = await http.post("/v2/models/auto/generate", json=v2)
        assert plain.status_code == 200, plain.text
        assert "output_ids" not in plain.json()
        asked = await http.post("/v2/models/auto/generate", json=v2 | {"return_output_ids": True})
        assert asked.status_code == 200, asked.text
        assert asked.json()["output_ids"] == ids


def vllm_count(parser: str, ids: list[int]) -> int:
    """vLLM 0.34's count_reasoning_tokens on generated ids: deepseek_r1's depth count
    (BaseThinkingReasoningParser), qwen3's thoughts from the first token to `</think>`."""
    count = depth = 0
    if parser == "qwen3":
        for token in ids:
            if token == END:
                break
            count += token != THINK
        return count
    for token in ids:
        if token == THINK:
            depth += 1
        elif token == END:
            depth -= depth > 0
        elif depth:
            count += 1
    return count


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
async def test_reasoning_tokens_are_counted_on_the_ids(repo: Path, parser: str) -> None:
    settings = ToolSettings(reasoning_parser=parser)
    body = {
        "model": "thinker", "messages": CHAT, "max_tokens": 12, "temperature": 0,
        "ignore_eos": True, "return_token_ids": True, "logit_bias": {str(THINK): 3},
    }  # fmt: skip
    async with openai_client(repo, ["thinker"], settings) as http:
        whole = (await http.post("/v1/chat/completions", json=body)).json()
        ids = whole["choices"][0]["token_ids"]
        expected = vllm_count(parser, ids)
        assert 0 < expected < len(ids), ids  # a mix of thoughts and tags
        details = whole["usage"]["completion_tokens_details"]
        assert details == {"reasoning_tokens": expected}
        # n = 2: the choices' counts summed.
        two = (
            await http.post(
                "/v1/chat/completions", json=body | {"n": 2, "seed": 3, "temperature": 1}
            )
        ).json()
        counts = [vllm_count(parser, c["token_ids"]) for c in two["choices"]]
        assert two["usage"]["completion_tokens_details"] == {"reasoning_tokens": sum(counts)}
        # Streamed: the usage chunk, and each chunk's count so far (continuous usage).
        options = {"include_usage": True, "continuous_usage_stats": True}
        stream = body | {"stream": True, "stream_options": options}
        answer = await http.post("/v1/chat/completions", json=stream)
        events = [json.loads(line[6:]) for line in answer.text.split("\n\n") if line[6:7] == "{"]
        assert events[-1]["usage"]["completion_tokens_details"] == details
        assert events[0]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
        so_far = [e["usage"]["completion_tokens_details"]["reasoning_tokens"] for e in events]
        assert so_far == sorted(so_far) and so_far[-2] == expected
        # The Responses API's count.
        responses = {"model": "thinker", "input": "K", "max_output_tokens": 12}
        for streamed in (False, True):
            asked = responses | {"temperature": 0, "stream": streamed}
            asked |= {"ignore_eos": True, "logit_bias": {str(THINK): 3}}
            found = await http.post("/v1/responses", json=asked)
            if streamed:
                done = [e for e in found.text.split("\n\n") if "response.incomplete" in e]
                usage = json.loads(done[0].split("data: ", 1)[1])["response"]["usage"]
            else:
                usage = found.json()["usage"]
            assert usage["output_tokens_details"]["reasoning_tokens"] == expected, usage


async def test_thoughts_not_countable_are_not_counted_as_none(repo: Path) -> None:
    # The tiny model's tokenizer has no `<think>` token: thoughts it writes as text cannot
    # be counted on the ids, and a count of 0 would say the answer had none.
    settings = ToolSettings(reasoning_parser="qwen3")
    body = {"model": "tiny", "messages": CHAT, "max_tokens": 4, "temperature": 0}
    async with openai_client(repo, ["tiny"], settings) as http:
        whole = await http.post("/v1/chat/completions", json=body)
        assert whole.status_code == 200, whole.text
        assert whole.json()["choices"][0]["message"]["reasoning"]  # qwen3: all thoughts
        assert whole.json()["usage"]["completion_tokens_details"] is None
        stream = body | {"stream": True, "stream_options": {"include_usage": True}}
        answer = await http.post("/v1/chat/completions", json=stream)
        events = [json.loads(line[6:]) for line in answer.text.split("\n\n") if line[6:7] == "{"]
        assert "completion_tokens_details" not in events[-1]["usage"]


async def test_thoughts_count_as_vllms_parsers() -> None:
    from ge_serve.server.http.openai.tokenids import Tags  # the module's counter itself

    for parser in ("deepseek_r1", "qwen3"):
        tags = Tags(parser == "qwen3", THINK, END, 300, True)
        for ids in (
            [1, THINK, 2, THINK, 3, END, 4, END, 5, END, THINK, 6],
            [2, 3, END, 4, THINK, 5],
            [THINK, 7, 300, 8, END],
        ):
            counted = tags.thoughts()
            for token in ids:  # one token at a time, as a stream's
                counted.feed([token])
            whole = tags.thoughts()
            whole.feed(ids)
            # qwen3's `<tool_call>` (300 here) ends the thoughts as `</think>` does.
            read = [END if t == 300 and parser == "qwen3" else t for t in ids]
            reference = vllm_count(parser, read)
            assert counted.count == whole.count == reference, (parser, ids)
    # qwen3 with thinking off (reasoning.py's plan), and a parser without tag tokens.
    assert Tags(True, THINK, END, None, False).thoughts().count == 0
    off = Tags(True, None, None, None, False).thoughts()
    off.feed([1, 2, 3])
    assert off.count == 0
