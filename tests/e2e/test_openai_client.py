"""The OpenAI-compatible API with the official `openai` client, sync and async, against a
real ge-serve serving the stand-in models of tests/textgen.py (a generative Python model
that follows the model contract, and an embedding one) and, where its package is
installed, the MiniLM ensemble.

The stand-in repeats its prompt's words, so an answer shows the prompt the server built
(the chat template's rendering) and each streamed delta is one word."""

from __future__ import annotations

import base64
import json
import math
import subprocess
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import httpx
import numpy as np
import pytest
import textgen
from serverproc import REPO_ROOT, ServerProcess, running_server

if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletionMessageParam
else:
    # Typed as the module when installed; skipped, not failed, where the extra is not.
    openai = pytest.importorskip("openai", reason="the openai client is not installed (test extra)")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Say hello"},
]
RENDERED_WORDS = textgen.render_chat(MESSAGES).split()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = textgen.write(tmp_path_factory.mktemp("openai"))
    with running_server([repo]) as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused") as c:
        yield c


@pytest.fixture
def async_client(server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused")


def test_models_lists_the_generative_and_embedding_models(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["embedder", "textgen", "textgen_plain"]
    for model in models.data:
        assert model.object == "model"
        assert model.owned_by == "ge-serve"
        assert isinstance(model.created, int) and model.created > 0
    assert client.models.retrieve("textgen").id == "textgen"


def test_chat_not_streamed(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model="textgen", messages=MESSAGES)
    assert chat.object == "chat.completion"
    assert chat.id.startswith("chatcmpl-")
    assert chat.model == "textgen"
    (choice,) = chat.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == " ".join(RENDERED_WORDS)
    assert choice.finish_reason == "stop"
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == len(RENDERED_WORDS)
    assert chat.usage.completion_tokens == len(RENDERED_WORDS)
    assert chat.usage.total_tokens == 2 * len(RENDERED_WORDS)


def test_chat_streamed_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="textgen",
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        max_tokens=3,
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta.content for c in chunks if c.choices]
    # One delta per word, cut at max_tokens.
    assert "".join(d or "" for d in deltas) == " ".join(RENDERED_WORDS[:3])
    assert [d for d in deltas if d] == [
        RENDERED_WORDS[0],
        " " + RENDERED_WORDS[1],
        " " + RENDERED_WORDS[2],
    ]
    closing, usage = chunks[-2], chunks[-1]
    assert closing.choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-2])
    assert usage.choices == [] and usage.usage is not None
    assert usage.usage.completion_tokens == 3
    assert usage.usage.prompt_tokens == len(RENDERED_WORDS)
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_streamed_without_usage_has_no_usage_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model="textgen",
            messages=MESSAGES,
            stream=True,
        )
    )
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert all(c.choices for c in chunks)


