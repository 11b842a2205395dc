"""/v1/embeddings, /v2/embed, /score and /rerank give up on a request's texts when nobody will read
their vectors, as vLLM does (its @with_cancellation on these routes, and no text of a
refused request embedded): a client that leaves cancels every text still queued, and so
does a text the model refuses.

`slow` is a stand-in embedding model that takes one text per execution and sleeps a
while on each, so a request of many texts keeps most of them queued (its pending count
on /metrics) long after it began; it refuses the text REFUSE at once. What a test reads
is the model's own counts: its pending requests and its successful inferences."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from polling import poll
from promtext import scrape
from pymodels import write_model
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# Texts in a request: without cancellation, every one is embedded, TEXTS * 0.1 s.
TEXTS = 40

SLOW = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)[0]
            if text == b"REFUSE":
                error = pb_utils.TritonError("REFUSE is refused", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            time.sleep(0.1)
            vector = np.array([[1.0, float(len(text)), 0.0]], np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("VECTOR", vector)]))
        return responses
"""

SLOW_CONFIG = """
name: "slow"
backend: "python"
max_batch_size: 1
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "VECTOR" data_type: TYPE_FP32 dims: [ 3 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("embedding-cancel")
    write_model(repo, "slow", SLOW, SLOW_CONFIG)
    with running_server([repo]) as proc:
        yield proc


def texts(count: int) -> list[str]:
    return [f"text {i}" for i in range(count)]


# Each route with a body of TEXTS distinct texts (a query and TEXTS - 1 documents).
BODIES: dict[str, dict[str, Any]] = {
    "/v1/embeddings": {"model": "slow", "input": texts(TEXTS)},
    "/pooling": {"model": "slow", "input": texts(TEXTS)},
    "/v2/embed": {"model": "slow", "texts": texts(TEXTS)},
    "/rerank": {"model": "slow", "query": "query", "documents": texts(TEXTS - 1)},
    "/score": {"model": "slow", "queries": "query", "documents": texts(TEXTS - 1)},
}


def count(server: ServerProcess, metric: str) -> float:
    found = [
        value
        for name, labels, value in scrape(server.metrics_url).samples
        if name == metric and labels.get("model") == "slow"
    ]
    assert len(found) == 1, found
    return found[0]


def embedded(server: ServerProcess) -> float:
    return count(server, "nv_inference_count")


def settled(server: ServerProcess) -> float:
    """The texts the model has embedded, once none is queued; read after one more
    request, which the model takes after any it was running (one instance, FIFO)."""
    poll(
        lambda: count(server, "nv_inference_pending_request_count") == 0,
        60,
        "no text of the request left queued",
    )
    answer = httpx.post(
        f"{server.base_url}/v1/embeddings", json={"model": "slow", "input": "after"}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    return embedded(server) - 1


@pytest.mark.parametrize("path", list(BODIES))
def test_a_client_that_leaves_cancels_the_texts_still_queued(
    server: ServerProcess, path: str
) -> None:
    before = embedded(server)
    payload = json.dumps(BODIES[path]).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as connection:
        connection.sendall(head + payload)
        # The model is on the request's texts, most of them queued behind the first.
        poll(lambda: embedded(server) > before, 30, "the model begins on the texts")
        assert count(server, "nv_inference_pending_request_count") > 0
    # The client has left: the queued texts are dropped, not embedded for no one.
    assert settled(server) - before < TEXTS


@pytest.mark.parametrize("path", list(BODIES))
def test_a_refused_text_cancels_the_others(server: ServerProcess, path: str) -> None:
    before = embedded(server)
    body = json.loads(json.dumps(BODIES[path]))
    # The first text the model takes is the one it refuses, while the others wait.
    if path in ("/v1/embeddings", "/pooling"):
        body["input"][0] = "REFUSE"
    elif path == "/v2/embed":
        body["texts"][0] = "REFUSE"
    else:
        body["query" if path == "/rerank" else "queries"] = "REFUSE"
    answer = httpx.post(server.base_url + path, json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"] == "REFUSE is refused"
    assert settled(server) - before < TEXTS - 1
