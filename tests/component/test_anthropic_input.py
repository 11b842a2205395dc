"""The fields a Messages request's (`POST /v1/messages`) refusals name: a refusal of
chat's checks names the Messages API's field.

`echo` and the tiny model (tests/anthropicrepo.py) behind one server with
--tool-call-parser hermes and no --reasoning-parser.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from anthropicrepo import write_models
from openai_inprocess import openai_client

from ge_serve.server.http.openai.tools import ToolSettings

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    folder: Path = tmp_path_factory.mktemp("anthropic-input")
    write_models(folder)
    async with openai_client(folder, ["echo", "tiny"], ToolSettings(parser="hermes")) as client:
        yield client


def _body(model: str, said: str, **fields: Any) -> dict[str, Any]:
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": said}]}
    return body | fields


async def _refused(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> str:
    """The message of a 400 in Anthropic's shape."""
    response = await http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    message: str = error["message"]
    return message


@pytest.mark.parametrize(
    ("stops", "said"),
    [(["a"] * 100, "'stop_sequences': at most 64 strings, got 100"),
     (["a" * 2000], "'stop_sequences' strings must be at most 1024 characters long")],
)  # fmt: skip
async def test_the_engines_stop_limits_name_stop_sequences(
    http: httpx.AsyncClient, stops: list[str], said: str
) -> None:
    body = _body("tiny", "K", stop_sequences=stops)
    for stream in (False, True):
        assert await _refused(http, MESSAGES, body | {"stream": stream}) == said


async def test_a_budget_without_a_reasoning_parser_names_budget_tokens(
    http: httpx.AsyncClient,
) -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    message = await _refused(
        http, MESSAGES, _body("echo", "Hi", max_tokens=2000, thinking=thinking)
    )
    assert message.startswith("'thinking.budget_tokens' is set but reasoning_config")
    assert "thinking_token_budget" not in message
