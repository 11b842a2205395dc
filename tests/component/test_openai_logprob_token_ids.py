"""vLLM's `logprob_token_ids` on /v1 over the llm backend's tiny model (tests/llmrepo.py),
in the shape of vLLM's own test (tests/entrypoints/openai/chat_completion/
test_logprob_token_ids.py): `allowed_token_ids` forces the sampled token, and each
position's top logprobs are exactly that token and the given ids, whatever `top_logprobs`
says; chat and completions, whole and streamed; the values a log-softmax of the numpy
reference's raw logits; and vLLM's refusals, in its words."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import orjson
import pytest
import pytest_asyncio
import textgen
from openai_inprocess import error, openai_client

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PROMPT = "Count me"
CHAT = [{"role": "user", "content": "hi"}]
TOKENS = 3
GREEDY = {"temperature": 0, "ignore_eos": True, "max_tokens": TOKENS}
SHAPES = [
    pytest.param([200], 5, 42, id="original-issue-shape"),
    pytest.param([100, 150, 200], 3, 42, id="sampled-outside-set"),
    pytest.param([100, 150, 200, 150], 3, 200, id="sampled-inside-set"),
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = textgen.write(tmp_path_factory.mktemp("openai-logprob-token-ids"))
    # Triton's vLLM backend's interface (auto-completed): the flags and `logprobs`.
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["tiny", "textgen"]) as client:
        yield client


def body(path: str, ids: list[int], sampled: int, **fields: Any) -> dict[str, Any]:
    prompt = {"messages": CHAT} if path == CHAT_PATH else {"prompt": PROMPT}
    return {
        "model": "tiny",
        **prompt,
        **GREEDY,
        "logprob_token_ids": ids,
        "allowed_token_ids": [sampled],
        "return_tokens_as_token_ids": True,
        **fields,
    }


async def positions(http: httpx.AsyncClient, path: str, stream: bool, **fields: Any) -> list[Any]:
    """Each generated position's (token, logprob, [(top token, top logprob)...])."""
    response = await http.post(path, json={**fields, "stream": stream})
    assert response.status_code == 200, response.text
    if stream:
        lines = [line[6:] for line in response.text.split("\n\n") if line.startswith("data: {")]
        found = [orjson.loads(line)["choices"][0]["logprobs"] for line in lines]
    else:
        found = [response.json()["choices"][0]["logprobs"]]
    found = [part for part in found if part]
    if path == CHAT_PATH:
        return [
            (c["token"], c["logprob"], [(t["token"], t["logprob"]) for t in c["top_logprobs"]])
            for part in found
            for c in part["content"]
        ]
    return [
        (token, logprob, list(tops.items()))
        for part in found
        for token, logprob, tops in zip(
            part["tokens"], part["token_logprobs"], part["top_logprobs"], strict=True
        )
    ]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [CHAT_PATH, COMPLETIONS])
@pytest.mark.parametrize(("ids", "top", "sampled"), SHAPES)
async def test_logprob_token_ids_return_the_sampled_token_and_those_ids(
    http: httpx.AsyncClient, path: str, stream: bool, ids: list[int], top: int, sampled: int
) -> None:
    # Chat's `top_logprobs` and completions' `logprobs` ask for more: the ids win.
    count = {"logprobs": True, "top_logprobs": top} if path == CHAT_PATH else {"logprobs": top}
    found = await positions(http, path, stream, **body(path, ids, sampled, **count))
    assert len(found) == TOKENS
    prompt = llmrepo.rendered(CHAT) if path == CHAT_PATH else PROMPT
    expected = llmrepo.reference_logprobs(prompt, [sampled] * TOKENS)
    # vLLM's order: the sampled token, then the ids as given, each once.
    order = list(dict.fromkeys([sampled, *ids]))
    for at, (token, logprob, tops) in enumerate(found):
        assert token == f"token_id:{sampled}"
        assert [t for t, _ in tops] == [f"token_id:{i}" for i in order]
        assert tops[0][1] == logprob
        for (_, value), token_id in zip(tops, order, strict=True):
            assert value == pytest.approx(expected[at][token_id], abs=1e-3)


async def test_they_are_the_values_of_the_same_tokens_logprobs(http: httpx.AsyncClient) -> None:
    """A token's value is what `logprobs` gives the same token in the same position."""
    chosen = await positions(
        http, CHAT_PATH, False, **body(CHAT_PATH, [100, 150], 42, logprobs=True)
    )
    natural = await positions(
        http, CHAT_PATH, False, **body(CHAT_PATH, [], 42, logprobs=True, top_logprobs=20)
    )
    for (_, _, mine), (_, _, theirs) in zip(chosen, natural, strict=True):
        assert len(theirs) == 20 and len(mine) == 3
        common = dict(theirs).keys() & dict(mine).keys()
        assert "token_id:42" in common
        for key in common:
            assert dict(mine)[key] == pytest.approx(dict(theirs)[key], abs=1e-6)


async def test_a_batch_of_chats_takes_them_too(http: httpx.AsyncClient) -> None:
    fields = body(CHAT_PATH, [100], 42, logprobs=True)
    fields["messages"] = [CHAT, CHAT]
    response = await http.post("/v1/chat/completions/batch", json=fields)
    assert response.status_code == 200, response.text
    for choice in response.json()["choices"]:
        for item in choice["logprobs"]["content"]:
            assert [t["token"] for t in item["top_logprobs"]] == ["token_id:42", "token_id:100"]


@pytest.mark.parametrize(
    ("path", "fields", "words"),
    [
        (CHAT_PATH, {}, "when using `logprob_token_ids`, `logprobs` must be set to true."),
        (
            CHAT_PATH,
            {"logprobs": False},
            "when using `logprob_token_ids`, `logprobs` must be set to true.",
        ),
        (COMPLETIONS, {}, "when using `logprob_token_ids`, `logprobs` must be set."),
        (
            CHAT_PATH,
            {"logprobs": True, "use_beam_search": True},
            "`logprob_token_ids` is not supported with beam search.",
        ),
        (
            COMPLETIONS,
            {"logprobs": 1, "use_beam_search": True},
            "`logprob_token_ids` is not supported with beam search.",
        ),
        (
            COMPLETIONS,
            {"logprobs": 1, "echo": True, "max_tokens": 0},
            "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` "
            "because no output tokens are generated.",
        ),
        (
            CHAT_PATH,
            {"logprobs": True, "logprob_token_ids": list(range(129))},
            "Requested logprob_token_ids of length 129, which is greater than max allowed: 128",
        ),
        (
            COMPLETIONS,
            {"logprobs": 0, "logprob_token_ids": [5, 320, -1]},
            "token_id(s) [320, -1] in logprob_token_ids contain out-of-vocab token ids. "
            "Vocabulary size: 320",
        ),
    ],
)
async def test_what_vllm_refuses_is_a_400_on_the_field(
    http: httpx.AsyncClient, path: str, fields: dict[str, Any], words: str
) -> None:
    request = body(path, [100], 42, **fields)
    del request["allowed_token_ids"], request["return_tokens_as_token_ids"]
    found = error(await http.post(path, json=request))
    assert (found["message"], found["param"]) == (words, "logprob_token_ids")


async def test_a_model_without_log_probabilities_refuses_them(http: httpx.AsyncClient) -> None:
    request = {"model": "textgen", "prompt": PROMPT, "logprobs": 0, "logprob_token_ids": [1]}
    found = error(await http.post(COMPLETIONS, json=request))
    assert found["param"] == "logprob_token_ids"
    assert found["message"] == (
        "The model 'textgen' gives no log probabilities: it has no 'logprobs' output"
    )
