"""vLLM's `POST /v1/chat/completions/batch` against a real server and tests/textgen.py's
stand-in (it repeats the prompt its ChatML template rendered): each conversation a
request of the model's, all cancelled when the client leaves or one fails."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import textgen
from polling import poll
from promtext import scrape
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BATCH = "/v1/chat/completions/batch"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = textgen.write(tmp_path_factory.mktemp("openai-chat-batch"))
    with running_server([repo]) as proc:
        yield proc


def said(*texts: str) -> list[list[dict[str, Any]]]:
    return [[{"role": "user", "content": text}] for text in texts]


def pending(server: ServerProcess) -> float:
    found = scrape(server.metrics_url).find("nv_inference_pending_request_count", model="textgen")
    return found[0][1] if found else 0


def drained(server: ServerProcess, started: int, cancelled: int, least: int = 0) -> bool:
    """Nothing queued, and every conversation that began (at least `least`) was
    cancelled."""
    log = server.log()
    begun = log.count("textgen: started") - started
    return pending(server) == 0 and log.count("textgen: cancelled") - cancelled == begun >= least


def test_each_conversation_is_answered_in_order(server: ServerProcess) -> None:
    body = {"model": "textgen", "messages": said("a b", "c"), "max_tokens": 20}
    answer = httpx.post(server.base_url + BATCH, json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    found = answer.json()
    texts = [c["message"]["content"] for c in found["choices"]]
    # textgen repeats the rendered prompt's words.
    assert texts == ["<|im_start|>user a b<|im_end|> <|im_start|>assistant", *texts[1:]]
    assert texts[1] == "<|im_start|>user c<|im_end|> <|im_start|>assistant"
    assert found["usage"]["prompt_tokens"] == 4 + 3
    assert found["usage"]["completion_tokens"] == 4 + 3


def test_a_client_that_leaves_cancels_every_conversation(server: ServerProcess) -> None:
    log = server.log()
    started, cancelled = log.count("textgen: started"), log.count("textgen: cancelled")
    slow = " ".join(["SLOW"] * 40)
    body = {"model": "textgen", "messages": said(slow, slow, slow), "max_tokens": 40}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + BATCH, json=body, timeout=httpx.Timeout(30, read=0.5))
    # Queued conversations leave the queue, begun ones stop.
    poll(lambda: drained(server, started, cancelled, 1), 10, "every conversation cancelled")


def test_one_failing_conversation_fails_the_batch_and_cancels_the_rest(
    server: ServerProcess,
) -> None:
    log = server.log()
    started, cancelled = log.count("textgen: started"), log.count("textgen: cancelled")
    slow = " ".join(["SLOW"] * 40)
    too_long = " ".join(["w"] * (textgen.MAX_MODEL_LEN + 1))
    body = {"model": "textgen", "messages": said(too_long, slow, slow), "max_tokens": 40}
    answer = httpx.post(server.base_url + BATCH, json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "context_length_exceeded"
    poll(lambda: drained(server, started, cancelled), 10, "the other conversations cancelled")
    again = httpx.post(server.base_url + BATCH, json=body | {"messages": said("ok")}, timeout=30)
    assert again.status_code == 200, again.text
