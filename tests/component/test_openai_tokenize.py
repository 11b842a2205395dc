"""vLLM's `POST /tokenize` and `POST /detokenize` over the llm backend's tiny model
(tests/llmrepo.py: byte-level BPE, every byte one token), checked against the
`tokenizers` library; chats rendered by the chat route's template rules; and the models
whose tokenizer the server cannot reach (tests/textgen.py's Python models)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import smollm
import textgen
from llmrepo import EOS_TOKEN, byte_tokenizer, write_tiny_llm
from openai_inprocess import error, openai_client

from ge_serve.server.control.restrictions import http_category

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

EOS_ID = 256
# The tiny model's template, and one that prints the tools it is given.
CHAT_LINE = "{role}: {content}\n"
TOOLS_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "tools={{ tools | tojson }}"
)


def marking_tokenizer() -> Any:
    """The byte tokenizer with a post-processor that opens every text with EOS_TOKEN, so
    `add_special_tokens` shows."""
    from tokenizers import processors

    tokenizer = byte_tokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{EOS_TOKEN} $A", special_tokens=[(EOS_TOKEN, EOS_ID)]
    )
    return tokenizer


def spm_tokenizer() -> Any:
    """SentencePiece's kind (examples/smollm/gguf_tokenizer.py): <unk> <s> </s>, the 256
    byte tokens, then ▁ a b ab ▁ab (ids 259 to 263); its decoder strips a text's first
    space."""
    pieces = ["\u2581", "a", "b", "ab", "\u2581ab"]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
    spec = smollm.gguf_tokenizer().TokenizerSpec(
        tokens=tokens, token_types=[2, 3, 3] + [6] * 256 + [1] * len(pieces), merges=[],
        pre="default", bos_token_id=1, eos_token_id=2, chat_template="", model="llama",
        scores=[0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0],
    )  # fmt: skip
    return smollm.gguf_tokenizer().build_tokenizer(spec)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = textgen.write(tmp_path_factory.mktemp("openai-tokenize"))
    write_tiny_llm(folder, "tiny_llm")
    marked = write_tiny_llm(folder, "tiny_marked") / "1"
    marking_tokenizer().save(str(marked / "tokenizer.json"))
    (marked / "chat_template.jinja").write_text(TOOLS_TEMPLATE, encoding="utf-8")
    spm_tokenizer().save(str(write_tiny_llm(folder, "tiny_spm") / "1" / "tokenizer.json"))
    # build.py's folder (prompt log probabilities too), its tokenizer adding a BOS.
    built, _, _ = smollm.tiny_model_folder(folder, "tiny_bos")
    spec = dataclasses.replace(smollm.tiny_tokenizer_spec(), add_bos_token=True)
    smollm.gguf_tokenizer().build_tokenizer(spec).save(str(built / "1" / "tokenizer.json"))
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def http(repo: Path) -> AsyncIterator[httpx.AsyncClient]:
    models = ["tiny_llm", "tiny_marked", "tiny_spm", "tiny_bos", "textgen", "embedder"]
    async with openai_client(repo, models) as client:
        yield client


async def tokenize(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post("/tokenize", json={"model": "tiny_llm", **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def ids(text: str, tokenizer: Any = None, special: bool = True) -> list[int]:
    return list((tokenizer or byte_tokenizer()).encode(text, add_special_tokens=special).ids)


async def test_a_prompt_is_tokenized_as_the_tokenizers_library_does(
    http: httpx.AsyncClient,
) -> None:
    text = "Hello, wörld! vllm1"
    answer = await tokenize(http, prompt=text)
    expected = ids(text)
    assert answer == {
        "count": len(expected),
        "max_model_len": 256,
        "tokens": expected,
        "token_strs": None,
    }
    strings = await tokenize(http, prompt=text, return_token_strs=True)
    assert strings["token_strs"] == [byte_tokenizer().id_to_token(i) for i in expected]


async def test_add_special_tokens_defaults_as_vllms(http: httpx.AsyncClient) -> None:
    # True for a prompt, false for a chat, whose template writes the special tokens.
    marked = marking_tokenizer()
    prompt = await tokenize(http, model="tiny_marked", prompt="hi")
    assert prompt["tokens"] == ids("hi", marked) == [EOS_ID, *ids("hi")]
    bare = await tokenize(http, model="tiny_marked", prompt="hi", add_special_tokens=False)
    assert bare["tokens"] == ids("hi")
    messages = [{"role": "user", "content": "hi"}]
    rendered = "user: hi\ntools=null"
    chat = await tokenize(http, model="tiny_marked", messages=messages)
    assert chat["tokens"] == ids(rendered)
    special = await tokenize(http, model="tiny_marked", messages=messages, add_special_tokens=True)
    assert special["tokens"] == [EOS_ID, *ids(rendered)]


async def test_an_answers_first_space_is_kept_after_the_prompt(http: httpx.AsyncClient) -> None:
    """The answer is decoded after the prompt's last tokens (as vLLM primes its decoder):
    its first token `▁ab` reads " ab", as in vLLM and llama.cpp, where decoded alone the
    SentencePiece decoder would strip the space."""
    body = {"model": "tiny_spm", "prompt": "ab", "max_tokens": 2, "temperature": 0}
    forced = body | {"logit_bias": {"263": 100}, "return_token_ids": True}
    for stream in (False, True):
        answer = await http.post("/v1/completions", json=forced | {"stream": stream})
        assert answer.status_code == 200, answer.text
        if stream:
            chunks = [line[6:] for line in answer.text.splitlines() if line.startswith("data: {")]
            text = "".join(c["text"] for chunk in chunks for c in json.loads(chunk)["choices"])
        else:
            assert answer.json()["choices"][0]["token_ids"] == [263, 263]
            text = answer.json()["choices"][0]["text"]
        assert text == " ab ab"


async def test_the_echos_first_token_is_the_bos_the_tokenizer_added(
    http: httpx.AsyncClient,
) -> None:
    """vLLM decodes the echo's first token by its id: the BOS the tokenizer put before the
    text, which the text itself lacks, streamed or not; without the BOS, the text's own."""
    body = {"model": "tiny_bos", "prompt": " the and", "max_tokens": 1, "echo": True}
    for given in ({"logprobs": 0}, {"logprobs": 0, "stream": True}):
        found = await http.post("/v1/completions", json=body | given)
        assert found.status_code == 200, found.text
        if given.get("stream"):
            chunks = [json.loads(line[6:]) for line in found.text.splitlines()
                      if line.startswith("data: {")]  # fmt: skip
            tokens = [t for c in chunks for ch in c["choices"] if ch["logprobs"]
                      for t in ch["logprobs"]["tokens"]]  # fmt: skip
        else:
            tokens = found.json()["choices"][0]["logprobs"]["tokens"]
        assert tokens[:3] == ["<|im_start|>", " the", " and"]
    bare = body | {"logprobs": 0, "add_special_tokens": False}
    found = await http.post("/v1/completions", json=bare)
    assert found.json()["choices"][0]["logprobs"]["tokens"][:2] == [" the", " and"]


