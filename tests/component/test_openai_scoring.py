"""vLLM's scoring routes, /score and /rerank (and their aliases), for an embedding model:
each pair's score is the cosine of its two texts' vectors, as vLLM's bi-encoder scores.

`table` is a stand-in embedding model whose vectors are given by a table and are not
normalised, so every expected score is exact: `near` is at 0.6 from `query`, `far` at 0,
`opposite` at -1 and `same` at 1. Its token count is a text's words. Its `counter` text
gets a new vector at each call ([1, calls, 0]), which shows how often a text was embedded.
tests/textgen.py's `textgen` (generative) and `embedder` are served beside it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import error, openai_client
from pymodels import write_model

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

QUERY, NEAR, FAR, OPPOSITE, SAME = "query text", "near one", "far away doc", "the opposite", "same"
# Each text's tokens: its words.
TOKENS = {QUERY: 2, NEAR: 2, FAR: 3, OPPOSITE: 2, SAME: 1}

TABLE = """
import numpy as np
import triton_python_backend_utils as pb_utils

VECTORS = {
    "query text": [1.0, 0.0, 0.0],
    "near one": [3.0, 4.0, 0.0],
    "far away doc": [0.0, 0.0, 2.0],
    "the opposite": [-5.0, 0.0, 0.0],
    "same": [2.0, 0.0, 0.0],
}


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            vectors, counts = [], []
            for raw in texts.reshape(-1):
                text = raw.decode("utf-8")
                if text == "counter":
                    self.calls += 1
                    vectors.append([1.0, float(self.calls), 0.0])
                else:
                    vectors.append(VECTORS.get(text, [1.0, 1.0, 1.0]))
                counts.append([len(text.split())])
            lead = texts.shape[:-1]
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("VECTOR", np.array(vectors, np.float32).reshape(*lead, 3)),
                        pb_utils.Tensor(
                            "num_input_tokens", np.array(counts, np.int32).reshape(*lead, 1)
                        ),
                    ]
                )
            )
        return responses
