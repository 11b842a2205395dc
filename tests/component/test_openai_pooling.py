"""vLLM's pooling routes beside /v1/embeddings, for embedding models: `POST /pooling`
(its generic pooling API: an embedding model's `embed` task, the pooled vector), the chat
forms of /v1/embeddings and /pooling (`messages`, or messages in `input`), and vLLM's
octet-stream answers (`encoding_format` `bytes` and `bytes_only`).

tests/textgen.py's `embedder` (a 4-dimensional vector, no chat template) and `textgen`
(generative) are served, with `chatty`, a copy of `embedder` with a chat template."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import error, openai_client
from pymodels import write_model

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

TEXT = "Ab 1, c!"
TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }};{% endfor %}"
CHAT = [{"role": "user", "content": "Hi 2 you"}, {"role": "assistant", "content": "ok."}]
RENDERED = "[user] Hi 2 you;[assistant] ok.;"
NO_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must "
    "provide a chat template if the tokenizer does not define one."
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    repo: Path = textgen.write(tmp_path_factory.mktemp("openai-pooling"))
    parameter = textgen._parameter("chat_template_source", TEMPLATE)
    config = textgen._EMBEDDER_CONFIG.replace('name: "embedder"', 'name: "chatty"')
    write_model(repo, "chatty", textgen.EMBEDDER, config + parameter + "\n")
    async with openai_client(repo, ["embedder", "chatty", "textgen"]) as client:
        yield client


def vector(text: str) -> Any:
    return pytest.approx(textgen.embedder_vector(text), abs=1e-6)


async def test_pooling_answers_the_embed_tasks_vectors(http: httpx.AsyncClient) -> None:
    """vLLM's PoolingResponse, each input's pooled vector: what /v1/embeddings gives."""
    body = {"model": "embedder", "input": [TEXT, "x y z"], "request_id": "r1"}
    response = await http.post("/pooling", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert set(answer) == {"id", "object", "created", "model", "data", "usage"}
    assert (answer["id"], answer["object"], answer["model"]) == ("pooling-r1", "list", "embedder")
    assert [item["index"] for item in answer["data"]] == [0, 1]
    assert {item["object"] for item in answer["data"]} == {"pooling"}
    assert answer["data"][0]["data"] == vector(TEXT)
    assert answer["data"][1]["data"] == vector("x y z")
    # The model's token counts (its words), in vLLM's UsageInfo.
    assert answer["usage"] == {
        "prompt_tokens": 6,
        "total_tokens": 6,
        "completion_tokens": 0,
        "completion_tokens_details": None,
    }
    # vLLM's base64, and its `task: embed` (the default) said outright.
    body = {"model": "embedder", "input": TEXT, "encoding_format": "base64", "task": "embed"}
    response = await http.post("/pooling", json=body)
    assert response.status_code == 200, response.text
    raw = base64.b64decode(response.json()["data"][0]["data"])
    assert np.frombuffer(raw, np.float32).tolist() == vector(TEXT)


UNSUPPORTED = "Unsupported task: '{}' Supported tasks: ('embed',)"
NORMALIZE = "Parameter `normalize` was removed; use `use_activation` instead."
REMOVED = "`{}` task was removed; use {} instead."
NO_PLUGIN = (
    "No IOProcessor plugin installed. Please refer to the documentation and to the "
    "'prithvi_geospatial_mae_io_processor' offline inference example for more details."
)


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"task": "token_embed"}, "task", UNSUPPORTED.format("token_embed")),
        ({"task": "classify"}, "task", UNSUPPORTED.format("classify")),
        ({"task": "score"}, "task", REMOVED.format("score", "`classify`")),
        ({"task": "encode"}, "task", REMOVED.format("encode", "`token_embed` or `token_classify`")),
        ({"task": "plugin"}, "task", NO_PLUGIN),
        ({"dimensions": 4}, "dimensions", "dimensions is currently not supported"),
        ({"normalize": True}, "normalize", NORMALIZE),
    ],
)  # fmt: skip
async def test_what_pooling_cannot_serve_is_refused_in_vllms_words(
    http: httpx.AsyncClient, fields: dict[str, Any], param: str, message: str
) -> None:
    body = {"model": "embedder", "input": TEXT, **fields}
    found = error(await http.post("/pooling", json=body))
    assert (found["param"], found["message"]) == (param, message)


async def test_pooling_refuses_a_plugin_request_and_other_models(http: httpx.AsyncClient) -> None:
    # vLLM's IOProcessorRequest (`data`, no input) is a plugin task.
    found = error(await http.post("/pooling", json={"model": "embedder", "data": {"x": 1}}))
    assert found["message"] == NO_PLUGIN
    found = error(await http.post("/pooling", json={"model": "textgen", "input": TEXT}))
    assert found["param"] == "model"
    assert found["message"].startswith("The model does not support Pooling API")
    found = error(await http.post("/pooling", json={"model": "nope", "input": TEXT}), 404)
    assert found["code"] == "model_not_found"
    # Two embedding models here: `model` cannot be left out.
    assert error(await http.post("/pooling", json={"input": TEXT}))["param"] == "model"


@pytest.mark.parametrize("path", ["/v1/embeddings", "/pooling"])
@pytest.mark.parametrize(
    "fields",
    [{"messages": CHAT}, {"input": CHAT}, {"messages": [CHAT]}],
)
async def test_a_chat_is_refused_without_a_chat_template(
    http: httpx.AsyncClient, path: str, fields: dict[str, Any]
) -> None:
    """vLLM's words for a tokenizer without a chat template (the MiniLM ensemble's)."""
    found = error(await http.post(path, json={"model": "embedder", **fields}))
    assert found["message"] == NO_TEMPLATE
    assert found["param"] == next(iter(fields))


@pytest.mark.parametrize("path", ["/v1/embeddings", "/pooling"])
async def test_a_chat_is_embedded_as_its_template_renders_it(
    http: httpx.AsyncClient, path: str
) -> None:
    key = "embedding" if path == "/v1/embeddings" else "data"
    for fields in ({"messages": CHAT}, {"input": CHAT}):
        response = await http.post(path, json={"model": "chatty", **fields})
        assert response.status_code == 200, response.text
        assert [item[key] for item in response.json()["data"]] == [vector(RENDERED)]
    # With text `input` too, vLLM's union of forms picks its text form.
    response = await http.post(path, json={"model": "chatty", "messages": CHAT, "input": TEXT})
    assert response.status_code == 200, response.text
    assert [item[key] for item in response.json()["data"]] == [vector(TEXT)]
    # vLLM's batched form: one vector per conversation.
    second = [{"role": "user", "content": "9"}]
    body = {"model": "chatty", "messages": [CHAT, second]}
    response = await http.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    found = [item["embedding"] for item in response.json()["data"]]
    assert found == [vector(RENDERED), vector("[user] 9;")]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": CHAT, "chat_template": TEMPLATE}, "chat_template"),
        (
            {"messages": CHAT, "add_generation_prompt": True, "continue_final_message": True},
            "continue_final_message",
        ),
        ({"messages": CHAT, "chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools"),
        ({}, "input"),
    ],
)  # fmt: skip
async def test_a_bad_chat_form_is_400_naming_the_field(
    http: httpx.AsyncClient, fields: dict[str, Any], param: str
) -> None:
    found = error(await http.post("/v1/embeddings", json={"model": "chatty", **fields}))
    assert found["param"] == param


@pytest.mark.parametrize("path", ["/v1/embeddings", "/pooling"])
async def test_bytes_answers_the_vectors_with_vllms_metadata(
    http: httpx.AsyncClient, path: str
) -> None:
    """vLLM's octet-stream answer: the vectors' bytes in `embed_dtype` and `endianness`,
    one after the other; `bytes` says where each is in its `metadata` header."""
    texts = [TEXT, "x y z"]
    encoding = {"embed_dtype": "float16", "endianness": "big"}
    body = {"model": "embedder", "input": texts, "encoding_format": "bytes", **encoding}
    response = await http.post(path, json={**body, "request_id": "r2"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    expected = [np.array(textgen.embedder_vector(t), np.float32).astype(">f2") for t in texts]
    assert response.content == b"".join(e.tobytes() for e in expected)
    metadata = json.loads(response.headers["metadata"])
    prefix = "embd" if path == "/v1/embeddings" else "pooling"
    assert (metadata["id"], metadata["model"]) == (f"{prefix}-r2", "embedder")
    assert metadata["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
    assert metadata["data"] == [
        {"index": 0, **encoding, "start": 0, "end": 8, "shape": [4]},
        {"index": 1, **encoding, "start": 8, "end": 16, "shape": [4]},
    ]
    response = await http.post(path, json={**body, "encoding_format": "bytes_only"})
    assert response.status_code == 200, response.text
    assert "metadata" not in response.headers
    assert response.content == b"".join(e.tobytes() for e in expected)
