"""vLLM's extensions of `/v1/embeddings` (its EmbeddingCompletionRequest's pooling and
encoding fields): each is honoured as vLLM honours it, or refused by name, never silently
dropped. The model is tests/textgen.py's `embedder` (a 4-dimensional vector)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import ml_dtypes
import numpy as np
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import error, openai_client

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

EMBEDDINGS = "/v1/embeddings"
TEXT = "Ab 1, c!"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    repo: Path = textgen.write(tmp_path_factory.mktemp("openai-embedding-fields"))
    async with openai_client(repo, ["embedder"]) as client:
        yield client


async def embedding(http: httpx.AsyncClient, **fields: Any) -> Any:
    body = {"model": "embedder", "input": TEXT, **fields}
    response = await http.post(EMBEDDINGS, json=body)
    assert response.status_code == 200, response.text
    return response.json()["data"][0]["embedding"]


@pytest.mark.parametrize(
    ("embed_dtype", "endianness", "numpy_type"),
    [
        ("float32", "native", np.dtype("=f4")),
        ("float32", "big", np.dtype(">f4")),
        ("float16", "little", np.dtype("<f2")),
        ("float16", "big", np.dtype(">f2")),
        ("bfloat16", "native", np.dtype(ml_dtypes.bfloat16)),
        ("bfloat16", "big", np.dtype(ml_dtypes.bfloat16).newbyteorder(">")),
        ("fp8_e4m3", "big", np.dtype(ml_dtypes.float8_e4m3fn)),
        ("fp8_e5m2", "little", np.dtype(ml_dtypes.float8_e5m2)),
    ],
)
async def test_base64_is_encoded_in_embed_dtype_and_endianness(
    http: httpx.AsyncClient, embed_dtype: str, endianness: str, numpy_type: np.dtype[Any]
) -> None:
    """vLLM's encoding: the vector converted to `embed_dtype` (rounded to nearest, as
    torch converts), its bytes in `endianness`; JSON numbers (`float`) ignore both, as
    vLLM's do."""
    fields = {"embed_dtype": embed_dtype, "endianness": endianness}
    raw = base64.b64decode(await embedding(http, encoding_format="base64", **fields))
    expected = np.array(textgen.embedder_vector(TEXT), np.float32).astype(numpy_type)
    assert raw == expected.tobytes()
    plain = await embedding(http)
    assert plain == pytest.approx(textgen.embedder_vector(TEXT), abs=1e-6)
    assert await embedding(http, **fields) == plain


CHOICES = ("embed_dtype", "endianness", "encoding_format", "truncation_side", "padding")


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("embed_dtype", "float64"),
        ("endianness", "middle"),
        ("encoding_format", "hex"),
        ("truncate_prompt_tokens", -2),
        ("truncation_side", "middle"),
        ("padding", "longest"),
        ("use_activation", "no"),
        ("priority", 2**63),
    ],
)
async def test_a_bad_value_is_400_naming_the_field(
    http: httpx.AsyncClient, param: str, value: Any
) -> None:
    body = {"model": "embedder", "input": TEXT, param: value}
    found = error(await http.post(EMBEDDINGS, json=body))
    assert found["param"] == param
    assert found["code"] is None
    if param in CHOICES:  # a value outside the choices is named, as vLLM's
        assert found["message"].endswith(f'(given: "{value}")'), found


@pytest.mark.parametrize(
    ("param", "refused", "default"),
    [
        # The model embeds the text whole: an input past its context is refused.
        ("truncate_prompt_tokens", 2, None),
        ("truncate_prompt_tokens", -1, None),
        ("truncation_side", "left", None),
        ("padding", "max_length", None),
        # The model's tokenizer adds its special tokens, and its vector comes as it pools
        # it (`embedder`'s and the MiniLM ensemble's, normalised).
        ("add_special_tokens", False, True),
        ("use_activation", False, True),
    ],
)
async def test_fields_not_served_are_refused_by_name(
    http: httpx.AsyncClient, param: str, refused: Any, default: Any
) -> None:
    body = {"model": "embedder", "input": TEXT, param: refused}
    found = error(await http.post(EMBEDDINGS, json=body))
    assert (found["param"], found["code"]) == (param, "unsupported_parameter")
    assert param in found["message"]
    # vLLM's default changes nothing, and is accepted.
    assert await embedding(http, **{param: default}) == await embedding(http)


async def test_a_priority_is_accepted_and_changes_nothing(http: httpx.AsyncClient) -> None:
    # vLLM's pooling requests take it; no engine queue orders them here (as vLLM's fcfs).
    assert await embedding(http, priority=-(2**63)) == await embedding(http)
    assert await embedding(http, priority=5) == await embedding(http)


@pytest.mark.parametrize("value", [False, True, None])
async def test_normalize_is_refused_as_vllm_refuses_it(
    http: httpx.AsyncClient, value: bool | None
) -> None:
    body = {"model": "embedder", "input": TEXT, "normalize": value}
    found = error(await http.post(EMBEDDINGS, json=body))
    assert found["param"] == "normalize"
    assert found["message"] == "Parameter `normalize` was removed; use `use_activation` instead."


async def test_dimensions_are_checked_before_the_model_runs(http: httpx.AsyncClient) -> None:
    """`embedder` answers NO_VECTOR without its vector (a 500): a `dimensions` the model's
    declared size refuses never gets that far."""
    body = {"model": "embedder", "input": "NO_VECTOR", "dimensions": 3}
    found = error(await http.post(EMBEDDINGS, json=body))
    assert found["param"] == "dimensions"
    assert "gives 4 dimensions" in found["message"]
    assert len(await embedding(http, dimensions=4)) == 4


@pytest.mark.parametrize("path", [EMBEDDINGS, "/pooling"])
@pytest.mark.parametrize("given", [[[]], [[], []]])
async def test_an_empty_token_list_is_refused_not_embedded_as_text(
    http: httpx.AsyncClient, path: str, given: list[list[int]]
) -> None:
    """vLLM reads `[[]]` as a prompt of no token ids, and refuses it in these words; it is
    not the text "[]"."""
    found = error(await http.post(path, json={"model": "embedder", "input": given}))
    assert found["param"] == "input"
    assert found["message"] == "The decoder prompt cannot be empty"