def test_sampling_parameters_reach_the_model(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(
        model="textgen",
        messages=[{"role": "user", "content": "SHOW_PARAMS"}],
        temperature=0.7,
        top_p=0.9,
        seed=42,
        stop=["never"],
        max_completion_tokens=5,
        extra_body={"top_k": 20},
    )
    shown = json.loads(chat.choices[0].message.content or "")
    assert shown == {
        "sampling": {
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 20,
            "seed": 42,
            "stop": ["never"],
            "max_tokens": 5,
        },
        "stream": False,
        "exclude_input_in_output": True,
        "max_tokens": 5,
    }


def test_a_stop_string_ends_the_answer(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model="textgen", prompt="one two three four", stop="three"
    )
    assert completion.choices[0].text == "one two"
    assert completion.choices[0].finish_reason == "stop"


def test_completions_not_streamed_and_streamed(client: openai.OpenAI) -> None:
    completion = client.completions.create(model="textgen_plain", prompt="a b c d", max_tokens=3)
    assert completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    assert completion.choices[0].text == "a b c"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (4, 3)

    chunks = list(
        client.completions.create(
            model="textgen_plain",
            prompt=["a b c d"],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "a b c d"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_completions_default_to_16_tokens_as_openai(client: openai.OpenAI) -> None:
    words = [f"w{i}" for i in range(30)]
    completion = client.completions.create(model="textgen", prompt=" ".join(words))
    assert completion.choices[0].text == " ".join(words[:16])
    assert completion.choices[0].finish_reason == "length"


def test_embeddings_float_and_base64(client: openai.OpenAI) -> None:
    texts = ["hello world", "abc 123!", "x"]
    floats = client.embeddings.create(model="embedder", input=texts, encoding_format="float")
    assert floats.object == "list" and floats.model == "embedder"
    assert [d.index for d in floats.data] == [0, 1, 2]
    for item, text in zip(floats.data, texts, strict=True):
        assert item.object == "embedding"
        assert item.embedding == pytest.approx(textgen.embedder_vector(text), abs=1e-6)
    # The model's num_input_tokens output, summed: 2 + 2 + 1 words.
    assert floats.usage.prompt_tokens == 5 and floats.usage.total_tokens == 5
    # The client asks for base64 unless told otherwise, and decodes it.
    default = client.embeddings.create(model="embedder", input="hello world")
    assert default.data[0].embedding == pytest.approx(floats.data[0].embedding, abs=1e-7)


def test_base64_is_little_endian_float32(server: ServerProcess) -> None:
    body = {"model": "embedder", "input": "hello world", "encoding_format": "base64"}
    answer = httpx.post(server.base_url + "/v1/embeddings", json=body, timeout=30).json()
    raw = base64.b64decode(answer["data"][0]["embedding"])
    vector = np.frombuffer(raw, dtype="<f4")
    assert vector.tolist() == pytest.approx(textgen.embedder_vector("hello world"), abs=1e-7)


def test_unknown_model_is_the_clients_not_found_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="nope", messages=MESSAGES)
    assert caught.value.code == "model_not_found"


def test_an_error_mid_stream_raises_in_the_client(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="textgen",
        messages=[{"role": "user", "content": "FAIL_MIDSTREAM please"}],
        stream=True,
    )
    seen = []
    with pytest.raises(openai.APIError, match="the model failed mid-stream"):
        for chunk in stream:
            seen.append(chunk)
    assert seen and seen[-1].choices[0].delta.content


async def test_async_client_chat_completions_and_embeddings(
    async_client: openai.AsyncOpenAI,
) -> None:
    async with async_client as client:
        chat = await client.chat.completions.create(
            model="textgen",
            messages=MESSAGES,
        )
        assert chat.choices[0].message.content == " ".join(RENDERED_WORDS)
        stream = await client.chat.completions.create(
            model="textgen",
            messages=MESSAGES,
            stream=True,
        )
        text = ""
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        assert text == " ".join(RENDERED_WORDS)
        completion = await client.completions.create(model="textgen", prompt="x y", max_tokens=1)
        assert completion.choices[0].text == "x"
        vectors = await client.embeddings.create(model="embedder", input=["a", "b c"])
        assert len(vectors.data) == 2
        assert math.isclose(float(np.linalg.norm(vectors.data[1].embedding)), 1.0, abs_tol=1e-5)


CHAT_SCRIPT = REPO_ROOT / "examples" / "clients" / "chat.py"


@pytest.mark.parametrize("mode", [[], ["--no-stream"]])
def test_the_chat_client_script(server: ServerProcess, mode: list[str]) -> None:
    command = [sys.executable, str(CHAT_SCRIPT), "--url", server.http_url, "--model", "textgen"]
    command += ["--max-tokens", "32"]
    result = subprocess.run(
        [*command, *mode, "Say hello"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    prompt = textgen.render_chat(
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Say hello"},
        ]
    )
    assert result.stdout.strip() == " ".join(prompt.split())
    words = len(prompt.split())
    assert f"[{words} prompt + {words} generated tokens]" in result.stderr
    gone = subprocess.run(
        [sys.executable, str(CHAT_SCRIPT), "--url", server.http_url, "--model", "nope", "hi"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gone.returncode == 1
    assert "Error code: 404 - The model 'nope' does not exist" in gone.stderr


# --- the MiniLM ensemble -------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from minilm import batched_repository, require

    require()
    with running_server([batched_repository(tmp_path_factory)], timeout=120.0) as proc:
        yield proc


def test_minilm_embeddings_through_the_openai_client(minilm_server: ServerProcess) -> None:
    import tritonclient.http as triton

    sentences = ["The weather is lovely today.", "It's so sunny outside!", "He drove away."]
    with openai.OpenAI(base_url=minilm_server.base_url + "/v1", api_key="unused") as client:
        assert "minilm" in [m.id for m in client.models.list().data]
        answer = client.embeddings.create(model="minilm", input=sentences)
    vectors = np.array([d.embedding for d in answer.data], dtype=np.float32)
    assert vectors.shape == (3, 384)
    # The same vectors as the v2 API gives for each sentence.
    v2 = triton.InferenceServerClient(minilm_server.http_url)
    for sentence, vector in zip(sentences, vectors, strict=True):
        text = triton.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[sentence.encode()]], dtype=np.object_))
        expected = v2.infer("minilm", [text]).as_numpy("EMBEDDING")
        assert expected is not None
        # Batched with other requests or alone, padded to other lengths: the same up to float
        # rounding.
        np.testing.assert_allclose(vector, expected.reshape(-1), atol=1e-5)


def test_minilm_usage_counts_the_tokenizers_tokens(minilm_server: ServerProcess) -> None:
    from minilm import package_files, token_count

    files = package_files()
    sentences = ["The weather is lovely today.", "It's so sunny outside!"]
    with openai.OpenAI(base_url=minilm_server.base_url + "/v1", api_key="unused") as client:
        answer = client.embeddings.create(model="minilm", input=sentences)
    counts = [token_count(files.tokenizer_json, s) for s in sentences]
    assert counts == [8, 9]  # [CLS] ... [SEP]: the model's own count, not 0
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(counts)


def test_minilm_embeds_each_input_whole(minilm_server: ServerProcess) -> None:
    # The probe's texts: the same for their first 151 tokens, then different. Each is
    # embedded whole (within the context), so their vectors differ, and usage counts all.
    from minilm import PAST_128

    with openai.OpenAI(base_url=minilm_server.base_url + "/v1", api_key="unused") as client:
        answer = client.embeddings.create(model="minilm", input=list(PAST_128))
    first, second = (np.array(d.embedding, dtype=np.float32) for d in answer.data)
    assert float(first @ second) < 0.95
    assert answer.usage.prompt_tokens == 158 + 179


def test_minilm_refuses_an_input_past_its_context(minilm_server: ServerProcess) -> None:
    # OpenAI's and vLLM's answer to an input longer than the model takes: a 400 naming the
    # context and the count, on the input it is about, rather than a vector of its start.
    from minilm import CONTEXT, TOO_LONG

    message = (
        f"This model's maximum context length is {CONTEXT} tokens. However, your prompt "
        f"contains {CONTEXT + 1} input tokens, which exceeds this limit even without any "
        "output tokens. Please reduce the length of the input prompt."
    )
    with openai.OpenAI(base_url=minilm_server.base_url + "/v1", api_key="unused") as client:
        for given, param in ((TOO_LONG, "input"), (["Hello.", TOO_LONG], "input[1]")):
            with pytest.raises(openai.BadRequestError) as caught:
                client.embeddings.create(model="minilm", input=given)
            assert caught.value.status_code == 400
            assert caught.value.body == {
                "message": message,
                "type": "invalid_request_error",
                "param": param,
                "code": "context_length_exceeded",
            }
        # A megabyte of text: refused the same way, its whole count named.
        huge = httpx.post(
            minilm_server.base_url + "/v1/embeddings",
            json={"model": "minilm", "input": "x " * 500_000},
            timeout=60,
        )
        assert huge.status_code == 400, huge.text
        error = huge.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "input"
        assert "However, your prompt contains 500002 input tokens" in error["message"]
        # The server goes on: the longest input it takes is served.
        served = client.embeddings.create(model="minilm", input="word " * (CONTEXT - 2))
        assert served.usage.prompt_tokens == CONTEXT


def test_minilm_reranks_the_relevant_document_first(minilm_server: ServerProcess) -> None:
    # vLLM's /rerank with an embedding model: the cosine of the two texts' vectors, the
    # vectors /v1/embeddings gives; the paraphrase above the unrelated sentences.
    from minilm import PAIRS

    query = "How do I change my password?"
    documents = [
        "The stock market fell sharply today.",
        "I forgot my password and need to reset it.",
        "A kitten is napping on the couch.",
        "What is the capital of France?",
    ]
    base = minilm_server.base_url
    body = {"model": "minilm", "query": query, "documents": documents}
    answer = httpx.post(base + "/rerank", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert results[0]["index"] == 1 and results[0]["document"]["text"] == documents[1]
    assert results[0]["relevance_score"] > results[1]["relevance_score"] + 0.2
    embedded = httpx.post(
        base + "/v1/embeddings",
        json={"model": "minilm", "input": [query, *documents]},
        timeout=60,
    ).json()
    vectors = [np.array(d["embedding"], dtype=np.float64) for d in embedded["data"]]
    expected = [
        float(vectors[0] @ v / (np.linalg.norm(vectors[0]) * np.linalg.norm(v)))
        for v in vectors[1:]
    ]
    by_index = {r["index"]: r["relevance_score"] for r in results}
    assert [by_index[i] for i in range(len(documents))] == pytest.approx(expected, abs=1e-5)
    # The tokenizer's tokens of every text, as /v1/embeddings counts them.
    tokens = embedded["usage"]["prompt_tokens"]
    assert answer.json()["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    # /score pairs them N:N: each anchor is closer to its paraphrase than to the rest.
    anchors = [p[0] for p in PAIRS]
    seconds = [p[1] for p in PAIRS] + [p[2] for p in PAIRS]
    pairs = {"model": "minilm", "queries": anchors * 2, "documents": seconds}
    scored = httpx.post(base + "/score", json=pairs, timeout=60).json()["data"]
    close, far = scored[: len(PAIRS)], scored[len(PAIRS) :]
    for near, unrelated in zip(close, far, strict=True):
        assert near["score"] > unrelated["score"] + 0.2
    # A document past the context is refused as /v1/embeddings refuses it, named.
    from minilm import TOO_LONG

    body["documents"] = [documents[0], TOO_LONG]
    refused = httpx.post(base + "/v1/rerank", json=body, timeout=60)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "documents[1]"


def test_chat_streams_through_an_http_worker_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # With --http-workers, a worker passes /v1 requests on to the server process, which
    # streams the answer back through it, chunk by chunk. With VLLM_API_KEY (--api-key's),
    # the server process checks the key of what a worker passes on; v2 needs none.
    repo = textgen.write(tmp_path_factory.mktemp("openai-workers"))
    env = {"VLLM_API_KEY": "s3cret"}
    with (
        running_server([repo], ["--http-workers", "1"], env=env) as server,
        openai.OpenAI(base_url=server.base_url + "/v1", api_key="s3cret") as client,
    ):
        refused = httpx.get(server.base_url + "/v1/models", timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["type"] == (
            "authentication_error"
        )
        with pytest.raises(openai.AuthenticationError):
            client.with_options(api_key="wrong").models.list()
        assert httpx.get(server.base_url + "/v2/health/ready", timeout=30).status_code == 200
        chunks = list(
            client.chat.completions.create(
                model="textgen",
                messages=MESSAGES,
                stream=True,
            )
        )
        deltas = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
        assert deltas == [RENDERED_WORDS[0], *(" " + w for w in RENDERED_WORDS[1:])]
        vectors = client.embeddings.create(model="embedder", input=["a b"])
        assert vectors.usage.prompt_tokens == 2


def test_kserves_openai_prefix_is_served_through_an_http_worker_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # KServe serves OpenAI's API under /openai/v1; a client moved from it keeps its URL.
    repo = textgen.write(tmp_path_factory.mktemp("openai-kserve"))
    with (
        running_server([repo], ["--http-workers", "1"]) as server,
        openai.OpenAI(base_url=server.base_url + "/openai/v1", api_key="unused") as client,
    ):
        served = httpx.get(server.base_url + "/v1/models", timeout=30).json()["data"]
        assert [m.id for m in client.models.list()] == [m["id"] for m in served]
        assert "textgen" in [m["id"] for m in served]
        answer = client.completions.create(model="textgen", prompt="a b c", max_tokens=2)
        assert answer.choices[0].text == "a b"
        chunks = client.chat.completions.create(model="textgen", messages=MESSAGES, stream=True)
        deltas = [c.choices[0].delta.content for c in chunks if c.choices[0].delta.content]
        assert deltas == [RENDERED_WORDS[0], *(" " + w for w in RENDERED_WORDS[1:])]
        assert client.embeddings.create(model="embedder", input=["a b"]).usage.prompt_tokens == 2
        with pytest.raises(openai.NotFoundError) as info:
            client.models.retrieve("nope")
        assert info.value.code == "model_not_found"
