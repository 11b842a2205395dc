"""vLLM's /v1 switches. `--enable-force-include-usage`: every streamed chat and completion
carries its usage, on each chunk too (vLLM's continuous usage), whatever `stream_options`
say; without the flag a stream carries usage only where its client asks (not streamed,
usage is always there). `--return-tokens-as-token-ids`: logprobs name tokens
`token_id:<id>` where a request's `return_tokens_as_token_ids` does not say otherwise, on
chat, completions and the Responses API. `--exclude-tools-when-tool-choice-none`: a chat
whose `tool_choice` is "none" renders its template without the tools."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import openai_client

from ge_serve.server.http.openai.tools import ToolSettings

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="module")]

SAMPLING: dict[str, Any] = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
}
OFF = {"include_usage": False, "continuous_usage_stats": False}
MODELS = ("tiny", "tools_shown")
SWITCHED = ToolSettings(force_include_usage=True, tokens_as_ids=True, exclude_tools_when_none=True)
TOOLS_SHOWN = "TOOLS: {{ tools | length if tools else 0 }} {{ messages[-1].content }}"
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


def chunks(answer: httpx.Response) -> list[dict[str, Any]]:
    assert answer.status_code == 200, answer.text
    found = [line[6:] for line in answer.text.splitlines() if line.startswith("data: {")]
    return [json.loads(text) for text in found]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-server-switches")
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    # textgen answers with the prompt its template rendered: here, how many tools it got.
    textgen.write_templated(folder, "tools_shown", TOOLS_SHOWN)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def forced(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, MODELS, SWITCHED) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plain(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, MODELS, ToolSettings()) as client:
        yield client


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("options", [None, OFF], ids=["no-options", "options-off"])
async def test_forced_usage_on_every_stream_and_chunk(
    forced: httpx.AsyncClient, plain: httpx.AsyncClient, route: str, options: Any
) -> None:
    body = {"model": "tiny", **ROUTES[route], **SAMPLING, "stream": True}
    if options is not None:
        body["stream_options"] = options
    found = chunks(await forced.post(route, json=body))
    *answer, last = found
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == 4
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 4
    assert answer and all(chunk["usage"] is not None for chunk in answer)
    assert answer[-1]["usage"]["completion_tokens"] == 4
    # Without the flag: no usage anywhere.
    found = chunks(await plain.post(route, json=body))
    assert all(chunk["choices"] for chunk in found)
    assert all(chunk.get("usage") is None for chunk in found)


def tokens(route: str, answer: httpx.Response) -> list[str]:
    assert answer.status_code == 200, answer.text
    found = answer.json()
    if route == "/v1/responses":
        return [entry["token"] for entry in found["output"][0]["content"][0]["logprobs"]]
    logprobs = found["choices"][0]["logprobs"]
    if route == "/v1/completions":
        return [str(token) for token in logprobs["tokens"]]
    return [entry["token"] for entry in logprobs["content"]]


LOGPROBS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {**ROUTES["/v1/chat/completions"], "logprobs": True, "top_logprobs": 1},
    "/v1/completions": {**ROUTES["/v1/completions"], "logprobs": 1},
    "/v1/responses": {"input": "hi", "include": ["message.output_text.logprobs"]},
}


@pytest.mark.parametrize("route", LOGPROBS)
async def test_tokens_as_ids_where_the_request_does_not_say(
    forced: httpx.AsyncClient, plain: httpx.AsyncClient, route: str
) -> None:
    body = {"model": "tiny", **LOGPROBS[route], "temperature": 0}
    body["max_output_tokens" if route == "/v1/responses" else "max_tokens"] = 4
    shown = tokens(route, await plain.post(route, json=body))
    as_ids = tokens(route, await forced.post(route, json=body))
    assert len(shown) == len(as_ids) == 4
    assert all(token.startswith("token_id:") and int(token[9:]) >= 0 for token in as_ids)
    assert not any(token.startswith("token_id:") for token in shown)
    if route == "/v1/chat/completions":  # vLLM's: the sampled token's bytes are its text's
        answer = (await forced.post(route, json=body)).json()["choices"][0]["logprobs"]
        texts = (await plain.post(route, json=body)).json()["choices"][0]["logprobs"]
        for shown_as_id, as_text in zip(answer["content"], texts["content"], strict=True):
            assert shown_as_id["bytes"] == list(as_text["token"].encode())
            top = shown_as_id["top_logprobs"][0]
            assert top["bytes"] == list(top["token"].encode())  # as shown, as vLLM's
    if route != "/v1/responses":  # the request's own field wins, either way
        body["return_tokens_as_token_ids"] = False
        assert tokens(route, await forced.post(route, json=body)) == shown
        body["return_tokens_as_token_ids"] = True
        assert tokens(route, await plain.post(route, json=body)) == as_ids


@pytest.mark.parametrize("choice", ["none", "auto", None])
async def test_tool_choice_none_keeps_the_tools_out_of_the_template(
    forced: httpx.AsyncClient, plain: httpx.AsyncClient, choice: str | None
) -> None:
    body: dict[str, Any] = {"model": "tools_shown", "messages": [{"role": "user", "content": "hi"}]}
    body |= {"tools": [WEATHER], "max_tokens": 3}
    if choice is not None:
        body["tool_choice"] = choice
    for http, shown in ((plain, "1"), (forced, "0" if choice == "none" else "1")):
        answer = await http.post("/v1/chat/completions", json=body)
        if choice != "none":  # "auto", also the default with tools, needs a parser
            assert answer.status_code == 400, answer.text
            continue
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == f"TOOLS: {shown} hi"
