"""vLLM 0.34's `POST /v1/chat/completions/batch` (server/http/openai/chatbatch.py) over the
llm backend's tiny model (tests/llmrepo.py): each conversation answered as a chat of its
own, one choice per conversation, the usage summed; vLLM's refusals in its words."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import pytest
import pytest_asyncio
from openai_inprocess import error, openai_client

from ge_serve.server.http.openai.tools import ToolSettings

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="module")]

BATCH = "/v1/chat/completions/batch"
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "K"}],
    [{"role": "user", "content": "hello"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "zz"}],
]
GREEDY: dict[str, Any] = {"model": "tiny", "max_tokens": 4, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-chat-batch")
    # Auto-completed, as Triton's vLLM backend's: `logprobs` and `output_ids` outputs.
    llmrepo.write_tiny_llm(folder, "tiny", interface=False)
    config = llmrepo.write_tiny_llm(folder, "plain", interface=False) / "config.pbtxt"
    lines = config.read_text(encoding="utf-8").splitlines(keepends=True)
    config.write_text("".join(x for x in lines if '"chat_template"' not in x), encoding="utf-8")
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with openai_client(repo, ["tiny", "plain"]) as client:
        yield client


async def ok(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post(path, json=body)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


@pytest.mark.parametrize("prefix", ["", "/openai"])
async def test_each_conversation_is_answered_as_its_own_chat(
    http: httpx.AsyncClient, prefix: str
) -> None:
    asked = GREEDY | {"return_token_ids": True, "logprobs": True, "top_logprobs": 2}
    batch = await ok(http, prefix + BATCH, asked | {"messages": CONVERSATIONS})
    assert batch["object"] == "chat.completion" and batch["id"].startswith("chatcmpl-")
    assert [c["index"] for c in batch["choices"]] == [0, 1, 2]
    singles = [
        await ok(http, "/v1/chat/completions", asked | {"messages": c}) for c in CONVERSATIONS
    ]
    for choice, single in zip(batch["choices"], singles, strict=True):
        (alone,) = single["choices"]
        # Batched with the others, the logits differ in their last bits.
        found, expected = choice.pop("logprobs")["content"], alone.pop("logprobs")["content"]
        assert choice == alone | {"index": choice["index"]}
        assert len(choice["token_ids"]) == 4 and len(found) == 4
        assert [e["token"] for e in found] == [e["token"] for e in expected]
        for entry, other in zip(found, expected, strict=True):
            assert entry["logprob"] == pytest.approx(other["logprob"], abs=1e-4)
            assert len(entry["top_logprobs"]) == 2
    # Each conversation's prompt counted, every choice's tokens summed.
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert batch["usage"][key] == sum(s["usage"][key] for s in singles), key
    # vLLM's batch answer has no prompt's ids or logprobs.
    assert batch["prompt_token_ids"] is None and batch["prompt_logprobs"] is None


async def test_roles_and_echo_are_each_conversations(http: httpx.AsyncClient) -> None:
    conversations = [
        [{"role": "user", "content": "A"}, {"role": "assistant", "content": "Once"}],
        [{"role": "user", "content": "B"}],
    ]
    body = GREEDY | {"messages": conversations, "echo": True}
    found = await ok(http, BATCH, body | {"add_generation_prompt": False})
    roles = [c["message"]["role"] for c in found["choices"]]
    assert roles == ["assistant", "user"]  # vLLM's: the last message's
    contents = [c["message"]["content"] for c in found["choices"]]
    assert contents[0].startswith("Once") and contents[1].startswith("B")
    # With a generation prompt, only an assistant's last message is echoed: none here.
    found = await ok(http, BATCH, body)
    assert [c["message"]["role"] for c in found["choices"]] == ["assistant", "assistant"]
    alone = await ok(http, "/v1/chat/completions", GREEDY | {"messages": conversations[1]})
    assert found["choices"][1]["message"] == alone["choices"][0]["message"]


REFUSED = [
    ({"stream": True}, "stream", "Batch chat completions do not support streaming."),
    ({"n": 2, "temperature": 1}, "n", "Batch chat completions do not support `n > 1`."),
    ({"use_beam_search": True}, "use_beam_search", "do not support beam search."),
    (
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        "tools",
        "Batch chat completions do not support tools.",
    ),
    ({"tool_choice": "auto"}, "tool_choice", "Input should be 'none'"),
    ({"messages": []}, "messages", "at least 1 item"),
    ({"messages": [CONVERSATIONS[0], []]}, "messages[1]", "at least 1 item"),
    ({"messages": [[{"content": "no role"}]]}, "messages[0][0].role", "Missing required"),
    (
        {"messages": [CONVERSATIONS[0], [{"role": "user", "content": [{"type": "image"}]}]]},
        "messages[1][0].content[0].type",
        "Only text content parts are served",
    ),
    ({"prompt_logprobs": 1}, "prompt_logprobs", "do not support `prompt_logprobs`"),
    ({"model": "plain"}, "model", "has no chat template"),
    ({"messages": [CONVERSATIONS[0]] * 2049}, "messages", "conversation list length 2049"),
]


@pytest.mark.parametrize(("extra", "param", "words"), REFUSED, ids=[p for _, p, _ in REFUSED])
async def test_what_vllm_refuses_is_a_400_naming_it(
    http: httpx.AsyncClient, extra: dict[str, Any], param: str, words: str
) -> None:
    body = GREEDY | {"messages": CONVERSATIONS} | extra
    found = error(await http.post(BATCH, json=body))
    assert found["param"] == param and words in found["message"], found
    if extra.get("model") == "plain":
        assert found["code"] == "chat_template_missing"


async def test_a_conversation_past_the_context_fails_the_batch(http: httpx.AsyncClient) -> None:
    long = [{"role": "user", "content": "x"}] * 300  # more messages than tokens of context
    found = error(await http.post(BATCH, json=GREEDY | {"messages": [CONVERSATIONS[0], long]}))
    assert (found["param"], found["code"]) == ("messages[1]", "context_length_exceeded")
    # Past the context once rendered: the model's refusal fails the whole request.
    words = [{"role": "user", "content": "y" * 400}]
    found = error(await http.post(BATCH, json=GREEDY | {"messages": [CONVERSATIONS[0], words]}))
    assert (found["param"], found["code"]) == ("messages", "context_length_exceeded")


PATTERN = r"[a-c]{2,5}-\d{3}"


async def test_each_conversation_has_its_own_thoughts(repo: Path) -> None:
    # deepseek_r1 with structured outputs: the grammar applies after `</think>`, which
    # the random model never writes, unless the prompt closed the thoughts itself.
    async with openai_client(repo, ["tiny"], ToolSettings(reasoning_parser="deepseek_r1")) as http:
        conversations = [
            [{"role": "user", "content": "Hello"}],
            [{"role": "user", "content": "<think>x</think>"}],
        ]
        body = GREEDY | {"max_tokens": 24, "structured_outputs": {"regex": PATTERN}}
        batch = await ok(http, BATCH, body | {"messages": conversations, "return_token_ids": True})
        free, closed = (c["message"] for c in batch["choices"])
        assert free["content"] is None and not re.fullmatch(PATTERN, free["reasoning"])
        assert re.fullmatch(PATTERN, closed["reasoning"]), closed
        for choice, conversation in zip(batch["choices"], conversations, strict=True):
            alone = await ok(http, "/v1/chat/completions", body | {"messages": conversation})
            assert choice["message"] == alone["choices"][0]["message"]
        # The byte tokenizer has no `<think>` token: nothing is counted, as a single chat.
        assert batch["usage"]["completion_tokens_details"] is None