async def test_a_chat_reaches_the_model_without_the_tokenizers_special_tokens(
    http: httpx.AsyncClient,
) -> None:
    """As vLLM tokenizes them: a chat without what the tokenizer adds (its template
    writes it; a Llama's BOS would be there twice), a completion's prompt with it, and
    Triton's generate with it unless its `add_special_tokens` parameter says false."""
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": "tiny_marked", "max_tokens": 1, "temperature": 0}
    asked = body | {"messages": messages, "return_token_ids": True}
    chat = await http.post("/v1/chat/completions", json=asked)
    assert chat.status_code == 200, chat.text
    rendered = "user: hi\ntools=null"
    assert chat.json()["usage"]["prompt_tokens"] == len(ids(rendered))
    assert chat.json()["prompt_token_ids"] == ids(rendered)
    completion = await http.post("/v1/completions", json=body | {"prompt": "hi"})
    assert completion.json()["usage"]["prompt_tokens"] == len(ids("hi")) + 1
    # vLLM's add_special_tokens, either way on either route.
    chat = await http.post("/v1/chat/completions", json=asked | {"add_special_tokens": True})
    assert chat.json()["prompt_token_ids"] == [EOS_ID, *ids(rendered)]
    assert chat.json()["usage"]["prompt_tokens"] == len(ids(rendered)) + 1
    bare = body | {"prompt": "hi", "add_special_tokens": False, "return_token_ids": True}
    completion = await http.post("/v1/completions", json=bare)
    assert completion.json()["usage"]["prompt_tokens"] == len(ids("hi"))
    assert completion.json()["choices"][0]["prompt_token_ids"] == ids("hi")
    for given, count in (({}, len(ids("hi")) + 1), ({"add_special_tokens": False}, len(ids("hi")))):
        request = {"text_input": "hi", "max_tokens": 1, "return_num_input_tokens": True} | given
        generated = await http.post("/v2/models/tiny_marked/generate", json=request)
        assert generated.status_code == 200, generated.text
        assert generated.json()["num_input_tokens"] == count