"""

TABLE_CONFIG = """
name: "table"
backend: "python"
max_batch_size: 8
dynamic_batching {}
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "VECTOR" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "num_input_tokens" data_type: TYPE_INT32 dims: [ 1 ] }
]
"""

SCORE_PATHS = ("/score", "/v1/score", "/openai/v1/score")
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank", "/openai/v1/rerank")
# vLLM's forms of a score request: its first texts' field and its second's.
FORMS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[httpx.AsyncClient]:
    repo: Path = textgen.write(tmp_path_factory.mktemp("openai-scoring"))
    write_model(repo, "table", TABLE, TABLE_CONFIG)
    async with openai_client(repo, ["table", "textgen", "embedder"]) as client:
        yield client


async def post(http: httpx.AsyncClient, path: str, **body: Any) -> Any:
    response = await http.post(path, json={"model": "table", **body})
    assert response.status_code == 200, response.text
    return response.json()


def scores(answer: dict[str, Any]) -> list[float]:
    assert [item["index"] for item in answer["data"]] == list(range(len(answer["data"])))
    assert {item["object"] for item in answer["data"]} <= {"score"}
    return [item["score"] for item in answer["data"]]


@pytest.mark.parametrize("path", SCORE_PATHS)
@pytest.mark.parametrize(("first", "second"), FORMS)
async def test_one_text_is_scored_against_each_of_the_others(
    http: httpx.AsyncClient, path: str, first: str, second: str
) -> None:
    documents = [NEAR, FAR, OPPOSITE, SAME]
    answer = await post(http, path, **{first: QUERY, second: documents})
    assert scores(answer) == pytest.approx([0.6, 0.0, -1.0, 1.0], abs=1e-6)
    assert answer["object"] == "list" and answer["model"] == "table"
    assert answer["id"].startswith("score-") and isinstance(answer["created"], int)
    tokens = TOKENS[QUERY] + sum(TOKENS[d] for d in documents)
    assert answer["usage"] == {
        "prompt_tokens": tokens,
        "total_tokens": tokens,
        "completion_tokens": 0,
        "completion_tokens_details": None,
    }
    # A list of one first text is the same 1:N, and one second text a 1:1.
    listed = await post(http, path, **{first: [QUERY], second: documents})
    assert scores(listed) == scores(answer)
    single = await post(http, path, **{first: QUERY, second: NEAR})
    assert scores(single) == pytest.approx([0.6], abs=1e-6)


async def test_lists_of_the_same_length_are_scored_pair_by_pair(http: httpx.AsyncClient) -> None:
    answer = await post(
        http, "/score", queries=[QUERY, SAME, NEAR], documents=[NEAR, OPPOSITE, NEAR]
    )
    assert scores(answer) == pytest.approx([0.6, -1.0, 1.0], abs=1e-6)
    # vLLM's count: every text where it is given, a repeated one each time.
    tokens = TOKENS[QUERY] + TOKENS[SAME] + 3 * TOKENS[NEAR] + TOKENS[OPPOSITE]
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] == tokens


async def test_each_distinct_text_is_embedded_once(http: httpx.AsyncClient) -> None:
    # `counter` changes its vector at each call: embedded twice, it would not score 1.
    answer = await post(http, "/score", queries=["counter", QUERY], documents=["counter", NEAR])
    assert scores(answer) == pytest.approx([1.0, 0.6], abs=1e-6)
    again = await post(http, "/rerank", query="counter", documents=["counter", "counter"])
    assert [r["relevance_score"] for r in again["results"]] == pytest.approx([1.0, 1.0])


@pytest.mark.parametrize(
    ("first", "second", "message", "param"),
    [
        (
            [QUERY, NEAR],
            [FAR, NEAR, SAME],
            "Input lengths must be either 1:1, 1:N or N:N",
            "documents",
        ),
        ([QUERY, NEAR], SAME, "Input lengths must be either 1:1, 1:N or N:N", "documents"),
        ([], [NEAR], "At least one text element must be given", None),
        (QUERY, [], "At least one text_pair element must be given", "documents"),
    ],
)
async def test_lists_that_do_not_pair_are_refused_in_vllms_words(
    http: httpx.AsyncClient, first: Any, second: Any, message: str, param: str | None
) -> None:
    body = {"model": "table", "queries": first, "documents": second}
    found = error(await http.post("/score", json=body))
    assert found["message"] == message and found["param"] == param


@pytest.mark.parametrize("path", RERANK_PATHS)
async def test_rerank_answers_the_documents_by_relevance(
    http: httpx.AsyncClient, path: str
) -> None:
    documents = [FAR, OPPOSITE, NEAR, SAME]
    answer = await post(http, path, query=QUERY, documents=documents)
    assert set(answer) == {"id", "model", "usage", "results"}
    assert answer["id"].startswith("score-") and answer["model"] == "table"
    results = answer["results"]
    assert [r["index"] for r in results] == [3, 2, 0, 1]
    assert [r["relevance_score"] for r in results] == pytest.approx([1.0, 0.6, 0.0, -1.0], abs=1e-6)
    # vLLM's document object, its text always given (0.34 has no `return_documents`).
    assert [r["document"] for r in results] == [
        {"text": documents[r["index"]], "multi_modal": None} for r in results
    ]
    tokens = TOKENS[QUERY] + sum(TOKENS[d] for d in documents)
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


async def test_rerank_top_n_keeps_the_most_relevant(http: httpx.AsyncClient) -> None:
    documents = [FAR, OPPOSITE, NEAR, SAME]
    for top_n, indexes in ((2, [3, 2]), (1, [3]), (0, [3, 2, 0, 1]), (9, [3, 2, 0, 1])):
        answer = await post(http, "/rerank", query=QUERY, documents=documents, top_n=top_n)
        assert [r["index"] for r in answer["results"]] == indexes, top_n
    # Equal scores keep the documents' order; one document may be a string.
    ties = await post(http, "/rerank", query=QUERY, documents=[FAR, "x", FAR, NEAR], top_n=3)
    # (`x`'s vector is [1, 1, 1]: at 1/sqrt(3) from the query.)
    assert [r["index"] for r in ties["results"]] == [3, 1, 0]
    single = await post(http, "/rerank", query=QUERY, documents=NEAR)
    assert [r["document"]["text"] for r in single["results"]] == [NEAR]
    # vLLM ignores a field it does not have: the documents come all the same.
    kept = await post(http, "/rerank", query=QUERY, documents=[NEAR], return_documents=False)
    assert kept["results"][0]["document"] == {"text": NEAR, "multi_modal": None}


async def test_the_answer_is_named_by_the_request_id(http: httpx.AsyncClient) -> None:
    answer = await post(http, "/score", queries=QUERY, documents=NEAR, request_id="mine")
    assert answer["id"] == "score-mine"
    response = await http.post(
        "/rerank",
        json={"model": "table", "query": QUERY, "documents": [NEAR], "request_id": "mine"},
        headers={"X-Request-Id": "trace-7"},
    )
    assert response.json()["id"] == "score-trace-7"


async def test_use_activation_does_not_change_a_cosine(http: httpx.AsyncClient) -> None:
    for value in (True, False):
        answer = await post(http, "/score", queries=QUERY, documents=NEAR, use_activation=value)
        assert scores(answer) == pytest.approx([0.6], abs=1e-6)


@pytest.mark.parametrize("path", ["/score", "/rerank"])
async def test_a_priority_is_accepted_and_changes_nothing(
    http: httpx.AsyncClient, path: str
) -> None:
    # vLLM's scoring requests take it; no engine queue orders them here (as vLLM's fcfs).
    body = {"query": QUERY, "queries": QUERY, "documents": [NEAR]}
    plain = await post(http, path, **body)
    for value in (5, -(2**63)):
        answer = await post(http, path, **body, priority=value)
        assert answer["usage"] == plain["usage"]
        assert answer.get("data") == plain.get("data")
        assert answer.get("results") == plain.get("results")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("truncate_prompt_tokens", 4),
        ("truncate_prompt_tokens", -1),
        ("truncation_side", "left"),
        ("padding", "max_length"),
        ("instruction", "Judge relevance"),
        ("max_tokens_per_query", 3),
        ("max_tokens_per_doc", 3),
        ("chat_template_kwargs", {"instruction": "Judge relevance"}),
    ],
)
@pytest.mark.parametrize("path", ["/score", "/rerank"])
async def test_fields_the_model_cannot_serve_are_refused_by_name(
    http: httpx.AsyncClient, path: str, field: str, value: Any
) -> None:
    body = {"model": "table", "query": QUERY, "queries": QUERY, "documents": [NEAR], field: value}
    found = error(await http.post(path, json=body))
    assert found["code"] == "unsupported_parameter" and found["param"] == field
    assert field in found["message"]
    # Their defaults change nothing.
    defaults = {"max_tokens_per_query": 0, "chat_template_kwargs": {}}
    if field in defaults:
        body[field] = defaults[field]
        assert (await http.post(path, json=body)).status_code == 200


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        (
            {"queries": QUERY, "documents": [NEAR, {"content": [{"type": "text", "text": "x"}]}]},
            "documents[1]",
            "MultiModalParam is not supported",
        ),
        ({"query": {"content": []}, "documents": [NEAR]}, "query", "MultiModalParam"),
        ({"queries": QUERY, "documents": [NEAR], "normalize": True}, "normalize", "was removed"),
        ({"query": QUERY, "documents": [NEAR], "top_n": -1}, "top_n", "Invalid value"),
        ({"queries": QUERY}, "documents", "Missing required parameter: 'documents'"),
        ({"text_1": QUERY, "documents": [NEAR]}, "queries", "Missing required parameter"),
        ({"queries": QUERY, "documents": [7]}, "documents", "Invalid value"),
    ],
)
async def test_bad_bodies_are_refused(
    http: httpx.AsyncClient, body: dict[str, Any], param: str, message: str
) -> None:
    path = "/rerank" if "query" in body else "/score"
    found = error(await http.post(path, json={"model": "table", **body}))
    assert found["param"] == param and message in found["message"], found


async def test_a_generative_model_does_not_support_scoring(http: httpx.AsyncClient) -> None:
    body = {"model": "textgen", "queries": QUERY, "query": QUERY, "documents": [NEAR]}
    found = error(await http.post("/score", json=body))
    assert found["message"].startswith("The model does not support Score API")
    assert found["param"] == "model"
    found = error(await http.post("/v2/rerank", json=body))
    assert found["message"].startswith("The model does not support Rerank (Score) API")
    missing = error(await http.post("/rerank", json=body | {"model": "nope"}), 404)
    assert missing["code"] == "model_not_found"


async def test_any_embedding_model_scores(http: httpx.AsyncClient) -> None:
    # tests/textgen.py's embedder: its (normalised) vectors' cosine.
    import numpy as np

    texts = ["Ab 1, c!", "hello world"]
    answer = await post(http, "/score", model="embedder", queries=texts[0], documents=texts[1])
    a, b = (np.array(textgen.embedder_vector(t)) for t in texts)
    assert scores(answer) == pytest.approx([float(a @ b)], abs=1e-6)
    # Without `model`: the one embedding model, where there is one; two here.
    found = error(await http.post("/score", json={"queries": QUERY, "documents": [NEAR]}))
    assert found["param"] == "model" and "Missing required parameter" in found["message"]


async def test_a_request_holds_at_most_2048_texts(http: httpx.AsyncClient) -> None:
    body = {"model": "table", "query": QUERY, "documents": [NEAR] * 2048}
    found = error(await http.post("/rerank", json=body))
    assert found["message"] == "The request holds 2049 texts; at most 2048"
    body["documents"] = [NEAR] * 2047
    assert len((await http.post("/rerank", json=body)).json()["results"]) == 2047


@pytest.mark.parametrize("path", ["/score", "/rerank", "/v2/rerank"])
async def test_errors_outside_v1_are_openais_error_object_too(
    http: httpx.AsyncClient, path: str
) -> None:
    found = error(await http.get(path), 405)
    assert found["type"] == "invalid_request_error"
    broken = error(await http.post(path, content=b"{"))
    assert broken["code"] == "invalid_json"
