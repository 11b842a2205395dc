"""The OpenAI-compatible API's failures, over raw HTTP: each is OpenAI's error object
(`{"error": {"message", "type", "param", "code"}}`) with OpenAI's status, never a 500, and
the server goes on serving. Also: a model error mid-stream is one error event that ends
the stream, and a client that leaves cancels its request (the stand-in model sees it)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from http.client import HTTPConnection
from typing import Any

import httpx
import pytest
import textgen
from polling import poll
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = textgen.write(tmp_path_factory.mktemp("openai-errors"))
    with running_server([repo]) as proc:
        yield proc


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    """One client for the module: building one (its TLS context) costs more CPU than most of
    these tests, and it keeps nothing between requests but its pooled connections."""
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    """The error object of a failed answer, checked for OpenAI's shape."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"model": "nope", "messages": HELLO}),
        (COMPLETIONS, {"model": "nope", "prompt": "hi"}),
        (EMBEDDINGS, {"model": "nope", "input": "hi"}),
        # A model of another kind is not one this endpoint has.
        (CHAT, {"model": "embedder", "messages": HELLO}),
        (EMBEDDINGS, {"model": "textgen", "input": "hi"}),
    ],
)
def test_an_unknown_model_is_404(http: httpx.Client, path: str, body: dict[str, Any]) -> None:
    error = error_of(http.post(path, json=body), 404)
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"
    assert body["model"] in error["message"]


def test_retrieving_an_unknown_model_is_404(http: httpx.Client) -> None:
    assert error_of(http.get("/v1/models/nope"), 404)["code"] == "model_not_found"


@pytest.mark.parametrize("verb", ["predict", "explain"])
def test_kserve_v1_calls_are_told_to_use_v2(http: httpx.Client, verb: str) -> None:
    """KServe's REST client speaks its v1 protocol by default; /v1 is OpenAI's here, and
    the answer says so rather than a bare 405."""
    error = error_of(http.post(f"/v1/models/simple:{verb}", json={"instances": [1]}), 404)
    assert error["code"] == "not_found"
    assert "POST /v2/models/simple/infer" in error["message"]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, EMBEDDINGS])
@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b'"text"'])
def test_a_body_that_is_not_a_json_object_is_400(http: httpx.Client, path: str, raw: bytes) -> None:
    response = http.post(path, content=raw, headers={"content-type": "application/json"})
    error_of(response, 400)


