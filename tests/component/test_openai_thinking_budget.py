"""vLLM's `thinking_token_budget` on /v1 over the `llm` engine's tiny model with
`--reasoning-parser deepseek_r1`: chat (whole and streamed), batch chat, completions,
the Responses API and the Messages API's `thinking.budget_tokens` close the thoughts
after the budget with `</think>`, and the answer follows; -1 is unlimited; other values
are vLLM's 400, so is a model whose tokenizer lacks `<think>` and `</think>` as tokens
(the tiny model's `think` tokenizer has them); a grammar from the first token (closed
thoughts) takes no budget on chat, and is a 400 on completions.

The model's context is longer than the tiny model's usual 2048 positions, for Anthropic's
smallest budget (1024 tokens, below `max_tokens`)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import pytest
import pytest_asyncio
import smollm
from openai_inprocess import openai_client

from ge_serve.server.http.openai.tools import ToolSettings

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHAT = "/v1/chat/completions"
# The answer begins in the thoughts the prefill opens (the prompt ends with `<think>`).
OPENED = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "<think>"}]
PROMPT = "user: hi\nassistant: <think>"
END = llmrepo.prompt_ids("</think>", think=True)
LENGTH = 2560


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-thinking-budget")
    base = llmrepo.tiny_model()
    config = smollm.tiny_config(vocab_size=llmrepo.VOCAB, max_position_embeddings=LENGTH)
    model = llmrepo.TinyModel(config, base.weights, base.eos_id)
    parameters = {"max_model_len": str(LENGTH), "kv_cache_blocks": "330"}
    llmrepo.write_tiny_llm(folder, "tiny", parameters, model, interface=False, think=True)
    llmrepo.write_tiny_llm(folder, "bytes", interface=False)  # `<think>`: 7 byte tokens
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = ToolSettings(reasoning_parser="deepseek_r1")
    async with openai_client(repo, ["tiny", "bytes"], settings) as c:
        yield c


def opened(**fields: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "messages": OPENED,
        "add_generation_prompt": False,
        "continue_final_message": True,
        "temperature": 0,
        "max_tokens": 16,
        **fields,
    }


async def chat(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()["choices"][0]
    return found


@pytest.mark.parametrize("budget", [0, 3])
async def test_chat_thoughts_hold_the_budget_then_the_answer_follows(
    http: httpx.AsyncClient, budget: int
) -> None:
    free = llmrepo.reference_ids(PROMPT, 16, think=True)
    found = await chat(http, opened(thinking_token_budget=budget, return_token_ids=True))
    ids = found["token_ids"]
    assert ids[:budget] == free[:budget] and ids[budget : budget + len(END)] == END
    message = found["message"]
    assert (message["reasoning"] or "") == llmrepo.answer_text(free[:budget], think=True)
    answer = llmrepo.answer_text(ids[budget + 1 :], think=True)
    assert (message["content"] or "") == answer
    # Streamed, the same thoughts and answer.
    parts = {"reasoning": "", "content": ""}
    body = opened(thinking_token_budget=budget, stream=True)
    async with http.stream("POST", CHAT, json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                for key in parts:
                    parts[key] += delta.get(key) or ""
    assert parts == {"reasoning": message["reasoning"] or "", "content": answer}


async def test_minus_one_is_unlimited(http: httpx.AsyncClient) -> None:
    free = await chat(http, opened())
    assert free["message"]["content"] is None  # the thoughts never end
    assert await chat(http, opened(thinking_token_budget=-1)) == free


async def test_completions_and_responses_take_the_budget(http: httpx.AsyncClient) -> None:
    thoughts = llmrepo.reference_ids(PROMPT, 2, think=True)
    text = llmrepo.byte_tokenizer(think=True).decode(thoughts + END)
    body = {"model": "tiny", "prompt": PROMPT, "temperature": 0, "max_tokens": 14}
    completion = await http.post("/v1/completions", json=body | {"thinking_token_budget": 2})
    assert completion.status_code == 200, completion.text
    assert completion.json()["choices"][0]["text"].startswith(text)
    said = [{"role": "user", "content": "<think>"}]
    whole = await chat(http, {"model": "tiny", "messages": said, "temperature": 0,
                              "max_tokens": 16, "thinking_token_budget": 0})  # fmt: skip
    assert whole["message"]["content"]
    answer = await http.post(
        "/v1/responses",
        json={"model": "tiny", "input": "<think>", "temperature": 0, "max_output_tokens": 16,
              "thinking_token_budget": 0},
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    output = answer.json()["output"]
    assert output[-1]["content"][0]["text"] == whole["message"]["content"]


async def test_batch_chat_takes_the_budget_for_each_conversation(
    http: httpx.AsyncClient,
) -> None:
    single = await chat(http, opened(thinking_token_budget=1))
    body = opened(thinking_token_budget=1, messages=[OPENED, OPENED])
    response = await http.post(CHAT + "/batch", json=body)
    assert response.status_code == 200, response.text
    messages = [choice["message"] for choice in response.json()["choices"]]
    assert messages == [single["message"]] * 2 and single["message"]["content"]


@pytest.mark.parametrize("budget", [-2, 1.5, True, "3"])
async def test_a_budget_that_is_not_one_is_vllms_400(http: httpx.AsyncClient, budget: Any) -> None:
    for path, body in (
        (CHAT, opened(thinking_token_budget=budget)),
        ("/v1/responses", {"model": "tiny", "input": "hi", "thinking_token_budget": budget}),
    ):
        response = await http.post(path, json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["message"] == (
            "`thinking_token_budget` must be a non-negative integer or -1 for unlimited."
        )
        assert error["param"] == "thinking_token_budget"


async def test_anthropics_budget_tokens_close_the_thinking(http: httpx.AsyncClient) -> None:
    # The prompt's thoughts already hold the smallest budget: the end comes at once.
    said = "<think>" + "b" * 1012
    body = {"model": "tiny", "messages": [{"role": "user", "content": said}], "temperature": 0}
    free = await http.post("/v1/messages", json=body | {"max_tokens": 8})
    assert free.status_code == 200, free.text
    assert [block["type"] for block in free.json()["content"]] == ["thinking"]
    budget = {"max_tokens": 1025, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    found = await http.post("/v1/messages", json=body | budget)
    assert found.status_code == 200, found.text
    blocks = found.json()["content"]
    # No thoughts were written before `</think>`: the answer alone.
    assert [block["type"] for block in blocks] == ["text"] and blocks[0]["text"].startswith("VVV")


async def test_a_tokenizer_without_the_think_tokens_is_a_400(http: httpx.AsyncClient) -> None:
    # vLLM's deepseek_r1 parser refuses such a tokenizer at start; here, the budget.
    for path, body in (
        (CHAT, opened(model="bytes", thinking_token_budget=2)),
        ("/v1/completions", {"model": "bytes", "prompt": PROMPT, "thinking_token_budget": 2}),
    ):
        response = await http.post(path, json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "thinking_token_budget"
        assert (
            "could not locate think start/end tokens in the tokenizer of the model 'bytes'"
            in (error["message"])
        )
    assert (await http.post(CHAT, json=opened(model="bytes"))).status_code == 200


async def test_a_grammar_from_the_first_token_takes_no_budget(http: httpx.AsyncClient) -> None:
    # Thoughts the prompt closed: the grammar applies at once, and there is nothing to
    # close (vLLM's answer); on completions the grammar would hold the thoughts: a 400.
    closed = [{"role": "user", "content": "<think>x</think>"}]
    regex = {"structured_outputs": {"regex": "[a-c]{3}"}, "temperature": 0, "max_tokens": 8}
    body = {"model": "tiny", "messages": closed, **regex}
    free = await chat(http, body)
    assert await chat(http, body | {"thinking_token_budget": 0}) == free
    said = free["message"]  # deepseek_r1 reads an answer without `</think>` as thoughts
    assert len((said["reasoning"] or "") + (said["content"] or "")) == 3
    completion = {"model": "tiny", "prompt": PROMPT, "thinking_token_budget": 0, **regex}
    response = await http.post("/v1/completions", json=completion)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "thinking_token_budget"
    assert "cannot be enforced with structured outputs on completions" in error["message"]