async def test_a_chat_is_rendered_as_the_chat_route_renders_it(http: httpx.AsyncClient) -> None:
    messages = [
        {"role": "user", "content": "Hi there!"},
        {"role": "assistant", "content": "Sure,"},
    ]
    lines = "".join(CHAT_LINE.format(**m) for m in messages)
    opened = await tokenize(http, messages=messages)
    assert opened["tokens"] == ids(lines + "assistant: ")
    closed = await tokenize(http, messages=messages, add_generation_prompt=False)
    assert closed["tokens"] == ids(lines)
    continued = await tokenize(
        http, messages=messages, add_generation_prompt=False, continue_final_message=True
    )
    assert continued["tokens"] == ids("user: Hi there!\nassistant: Sure,")


async def test_tools_reach_the_template(http: httpx.AsyncClient) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    messages = [{"role": "user", "content": "weather?"}]
    answer = await tokenize(http, model="tiny_marked", messages=messages, tools=tools)
    rendered = (
        'user: weather?\ntools=[{"type": "function", '
        '"function": {"name": "get_weather", "parameters": {}}}]'
    )
    assert answer["tokens"] == ids(rendered)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # The chat route's rules and refusals.
        ({"continue_final_message": True}, "continue_final_message"),
        ({"chat_template": "{{ 1 }}"}, "chat_template"),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
         "messages[0].content[0].type"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        ({"prompt": "both"}, "prompt"),
        ({"return_token_strs": "yes"}, "return_token_strs"),
    ],
)  # fmt: skip
async def test_a_chat_the_chat_route_refuses_is_refused(
    http: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    document = {"model": "tiny_llm", "messages": [{"role": "user", "content": "hi"}], **body}
    assert error(await http.post("/tokenize", json=document))["param"] == param


async def test_detokenize_decodes_with_the_special_tokens(http: httpx.AsyncClient) -> None:
    text = "Hello, wörld!"
    tokens = [*ids(text), EOS_ID]
    response = await http.post("/detokenize", json={"model": "tiny_llm", "tokens": tokens})
    assert response.status_code == 200, response.text
    assert response.json() == {"prompt": text + EOS_TOKEN}


@pytest.mark.parametrize(
    ("tokens", "message", "param"),
    [
        ([72, 300, 257], "Token id 300 is out of vocabulary", "tokens"),
        ([2**40], f"Token id {2**40} is out of vocabulary", "tokens"),
        ([-1], "Invalid value for 'tokens[0]': Input should be greater than or equal to 0",
         "tokens[0]"),
        ([1.5], "Invalid value for 'tokens[0]': Input should be a valid integer", "tokens[0]"),
    ],
)  # fmt: skip
async def test_ids_outside_the_vocabulary_are_400(
    http: httpx.AsyncClient, tokens: list[Any], message: str, param: str
) -> None:
    response = await http.post("/detokenize", json={"model": "tiny_llm", "tokens": tokens})
    found = error(response)
    assert (found["message"], found["param"]) == (message, param)


async def test_too_many_ids_are_refused_before_they_are_checked(
    http: httpx.AsyncClient,
) -> None:
    # Checking and decoding millions of ids holds the interpreter for seconds: a bound.
    tokens = ids("H") * (2**18 + 1)
    response = await http.post("/detokenize", json={"model": "tiny_llm", "tokens": tokens})
    found = error(response)
    assert found["param"] == "tokens"
    assert found["message"] == "'tokens' holds 262145 ids; at most 262144 are detokenized at once"
    at_most = await http.post("/detokenize", json={"model": "tiny_llm", "tokens": tokens[1:]})
    assert at_most.status_code == 200 and at_most.json() == {"prompt": "H" * 2**18}


@pytest.mark.parametrize("model", ["textgen", "embedder"])
@pytest.mark.parametrize("route", ["/tokenize", "/detokenize"])
async def test_a_model_that_tokenizes_inside_itself_is_400(
    http: httpx.AsyncClient, model: str, route: str
) -> None:
    body = {"model": model, "prompt": "hi", "tokens": [1]}
    found = error(await http.post(route, json=body))
    assert found["code"] == "tokenizer_missing"
    assert found["message"].startswith(f"The model '{model}' has no tokenizer ge-serve can use")


async def test_an_unknown_model_and_a_bad_body_are_openai_errors(
    http: httpx.AsyncClient,
) -> None:
    missing = error(await http.post("/tokenize", json={"model": "nope", "prompt": "x"}), 404)
    assert missing["code"] == "model_not_found"
    assert error(await http.post("/detokenize", content=b"{"))["code"] == "invalid_json"
    assert error(await http.post("/tokenize", json={"model": "tiny_llm"}))["param"] == "prompt"


async def test_the_routes_are_in_the_inference_category() -> None:
    routes = ("/tokenize", "/detokenize", "/tokenizer_info")
    assert {http_category(route) for route in routes} == {"inference"}


async def test_tokenizer_info_answers_what_lm_evals_remote_tokenizer_reads(repo: Path) -> None:
    """lm-eval-harness's remote tokenizer (`tokenizer_backend=remote`, or its default when
    the route answers) reads the special tokens and the chat template from it, and
    tokenizes through /tokenize: no tokenizer of the client's own is needed."""
    template = (repo / "tiny_llm" / "1" / "chat_template.jinja").read_text(encoding="utf-8")
    async with openai_client(repo, ["tiny_llm", "textgen"]) as client:
        found = await client.get("/tokenizer_info")
        assert found.status_code == 200, found.text
        assert found.json() == {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": 256,
            "eos_token": EOS_TOKEN,
            "chat_template": template,
        }
        # Its eos_token_id: the token's text tokenized without special tokens.
        eos = await client.post(
            "/tokenize", json={"prompt": EOS_TOKEN, "add_special_tokens": False}
        )
        assert eos.json()["tokens"] == [EOS_ID]


async def test_tokenizer_info_of_a_named_model(http: httpx.AsyncClient) -> None:
    # Two models with tokenizers: the query names one, as `model` names it in a body.
    assert error(await http.get("/tokenizer_info"))["param"] == "model"
    found = await http.get("/tokenizer_info", params={"model": "tiny_marked"})
    assert found.status_code == 200 and found.json()["chat_template"] == TOOLS_TEMPLATE
    missing = error(await http.get("/tokenizer_info", params={"model": "textgen"}))
    assert missing["code"] == "tokenizer_missing"
    assert error(await http.get("/tokenizer_info", params={"model": "nope"}), 404)


async def test_without_a_model_the_only_one_with_a_tokenizer_answers(repo: Path) -> None:
    """vLLM's `model` is optional on /tokenize and /detokenize (its one served model):
    lm-eval's remote tokenizer sends none. Here the one model whose tokenizer the server
    holds answers; with two, `model` is required."""
    async with openai_client(repo, ["tiny_llm", "textgen"]) as client:
        found = await client.post("/tokenize", json={"prompt": "Hi", "add_special_tokens": False})
        assert found.status_code == 200, found.text
        assert found.json()["tokens"] == ids("Hi", special=False)
        back = await client.post("/detokenize", json={"tokens": found.json()["tokens"]})
        assert back.status_code == 200 and back.json()["prompt"] == "Hi", back.text


async def test_without_a_model_several_with_tokenizers_is_400(http: httpx.AsyncClient) -> None:
    found = error(await http.post("/tokenize", json={"prompt": "Hi"}))
    assert found["param"] == "model" and "4 models" in found["message"]
