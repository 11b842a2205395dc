"""vLLM's `--enable-force-include-usage`: every streamed chat and completion carries its
usage, on each chunk too (vLLM's continuous usage), whatever `stream_options` say; without
the flag a stream carries usage only where its client asks. Not streamed, usage is always
there."""

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

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(60), pytest.mark.asyncio(loop_scope="module")]

SAMPLING: dict[str, Any] = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
}
OFF = {"include_usage": False, "continuous_usage_stats": False}


def chunks(answer: httpx.Response) -> list[dict[str, Any]]:
    assert answer.status_code == 200, answer.text
    found = [line[6:] for line in answer.text.splitlines() if line.startswith("data: {")]
    return [json.loads(text) for text in found]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-forced-usage")
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def forced(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["tiny"], ToolSettings(force_include_usage=True)) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def plain(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["tiny"], ToolSettings()) as client:
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