# (body, the param the error names)
BAD_CHATS: list[tuple[dict[str, Any], str]] = [
    ({"messages": HELLO}, "model"),
    ({"model": "textgen"}, "messages"),
    ({"model": "textgen", "messages": []}, "messages"),
    ({"model": "textgen", "messages": "hello"}, "messages"),
    ({"model": "textgen", "messages": [{"content": "hi"}]}, "messages[0].role"),
    # Any string is a role (vLLM's rule: the template renders or refuses it), not a number.
    ({"model": "textgen", "messages": [{"role": 5, "content": "hi"}]}, "messages[0].role"),
    ({"model": "textgen", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        {
            "model": "textgen",
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ],
        },
        "messages[0].content[0].type",
    ),
    # The template refuses it (raise_exception).
    ({"model": "textgen", "messages": [{"role": "tool", "content": "42"}]}, "messages"),
    ({"model": "textgen", "messages": HELLO, "temperature": 2.5}, "temperature"),
    ({"model": "textgen", "messages": HELLO, "temperature": -1}, "temperature"),
    ({"model": "textgen", "messages": HELLO, "temperature": "hot"}, "temperature"),
    ({"model": "textgen", "messages": HELLO, "top_p": 0}, "top_p"),
    ({"model": "textgen", "messages": HELLO, "top_p": 1.5}, "top_p"),
    ({"model": "textgen", "messages": HELLO, "top_k": -2}, "top_k"),
    ({"model": "textgen", "messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ({"model": "textgen", "messages": HELLO, "max_tokens": 1.5}, "max_tokens"),
    ({"model": "textgen", "messages": HELLO, "max_completion_tokens": -3}, "max_completion_tokens"),
    ({"model": "textgen", "messages": HELLO, "seed": "x"}, "seed"),
    ({"model": "textgen", "messages": HELLO, "stop": 7}, "stop"),
    ({"model": "textgen", "messages": HELLO, "stop": [""]}, "stop"),
    ({"model": "textgen", "messages": HELLO, "n": 0}, "n"),
    ({"model": "textgen", "messages": HELLO, "n": 129}, "n"),
    ({"model": "textgen", "messages": HELLO, "n": 2, "temperature": 0}, "n"),
    ({"model": "textgen", "messages": HELLO, "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": "textgen", "messages": HELLO, "frequency_penalty": 3}, "frequency_penalty"),
    ({"model": "textgen", "messages": HELLO, "logit_bias": {"50256": "x"}}, "logit_bias"),
    ({"model": "textgen", "messages": HELLO, "logprobs": True}, "logprobs"),
    ({"model": "textgen", "messages": HELLO, "top_logprobs": 2}, "top_logprobs"),
    (
        {"model": "textgen", "messages": HELLO, "response_format": {"type": "structural_tag"}},
        "response_format",
    ),
    ({"model": "textgen", "messages": HELLO, "tools": [{"type": "function"}]}, "tools[0].function"),
    ({"model": "textgen", "messages": HELLO, "stream": "yes"}, "stream"),
    (
        {"model": "textgen", "messages": HELLO, "stream_options": {"include_usage": True}},
        "stream_options",
    ),
    (
        {"model": "textgen", "messages": HELLO, "max_tokens": 5, "max_completion_tokens": 6},
        "max_completion_tokens",
    ),
    # At or past the model's context (64): no room for the prompt.
    ({"model": "textgen", "messages": HELLO, "max_tokens": 64}, "max_tokens"),
]


@pytest.mark.parametrize(("body", "param"), BAD_CHATS, ids=[p for _, p in BAD_CHATS])
def test_a_bad_chat_request_is_400_naming_the_parameter(
    http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    assert error_of(http.post(CHAT, json=body), 400)["param"] == param


def test_max_tokens_past_the_context_says_so(http: httpx.Client) -> None:
    body = {"model": "textgen", "messages": HELLO, "max_tokens": 100}
    assert error_of(http.post(CHAT, json=body), 400)["code"] == "context_length_exceeded"


def test_chat_with_a_model_without_a_template_is_400(http: httpx.Client) -> None:
    error = error_of(http.post(CHAT, json={"model": "textgen_plain", "messages": HELLO}), 400)
    assert error["code"] == "chat_template_missing"
    assert "/v1/completions" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_a_prompt_longer_than_the_context_is_400(
    http: httpx.Client, path: str, stream: bool
) -> None:
    long = " ".join(["word"] * (textgen.MAX_MODEL_LEN + 1))
    body: dict[str, Any] = {"model": "textgen", "stream": stream}
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": long}]
    else:
        body["prompt"] = long
    error = error_of(http.post(path, json=body), 400)
    assert "maximum context length" in error["message"]
    assert error["code"] == "context_length_exceeded"
    # The model's refusal names the field that holds the prompt, as OpenAI's does.
    assert error["param"] == ("messages" if path == CHAT else "prompt")


BAD_COMPLETIONS: list[tuple[dict[str, Any], str]] = [
    ({"model": "textgen"}, "prompt"),
    ({"model": "textgen", "prompt": []}, "prompt"),
    ({"model": "textgen", "prompt": ""}, "prompt"),
    ({"model": "textgen", "prompt": [1, 2, 3]}, "prompt"),
    ({"model": "textgen", "prompt": "a", "add_special_tokens": False}, "add_special_tokens"),
    ({"model": "textgen", "prompt": "a", "best_of": 2}, "best_of"),
    ({"model": "textgen", "prompt": "a", "logprobs": 1}, "logprobs"),
    ({"model": "textgen", "prompt": "a", "suffix": "z"}, "suffix"),
    ({"model": "textgen", "prompt": "a", "temperature": 9}, "temperature"),
    ({"model": "textgen", "prompt": "a", "n": 129}, "n"),
    ({"model": "textgen", "prompt": "a", "n": 3, "best_of": 2}, "best_of"),
]


@pytest.mark.parametrize(("body", "param"), BAD_COMPLETIONS, ids=[p for _, p in BAD_COMPLETIONS])
def test_a_bad_completion_request_is_400(
    http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    assert error_of(http.post(COMPLETIONS, json=body), 400)["param"] == param


BAD_EMBEDDINGS: list[tuple[dict[str, Any], str]] = [
    ({"model": "embedder"}, "input"),
    ({"model": "embedder", "input": []}, "input"),
    ({"model": "embedder", "input": ["a", ""]}, "input"),
    ({"model": "embedder", "input": 5}, "input"),
    ({"model": "embedder", "input": [[1, 2]]}, "input"),
    ({"model": "embedder", "input": ["a"] * 2049}, "input"),
    ({"model": "embedder", "input": "a", "encoding_format": "hex"}, "encoding_format"),
    ({"model": "embedder", "input": "a", "dimensions": 3}, "dimensions"),
]


@pytest.mark.parametrize(("body", "param"), BAD_EMBEDDINGS, ids=[p for _, p in BAD_EMBEDDINGS])
def test_a_bad_embeddings_request_is_400(
    http: httpx.Client, body: dict[str, Any], param: str
) -> None:
    assert error_of(http.post(EMBEDDINGS, json=body), 400)["param"] == param


def test_an_embedding_model_that_leaves_out_its_vector_is_a_server_error(
    http: httpx.Client,
) -> None:
    # A Python model may answer without an output; the embedder does for NO_VECTOR.
    response = http.post(EMBEDDINGS, json={"model": "embedder", "input": "NO_VECTOR"})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error"
    assert error["message"] == "The model 'embedder' did not produce its embedding output 'VECTOR'"
    served = http.post(EMBEDDINGS, json={"model": "embedder", "input": "hello"})
    assert served.status_code == 200, served.text


def sse_lines(response: httpx.Response) -> list[str]:
    return [line for line in response.iter_lines() if line]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_a_model_error_mid_stream_is_one_error_event_that_ends_it(
    http: httpx.Client, path: str
) -> None:
    body: dict[str, Any] = {"model": "textgen", "stream": True}
    if path == CHAT:
        body["messages"] = [{"role": "user", "content": "FAIL_MIDSTREAM now"}]
    else:
        body["prompt"] = "FAIL_MIDSTREAM now"
    with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = sse_lines(response)
    assert all(line.startswith("data: ") for line in lines)
    events = [line.removeprefix("data: ") for line in lines]
    assert "[DONE]" not in events
    *chunks, last = (json.loads(e) for e in events)
    assert chunks and all("choices" in c for c in chunks)
    assert set(last) == {"error"}
    assert last["error"]["message"] == "the model failed mid-stream"
    assert last["error"]["type"] == "server_error"


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_cancels_its_request(
    server: ServerProcess, http: httpx.Client, stream: bool
) -> None:
    before = server.log().count("textgen: cancelled")
    words = " ".join(["SLOW"] * 40)
    body = {"model": "textgen", "prompt": words, "max_tokens": 40, "stream": stream}
    if stream:
        with http.stream("POST", COMPLETIONS, json=body) as response:
            assert response.status_code == 200
            first = next(response.iter_lines())
            assert json.loads(first.removeprefix("data: "))["choices"][0]["text"] == "SLOW"
    else:
        send_then_leave(server, COMPLETIONS, body)
    # 40 tokens take the model 2 s; it stops at its next token once it learns.
    poll(lambda: server.log().count("textgen: cancelled") > before, 10, "the model stops")
    answer = http.post(COMPLETIONS, json={"model": "textgen", "prompt": "still here"})
    assert answer.json()["choices"][0]["text"] == "still here"


def test_an_unknown_route_or_method_under_v1_is_openais_error(http: httpx.Client) -> None:
    assert error_of(http.get("/v1/nothing/here"), 404)["message"].startswith("Not Found")
    assert error_of(http.get(CHAT), 405)["message"].startswith("Method Not Allowed")


def test_a_v1_body_past_the_limit_is_413_even_written_whole(server: ServerProcess) -> None:
    # As Triton's OpenAI front end answers (its test_request_size), declared or chunked;
    # the client reads the answer, not a reset (the lingering close), and the server goes on.
    size = 64 * 1024 * 1024 + 1  # the default --http-max-input-size, and one byte
    expected = {
        "message": f"Request size of {size} bytes exceeds the maximum allowed input size of "
        f"{size - 1} bytes. Use --http-max-input-size to increase the limit.",
        "type": "invalid_request_error",
        "param": None,
        "code": "content_too_large",
    }
    connection = HTTPConnection("127.0.0.1", server.http_port, timeout=60)
    try:
        connection.request(
            "POST", COMPLETIONS, body=b"x" * size, headers={"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        payload = response.read()
    finally:
        connection.close()
    assert response.status == 413, payload[:300]
    assert response.getheader("connection", "").lower() == "close"
    assert json.loads(payload) == {"error": expected}

    def chunks() -> Iterator[bytes]:
        yield b"x" * (size - 1)
        yield b"x"

    chunked = httpx.post(server.base_url + CHAT, content=chunks(), timeout=60)
    assert chunked.status_code == 413
    assert chunked.json() == {"error": expected}
    answer = httpx.post(
        server.base_url + COMPLETIONS, json={"model": "textgen", "prompt": "still here"}
    )
    assert answer.json()["choices"][0]["text"] == "still here"


def test_a_restricted_v1_route_is_401_in_openais_shape(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    repo = textgen.write(tmp_path_factory.mktemp("openai-restricted"))
    with running_server([repo], ["--http-restricted-api=inference:api-key=s3cret"]) as server:
        body = {"model": "textgen", "prompt": "a b"}
        refused = httpx.post(server.base_url + COMPLETIONS, json=body, timeout=30)
        # Triton's OpenAI front end's answer, and the openai client's AuthenticationError.
        assert refused.status_code == 401
        assert refused.json()["error"] == {
            "message": "This API is restricted, expecting header 'api-key' with valid value",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_auth",
        }
        allowed = httpx.post(
            server.base_url + COMPLETIONS, json=body, headers={"api-key": "s3cret"}, timeout=30
        )
        assert allowed.json()["choices"][0]["text"] == "a b"
        # /v1/models is metadata, which this server leaves open.
        assert httpx.get(server.base_url + "/v1/models", timeout=30).status_code == 200


def test_a_client_that_leaves_before_the_first_token_cancels_its_request(
    server: ServerProcess,
) -> None:
    # The status waits for the first token; a client that gives up before it cancels too.
    before = server.log().count("textgen: cancelled")
    send_then_leave(
        server, COMPLETIONS, {"model": "textgen", "prompt": "SLOW_START a b", "stream": True}
    )
    poll(lambda: server.log().count("textgen: cancelled") > before, 10, "the model stops")


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
def test_a_generate_client_that_leaves_before_the_answer_cancels_its_request(
    server: ServerProcess, endpoint: str
) -> None:
    # Triton's generate extension, not streamed: the answer waits for the whole text (on
    # generate_stream too, a model asked for no stream answers once), and a client that
    # leaves meanwhile cancels it, as on /v1.
    before = server.log().count("textgen: cancelled")
    body = {"text_input": " ".join(["SLOW"] * 40), "max_tokens": 40}
    send_then_leave(server, f"/v2/models/textgen/{endpoint}", body)
    poll(lambda: server.log().count("textgen: cancelled") > before, 10, "the model stops")


def send_then_leave(server: ServerProcess, path: str, body: dict[str, Any]) -> None:
    """Send the request on a raw connection, wait until the model has begun on it (its log
    says so), then close the connection without reading an answer."""
    started = server.log().count("textgen: started")
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as connection:
        connection.sendall(head + payload)
        poll(lambda: server.log().count("textgen: started") > started, 10, "the model starts")
