"""Cohere's embed API, `POST /v2/embed`, as vLLM 0.34 serves it: the vectors /v1/embeddings
gives, in each of vLLM's embedding types, Cohere's answer around them, and its refusals as
OpenAI's error object (vLLM's on that route).

Served: tests/textgen.py's `embedder` (4 dimensions, no chat template, no task
instructions) and `textgen` (generative); `wide`, 8 dimensions of both signs (the binary
types pack 8 to a byte) with task instructions, whose context is 6 words; `broad`, `wide`
with 16 (the same 8 and their opposites: two bytes that differ); and `chatty`, `wide`
with a chat template."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import error, openai_client
from pymodels import write_model

from ge_serve.server.http.openai import embeddings

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

EMBED = "/v2/embed"
TEXTS = ["Ab 1, c!", "x y z"]
LONG = "one two three four five six seven"  # 7 words: past `wide`'s context
INSTRUCTIONS = {"search_query": "query: ", "search_document": "passage: "}
TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }};{% endfor %}"
WIDE = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.width = config["output"][0]["dims"][0]

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            text = text.reshape(-1)[0].decode("utf-8")
            words = len(text.split())
            if words > 6:
                message = f"This model's maximum context length is 6 tokens; the prompt has {words}"
                error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            kinds = [c.isalpha() for c in text], [c.isdigit() for c in text]
            counts = np.array([sum(k) for k in kinds] + [len(text), words], np.float32)
            half = counts / (1.0 + counts.sum()) - 0.2
            eight = np.concatenate([half, 0.1 - half])
            vector = np.concatenate([eight, -eight])[: self.width].reshape(1, -1)
            outputs = [
                pb_utils.Tensor("VECTOR", vector.astype(np.float32)),
                pb_utils.Tensor("num_input_tokens", np.array([[words]], np.int32)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""
WIDE_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [
  {{ name: "VECTOR" data_type: TYPE_FP32 dims: [ {width} ] }},
  {{ name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] }}
]
"""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    repo: Path = textgen.write(tmp_path_factory.mktemp("openai-cohere-embed"))
    instructions = textgen._parameter("task_instructions", json.dumps(INSTRUCTIONS))
    template = textgen._parameter("chat_template_source", TEMPLATE)
    wide = WIDE_CONFIG.format(name="wide", width=8) + instructions + "\n"
    write_model(repo, "wide", WIDE, wide)
    write_model(repo, "broad", WIDE, WIDE_CONFIG.format(name="broad", width=16))
    chatty = WIDE_CONFIG.format(name="chatty", width=8) + instructions + "\n" + template + "\n"
    write_model(repo, "chatty", WIDE, chatty)
    models = ["embedder", "wide", "broad", "chatty", "textgen"]
    async with openai_client(repo, models) as client:
        yield client


async def floats(http: httpx.AsyncClient, model: str, texts: list[str]) -> list[list[float]]:
    """What /v1/embeddings gives for `texts`."""
    response = await http.post("/v1/embeddings", json={"model": model, "input": texts})
    assert response.status_code == 200, response.text
    return [item["embedding"] for item in response.json()["data"]]


