"""vLLM's request log as an operator reads it: `--enable-log-requests` logs each /v1
generation request as it goes to the model (its prompt only at DEBUG, cut to
--max-log-len), `--enable-log-outputs` its answers, a stream's pieces and its whole text.
The model is tests/textgen.py's echo: its answer is the prompt, word by word."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import openai_client

from ge_serve.server.control.requestlog import RequestLogging

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHAT = "/v1/chat/completions"
LOGGER = "ge_serve.requests"
HI = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return textgen.write(tmp_path_factory.mktemp("openai-request-log"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def logged(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = RequestLogging(requests=True, max_len=12, outputs=True)
    async with openai_client(repo, ["textgen"], request_log=settings) as client:
        yield client


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def quiet(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["textgen"]) as client:
        yield client


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]


async def test_a_request_and_its_answer_are_logged(
    logged: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    body = {"model": "textgen", "messages": HI, "max_tokens": 20, "temperature": 0.5}
    headers = {"X-Request-Id": "abc"}
    answer = await logged.post(CHAT, json=body, headers=headers)
    assert answer.status_code == 200, answer.text
    text = answer.json()["choices"][0]["message"]["content"]
    (details, received, generated) = lines(caplog)
    # The prompt (the rendered chat) only at DEBUG, cut to --max-log-len.
    assert details == (
        logging.DEBUG,
        "Request chatcmpl-abc details: prompt: '<|im_start|>', prompt_token_ids: None, "
        "prompt_embeds shape: None.",
    )
    level, message = received
    assert level == logging.INFO and message.startswith("Received request chatcmpl-abc: params: ")
    params = json.loads(message.split("params: ", 1)[1].removesuffix(", lora_request: None."))
    assert params["temperature"] == 0.5 and params["n"] == 1
    assert generated == (
        logging.INFO,
        f"Generated response chatcmpl-abc: output: {text[:12]!r}, finish_reason: stop",
    )


async def test_a_streams_pieces_and_whole_text_are_logged(
    logged: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    body = {"model": "textgen", "messages": HI, "max_tokens": 20, "stream": True, "n": 2}
    async with logged.stream("POST", CHAT, json=body, headers={"X-Request-Id": "s"}) as response:
        assert response.status_code == 200
        await response.aread()
    found = [message for _, message in lines(caplog)]
    assert found[0].startswith("Received request chatcmpl-s: params: ")
    # Every choice's pieces and whole text under the request's id, as vLLM logs them.
    deltas = [m for m in found if "(streaming delta)" in m]
    assert len(deltas) > 2 and {m.split(" (")[0] for m in deltas} == {
        "Generated response chatcmpl-s"
    }
    whole = (
        "Generated response chatcmpl-s (streaming complete): output: '<|im_start|>',"
        " finish_reason: streaming_complete"
    )
    assert found[-2:] == [whole, whole]


async def test_each_prompt_of_a_list_is_a_request(
    logged: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    body = {"model": "textgen", "prompt": ["one two", "three"], "max_tokens": 5}
    response = await logged.post("/v1/completions", json=body, headers={"X-Request-Id": "c"})
    assert response.status_code == 200, response.text
    found = [message for _, message in lines(caplog)]
    # vLLM's: each prompt's request `<id>-<p>`, the answers under the request's id.
    assert [m.split(":")[0] for m in found] == [
        "Received request cmpl-c-0",
        "Received request cmpl-c-1",
        "Generated response cmpl-c",
        "Generated response cmpl-c",
    ]
    caplog.clear()
    body = {"model": "textgen", "prompt": "one", "max_tokens": 5}
    response = await logged.post("/v1/completions", json=body, headers={"X-Request-Id": "d"})
    assert response.status_code == 200, response.text
    assert lines(caplog)[0][1].startswith("Received request cmpl-d-0: params: ")


async def test_the_responses_api_is_logged(
    logged: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    body = {"model": "textgen", "input": "hi", "max_output_tokens": 5}
    response = await logged.post("/v1/responses", json=body, headers={"X-Request-Id": "r"})
    assert response.status_code == 200, response.text
    found = [message for _, message in lines(caplog)]
    assert found[0].startswith("Received request resp_r: params: ")
    assert found[1].startswith("Generated response resp_r: output: ")


@pytest.mark.parametrize(
    ("path", "body", "name"),
    [
        ("/v1/responses", {"model": "textgen", "input": "hi", "stream": True}, "resp_t"),
        ("/v1/messages", {"model": "textgen", "messages": HI, "stream": True}, "msg_t"),
    ],
    ids=["responses", "messages"],
)
async def test_the_responses_and_messages_streams_are_logged(
    logged: httpx.AsyncClient,
    caplog: pytest.LogCaptureFixture,
    path: str,
    body: dict[str, object],
    name: str,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    sent = {**body, "max_tokens": 5, "max_output_tokens": 5}
    sent.pop("max_output_tokens" if path == "/v1/messages" else "max_tokens")
    async with logged.stream("POST", path, json=sent, headers={"X-Request-Id": "t"}) as answer:
        assert answer.status_code == 200
        await answer.aread()
    found = [message for _, message in lines(caplog)]
    assert found[0].startswith(f"Received request {name}: params: ")
    assert any(m.startswith(f"Generated response {name} (streaming delta)") for m in found)
    assert found[-1].startswith(f"Generated response {name} (streaming complete): output: ")


async def test_nothing_is_logged_without_the_flags(
    quiet: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    body = {"model": "textgen", "messages": HI, "max_tokens": 5}
    assert (await quiet.post(CHAT, json=body)).status_code == 200
    assert lines(caplog) == []
