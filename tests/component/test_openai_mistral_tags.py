"""Mistral's tags through the `llm` engine (tests/llmrepo.py's tiny model, its tokenizer
with `[THINK]`, `[/THINK]`, `[TOOL_CALLS]`, `[ARGS]` and `[INST]` as special tokens, as
Mistral's tokenizers make them): with the mistral parsers, the engine's text keeps the
parsers' tags and still skips every other special token (the engine's
`kept_special_tokens`), so the thoughts read apart from the answer as vLLM's decoding of
mistral-common's tokenizer lets its parser read them. The seeded random model writes a
mix of the few tokens each request allows."""

from __future__ import annotations

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

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

SPECIALS = ["[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]", "[INST]"]
THINK, END, INST = 257, 258, 261
A = 64  # "a", a byte token
# Seed 5 writes: a [THINK] [THINK] a a a a a a [INST] [/THINK] a
ASKED = {"temperature": 1, "seed": 5, "max_tokens": 12, "allowed_token_ids": [THINK, END, INST, A]}
WRITTEN = [A, THINK, THINK, A, A, A, A, A, A, INST, END, A]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-mistral-tags")
    llmrepo.write_tiny_llm(folder, "tiny", specials=SPECIALS)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = ToolSettings(parser="mistral", reasoning_parser="mistral")
    async with openai_client(repo, ["tiny"], settings) as client:
        yield client


def _chat(**fields: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Hi"}]
    return {"model": "tiny", "messages": messages, "return_token_ids": True} | ASKED | fields


async def test_the_thoughts_read_apart_and_other_special_tokens_stay_skipped(
    http: httpx.AsyncClient,
) -> None:
    answer = await http.post("/v1/chat/completions", json=_chat())
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["token_ids"] == WRITTEN
    # vLLM's extract_reasoning on "a[THINK][THINK]aaaaaa[/THINK]a": the thoughts up to the
    # first [/THINK] after the first [THINK], the rest the content; [INST] never written.
    message = choice["message"]
    assert (message["reasoning"], message["content"]) == ("[THINK]aaaaaa", "aa")
    # Streamed: every tag dropped (vLLM's streamed deltas).
    deltas = []
    async with http.stream("POST", "/v1/chat/completions", json=_chat(stream=True)) as streamed:
        async for line in streamed.aiter_lines():
            if line.startswith("data: {"):
                deltas.append(json.loads(line[6:])["choices"][0]["delta"])
    thoughts = "".join(d.get("reasoning") or "" for d in deltas)
    said = "".join(d.get("content") or "" for d in deltas)
    assert (thoughts, said) == ("aaaaaa", "aa")


async def test_without_the_parsers_every_special_token_is_skipped(repo: Path) -> None:
    async with openai_client(repo, ["tiny"]) as plain:
        answer = await plain.post("/v1/chat/completions", json=_chat())
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["token_ids"] == WRITTEN
    assert choice["message"]["content"] == "aaaaaaaa"


async def test_the_engine_keeps_the_special_tokens_a_request_names(
    http: httpx.AsyncClient,
) -> None:
    def sampling(**keys: Any) -> str:
        return json.dumps(ASKED | {"ignore_eos": True} | keys)

    body = {"text_input": "Hi", "return_output_ids": True, "exclude_input_in_output": True}
    kept = await http.post(
        "/v2/models/tiny/generate",
        json=body | {"sampling_parameters": sampling(kept_special_tokens=["[INST]", "[X]"])},
    )
    assert kept.status_code == 200, kept.text
    ids = kept.json()["output_ids"]
    assert INST in ids and {THINK, END} & set(ids), ids  # something kept, something not
    # Only [INST] kept ("[X]" is no token: nothing to keep); a client's
    # skip_special_tokens false keeps them all.
    assert kept.json()["text_output"] == "".join(
        "[INST]" if i == INST else "a" if i == A else "" for i in ids
    )
    every = await http.post(
        "/v2/models/tiny/generate",
        json=body | {"sampling_parameters": sampling(skip_special_tokens=False)},
    )
    assert every.json()["output_ids"] == ids
    names = {THINK: "[THINK]", END: "[/THINK]", INST: "[INST]", A: "a"}
    assert every.json()["text_output"] == "".join(names[i] for i in ids)
    refused = await http.post(
        "/v2/models/tiny/generate",
        json=body | {"sampling_parameters": sampling(kept_special_tokens="[INST]")},
    )
    assert refused.status_code == 400
    assert "kept_special_tokens must be a list" in refused.json()["error"]


async def test_a_thinking_budget_closes_mistral_thoughts_and_they_are_counted(
    http: httpx.AsyncClient,
) -> None:
    answer = await http.post("/v1/chat/completions", json=_chat(thinking_token_budget=2))
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    ids = choice["token_ids"]
    # Two tokens after the last [THINK], the budget forces [/THINK] (vLLM's count starts
    # at the last start); before it, the model's own tokens; after it, the model's again.
    assert ids == [A, THINK, THINK, A, A, END, END, END, A, A, INST, END], ids
    message = choice["message"]
    assert (message["reasoning"], message["content"]) == (
        "[THINK]aa",
        "a[/THINK][/THINK]aa[/THINK]",
    )
    # vLLM's count: the tokens inside [THINK]s not yet closed, by depth (the two a's).
    assert answer.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}


async def test_structured_outputs_apply_after_mistral_thoughts(http: httpx.AsyncClient) -> None:
    # The grammar waits for the text `[/THINK]`, which only a kept tag writes.
    constrained = _chat(structured_outputs={"regex": "a{3}"}, max_tokens=20)
    answer = await http.post("/v1/chat/completions", json=constrained)
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    ids = choice["token_ids"]
    closed = ids.index(END)
    assert ids[: closed + 1] == WRITTEN[: closed + 1] and ids[closed + 1 :] == [A, A, A], ids
    message = choice["message"]
    assert (message["reasoning"], message["content"]) == ("[THINK]aaaaaa", "aaaa")
    # The grammar complete, the only tokens the request allows that could end it are
    # ruled out: the engine ends the answer "stop" there (docs/generation.md).
    assert choice["finish_reason"] == "stop"
    # vLLM's depth count: two [THINK]s, one [/THINK], so the answer's a's count too.
    assert answer.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": 10}


@pytest.mark.parametrize("parser", ["granite", "olmo3"])
async def test_parsers_that_read_text_take_no_budget_and_count_nothing(
    repo: Path, parser: str
) -> None:
    async with openai_client(repo, ["tiny"], ToolSettings(reasoning_parser=parser)) as client:
        refused = await client.post("/v1/chat/completions", json=_chat(thinking_token_budget=2))
        answer = await client.post("/v1/chat/completions", json=_chat())
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == "thinking_token_budget"
    assert f"the {parser} reasoning parser reads its model's thoughts from text" in error["message"]
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens_details"] is None