async def embedded(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post(EMBED, json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_the_answer_is_cohere_s_with_v1_embeddings_vectors(http: httpx.AsyncClient) -> None:
    response = await http.post(
        EMBED, json={"model": "wide", "texts": TEXTS}, headers={"X-Request-Id": "r7"}
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    # vLLM's CohereEmbedResponse, as it dumps it: float by default, the texts echoed.
    assert list(answer) == ["id", "embeddings", "texts", "meta", "response_type"]
    assert answer["id"] == "embd-r7"
    assert answer["embeddings"] == {"float": await floats(http, "wide", TEXTS)}
    assert answer["texts"] == TEXTS
    # The model's token counts (its words).
    billed = {"input_tokens": 3 + 3, "image_tokens": 0}
    assert answer["meta"] == {"api_version": {"version": "2"}, "billed_units": billed}
    assert answer["response_type"] == "embeddings_by_type"
    # Without `model`, there is no one embedding model here to default to.
    assert error(await http.post(EMBED, json={"texts": TEXTS}))["param"] == "model"


def packed(vector: list[float]) -> list[int]:
    """vLLM's binary types, written out: a bit per sign (>= 0 is 1), first bit highest."""
    bits = [1 if value >= 0 else 0 for value in vector]
    return [int("".join(map(str, bits[i : i + 8])), 2) for i in range(0, len(bits), 8)]


async def test_each_embedding_type_is_vllms_encoding_of_the_floats(http: httpx.AsyncClient) -> None:
    [first, second] = await floats(http, "wide", TEXTS)
    assert any(v < 0 for v in first) and any(v >= 0 for v in first)
    types = ["base64", "ubinary", "binary", "float"]
    answer = await embedded(http, model="wide", texts=TEXTS, embedding_types=types)
    found = answer["embeddings"]
    # All four at once, in vLLM's order, whatever the request's.
    assert list(found) == ["float", "binary", "ubinary", "base64"]
    assert found["float"] == [first, second]
    assert found["ubinary"] == [packed(first), packed(second)]
    assert found["binary"] == [[b - 128 for b in packed(first)], [b - 128 for b in packed(second)]]
    decoded = [np.frombuffer(base64.b64decode(v), "<f4").tolist() for v in found["base64"]]
    assert decoded == [first, second]
    # One alone.
    answer = await embedded(http, model="wide", texts=TEXTS[:1], embedding_types=["ubinary"])
    assert answer["embeddings"] == {"ubinary": [packed(first)]}


async def test_the_binary_types_pack_each_vector_byte_after_byte(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    [first, second] = await floats(http, "broad", TEXTS)
    assert len(first) == 16 and packed(first)[0] != packed(first)[1]  # the order shows
    types = ["float", "binary", "ubinary", "base64"]
    answer = await embedded(http, model="broad", texts=TEXTS, embedding_types=types)
    found = answer["embeddings"]
    assert found["float"] == [first, second]
    assert found["ubinary"] == [packed(first), packed(second)]
    assert found["binary"] == [[b - 128 for b in packed(v)] for v in (first, second)]
    decoded = [np.frombuffer(base64.b64decode(v), "<f4").tolist() for v in found["base64"]]
    assert decoded == [first, second]
    # Past ENCODED_ON_THE_LOOP values, encoded and serialised on a worker thread: the same.
    monkeypatch.setattr(embeddings, "ENCODED_ON_THE_LOOP", 0)
    again = await embedded(http, model="broad", texts=TEXTS, embedding_types=types)
    assert again["embeddings"] == found


async def test_input_type_is_the_models_task_instruction(http: httpx.AsyncClient) -> None:
    # No chat template: the prefix goes before the text.
    answer = await embedded(http, model="wide", texts=TEXTS, input_type="search_query")
    assert answer["embeddings"]["float"] == await floats(
        http, "wide", [f"query: {t}" for t in TEXTS]
    )
    assert answer["texts"] == TEXTS
    # With one: the system message of a conversation.
    answer = await embedded(http, model="chatty", texts=TEXTS[1:], input_type="search_document")
    rendered = f"[system] passage: ;[user] {TEXTS[1]};"
    assert answer["embeddings"]["float"] == await floats(http, "chatty", [rendered])
    found = error(
        await http.post(EMBED, json={"model": "wide", "texts": TEXTS, "input_type": "image"})
    )
    assert found["param"] == "input_type"
    assert (
        found["message"]
        == "Unsupported input_type 'image'. Supported values: search_document, search_query"
    )
    found = error(
        await http.post(
            EMBED, json={"model": "embedder", "texts": TEXTS, "input_type": "search_query"}
        )
    )
    assert found["message"] == (
        "Unsupported input_type 'search_query'. This model does not define any input_type "
        "task instructions."
    )


async def test_inputs_content_blocks_render_with_the_chat_template(http: httpx.AsyncClient) -> None:
    inputs = [
        {"content": [{"type": "text", "text": "a b"}, {"type": "text", "text": "c"}]},
        {"content": [{"type": "text", "text": "d"}]},
    ]
    answer = await embedded(http, model="chatty", inputs=inputs)
    assert "texts" not in answer
    expected = await floats(http, "chatty", ["[user] a b\nc;", "[user] d;"])
    assert answer["embeddings"]["float"] == expected
    # A model without a chat template refuses them, in vLLM's words.
    found = error(await http.post(EMBED, json={"model": "wide", "inputs": inputs}))
    assert found["param"] == "inputs"
    assert found["message"].startswith("As of transformers v4.44, default chat template")


async def test_the_lists_are_bounded_and_a_refusal_names_its_item(
    http: httpx.AsyncClient,
) -> None:
    # At most 2048 content blocks in all (as many as `texts` holds), refused before any
    # is built, checked or rendered.
    block = {"type": "text", "text": "w"}
    inputs = [{"content": [block] * 1024}, {"content": [block] * 1025}]
    found = error(await http.post(EMBED, json={"model": "chatty", "inputs": inputs}))
    assert found["param"] == "inputs"
    assert found["message"] == "'inputs' holds 2049 content blocks; at most 2048"
    found = error(await http.post(EMBED, json={"model": "wide", "texts": ["a"] * 2049}))
    assert (found["param"], found["message"]) == ("texts", "'texts' holds 2049 items; at most 2048")
    # Many blocks (built and rendered off the loop) within the bound are embedded.
    many = [{"content": [{"type": "text", "text": ""}] * 100}]
    answer = await embedded(http, model="chatty", inputs=many)
    assert answer["embeddings"]["float"] == await floats(
        http, "chatty", ["[user] " + "\n" * 99 + ";"]
    )
    # A refused text is named by its index, a lone one too, by every path.
    body: dict[str, Any] = {"model": "chatty", "texts": [LONG], "input_type": "search_query"}
    found = error(await http.post(EMBED, json=body))
    assert (found["param"], found["code"]) == ("texts[0]", "context_length_exceeded")
    body = {"model": "chatty", "inputs": [{"content": [{"type": "text", "text": LONG}]}]}
    assert error(await http.post(EMBED, json=body))["param"] == "inputs[0]"


async def test_truncate_embeds_what_fits_and_refuses_what_vllm_would_shorten(
    http: httpx.AsyncClient,
) -> None:
    expected = await floats(http, "wide", TEXTS)
    for mode in ("NONE", "START", "END"):
        answer = await embedded(http, model="wide", texts=TEXTS, truncate=mode)
        assert answer["embeddings"]["float"] == expected
    # Past the model's context: NONE is the model's refusal; END (the default) and START
    # say they cannot shorten it.
    body: dict[str, Any] = {"model": "wide", "texts": [TEXTS[0], LONG], "truncate": "NONE"}
    found = error(await http.post(EMBED, json=body))
    assert (found["param"], found["code"]) == ("texts[1]", "context_length_exceeded")
    assert found["message"] == "This model's maximum context length is 6 tokens; the prompt has 7"
    found = error(await http.post(EMBED, json={"model": "wide", "texts": [LONG]}))
    assert (found["param"], found["code"]) == ("texts[0]", "context_length_exceeded")
    assert found["message"].endswith("truncate=END cannot shorten it here: shorten the text")
    # `max_tokens`: with NONE, vLLM's refusal; with START, what vLLM would shorten.
    body = {"model": "wide", "texts": TEXTS, "truncate": "NONE", "max_tokens": 2}
    found = error(await http.post(EMBED, json=body))
    assert found["param"] == "texts[0]"
    assert found["message"] == (
        "Input of 3 tokens exceeds max_tokens=2 with truncate=NONE. Set truncate to END or "
        "START to allow truncation."
    )
    found = error(await http.post(EMBED, json={**body, "truncate": "START"}))
    assert "truncate=START cannot shorten it" in found["message"]
    answer = await embedded(http, model="wide", texts=TEXTS, max_tokens=3, truncate="START")
    assert answer["embeddings"]["float"] == expected


IMAGE = "data:image/png;base64,iVBORw0KGgo="
ONE_FIELD = "Exactly one of texts, images, or inputs must be provided, and it must be non-empty"
A = {"texts": ["a"]}
IMAGE_BLOCK = {"type": "image_url", "image_url": {"url": IMAGE}}


@pytest.mark.parametrize(
    ("model", "fields", "param", "words"),
    [
        ("wide", {}, "texts", ONE_FIELD),
        ("wide", {"texts": []}, "texts", ONE_FIELD),
        ("wide", {**A, "inputs": []}, "inputs", ONE_FIELD),
        ("wide", {"texts": ["a", ""]}, "texts[1]", "must not hold an empty string"),
        ("wide", {**A, "embedding_types": ["float", "f"]}, "embedding_types[1]", "Invalid value"),
        ("wide", {**A, "embedding_types": ["int8"]}, "embedding_types[0]", "'int8' is not"),
        ("wide", {**A, "truncate": "MIDDLE"}, "truncate", "Invalid value"),
        ("wide", {"images": [IMAGE]}, "images", "Image input is not supported"),
        ("chatty", {"inputs": [{"content": [IMAGE_BLOCK]}]}, "inputs[0].content[0]", "Image"),
        ("chatty", {"inputs": [{"content": [{"type": "text"}]}]}, "inputs[0].content[0].text",
         "CohereEmbedContent with type='text' requires text"),
        ("embedder", {**A, "embedding_types": ["binary"]}, "embedding_types",
         "Embedding dimension must be a multiple of 8 for binary embedding types, but got 4."),
        ("wide", {**A, "output_dimension": 4}, "output_dimension", "gives 8 dimensions"),
        ("textgen", A, "model", "The model does not support Embeddings API"),
    ],
)  # fmt: skip
async def test_bad_requests_are_openais_400(
    http: httpx.AsyncClient, model: str, fields: dict[str, Any], param: str, words: str
) -> None:
    found = error(await http.post(EMBED, json={"model": model, **fields}))
    assert found["param"] == param
    assert words in found["message"], found["message"]


async def test_an_unknown_model_is_a_404_and_the_model_s_own_size_is_served(
    http: httpx.AsyncClient,
) -> None:
    found = error(await http.post(EMBED, json={"model": "nope", "texts": ["a"]}), 404)
    assert found["code"] == "model_not_found"
    # The route's own refusals are OpenAI's error object too.
    assert error(await http.get(EMBED), 405)["message"] == "Method Not Allowed: GET /v2/embed"
    assert error(await http.post(EMBED, content=b"{"))["code"] == "invalid_json"
    answer = await embedded(http, model="wide", texts=["a"], output_dimension=8, priority=-3)
    assert len(answer["embeddings"]["float"][0]) == 8


async def test_cohere_sdk_reads_the_answer(http: httpx.AsyncClient) -> None:
    client = cohere.AsyncClientV2(api_key="unused", base_url=str(http.base_url), httpx_client=http)
    answer = await client.embed(
        model="wide", texts=TEXTS, input_type="search_query", embedding_types=["float", "ubinary"]
    )
    expected = await floats(http, "wide", [f"query: {t}" for t in TEXTS])
    assert answer.embeddings.float_ == expected
    assert answer.embeddings.ubinary == [packed(v) for v in expected]
    assert answer.texts == TEXTS
    assert answer.meta is not None and answer.meta.billed_units is not None
    assert answer.meta.billed_units.input_tokens == 8
    with pytest.raises(cohere.BadRequestError) as refused:
        await client.embed(model="embedder", texts=TEXTS, input_type="search_query")
    assert refused.value.body["error"]["param"] == "input_type"
