"""/v1/completions with a list of prompts and with token-id prompts (vLLM's and OpenAI's
forms, what lm-eval-harness's local-completions sends), through the `openai` client,
against the stand-in models of tests/textgen.py: `textgen` repeats its prompt's words,
`textgen_ids` also takes token ids (its `input_ids`) and answers with their dtype and
shape, then the ids."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import textgen
from polling import poll
from promtext import scrape
from serverproc import ServerProcess, running_server

if TYPE_CHECKING:
    import openai
else:
    openai = pytest.importorskip("openai", reason="the openai client is not installed (test extra)")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = textgen.write(tmp_path_factory.mktemp("openai-prompts"))
    textgen.write_ids(repo)
    with running_server([repo]) as proc:
        yield proc


@pytest.fixture
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused") as c:
        yield c


def refusal(call: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    body = caught.value.body
    assert isinstance(body, dict)
    return body


def test_a_list_of_prompts_with_n_answers_each_in_vllms_order(client: openai.OpenAI) -> None:
    prompts = ["a b c", "d e", "f g h i"]
    answer = client.completions.create(model="textgen", prompt=prompts, n=2, seed=5)
    # vLLM's: prompt p's choice i is index p * n + i, in that order.
    assert [c.index for c in answer.choices] == list(range(6))
    assert [c.text for c in answer.choices] == [p for p in prompts for _ in range(2)]
    assert answer.usage is not None
    # Each prompt counted once, every choice's tokens summed.
    assert answer.usage.prompt_tokens == 3 + 2 + 4
    assert answer.usage.completion_tokens == 2 * (3 + 2 + 4)
    assert answer.usage.total_tokens == 3 * (3 + 2 + 4)


def test_a_streamed_list_gives_every_choice_and_the_summed_usage(client: openai.OpenAI) -> None:
    prompts = ["a b c", "d e"]
    stream = client.completions.create(
        model="textgen",
        prompt=prompts,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"echo": True},
    )
    texts: dict[int, str] = {}
    reasons: dict[int, str | None] = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            reasons[choice.index] = choice.finish_reason or reasons.get(choice.index)
    # Each choice echoes its own prompt, then repeats it.
    assert texts == {k: prompts[k // 2] + prompts[k // 2] for k in range(4)}
    assert reasons == dict.fromkeys(range(4), "stop")
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (3 + 2, 2 * (3 + 2))


def pending(server: ServerProcess) -> float:
    found = scrape(server.metrics_url).find("nv_inference_pending_request_count", model="textgen")
    return found[0][1] if found else 0


def test_one_bad_prompt_fails_the_list_and_nothing_is_left_running(
    server: ServerProcess, client: openai.OpenAI
) -> None:
    log = server.log()
    started, cancelled = log.count("textgen: started"), log.count("textgen: cancelled")
    too_long = " ".join(["w"] * (textgen.MAX_MODEL_LEN + 1))
    slow = " ".join(["SLOW"] * 40)
    body = refusal(
        lambda: client.completions.create(
            model="textgen", prompt=[too_long, slow, slow], max_tokens=40
        )
    )
    assert (body["param"], body["code"]) == ("prompt", "context_length_exceeded")

    def drained() -> bool:
        log = server.log()
        begun = log.count("textgen: started") - started
        return pending(server) == 0 and log.count("textgen: cancelled") - cancelled == begun

    # The slow prompts are cancelled: queued ones leave the queue, a begun one stops.
    poll(drained, 10, "the model's queue to empty")
    assert client.completions.create(model="textgen", prompt="still here").choices[0].text == (
        "still here"
    )


@pytest.mark.parametrize(
    ("prompt", "n", "words"),
    [
        (["a"] * 2049, 1, "prompt list length 2049 exceeds the maximum allowed count of 2048"),
        (["a"] * 17, 128, "a request generates at most 2048"),
    ],
)
def test_the_bounds_on_prompts_and_sequences(
    client: openai.OpenAI, prompt: list[str], n: int, words: str
) -> None:
    body = refusal(
        lambda: client.completions.create(model="textgen", prompt=prompt, n=n, temperature=1)
    )
    assert body["param"] == "prompt" and words in body["message"]


def test_token_id_prompts_reach_the_model_as_its_input_ids(client: openai.OpenAI) -> None:
    one = client.completions.create(model="textgen_ids", prompt=[5, 6, 70000])
    (choice,) = one.choices
    # The ids, unchanged, in the dtype (INT32) and shape ([len]) the model declares.
    assert choice.text == "int32[3] 5 6 70000"
    assert one.usage is not None and one.usage.prompt_tokens == 3
    several = client.completions.create(model="textgen_ids", prompt=[[1, 2], [3]], n=2)
    texts = [c.text for c in several.choices]
    assert texts == ["int32[2] 1 2"] * 2 + ["int32[1] 3"] * 2
    assert several.usage is not None and several.usage.prompt_tokens == 3
    # The same model still takes text.
    text = client.completions.create(model="textgen_ids", prompt=["x y"])
    assert text.choices[0].text == "x y"


def test_a_token_id_prompt_is_refused_by_a_model_without_input_ids(
    client: openai.OpenAI,
) -> None:
    for prompt, echo in (([1, 2, 3], False), ([[1, 2]], False), ([1], True)):
        body = refusal(
            lambda p=prompt, e=echo: client.completions.create(model="textgen", prompt=p, echo=e)
        )
        assert (body["param"], body["code"]) == ("prompt", "unsupported_parameter")
        assert "'input_ids' input" in body["message"] and "'textgen'" in body["message"]


def test_echo_of_token_ids_needs_the_models_tokenizer(client: openai.OpenAI) -> None:
    body = refusal(lambda: client.completions.create(model="textgen_ids", prompt=[1, 2], echo=True))
    assert (body["param"], body["code"]) == ("echo", "tokenizer_missing")
    assert "'textgen_ids'" in body["message"]


@pytest.mark.parametrize(
    ("prompt", "words"),
    [
        (["a", 1], "not a mix"),
        ([[1, -2]], "token id -2 should be greater than or equal to 0"),
        ([], "'prompt' must not be an empty list"),
        ([[]], "The decoder prompt cannot be empty"),
        (["a", ""], "'prompt' must not be empty"),
        # Past any vocabulary and an INT32 input's range (vLLM's words), past 64 bits too.
        ([[1, 2**31]], f"Token id {2**31} is out of vocabulary"),
        ([2**70], f"Token id {2**70} is out of vocabulary"),
        (None, "Input should be a string, a list of strings, a list of token ids"),
        ({"a": 1}, "Input should be a string, a list of strings, a list of token ids"),
    ],
)
def test_bad_prompt_lists_are_refused_on_prompt(
    server: ServerProcess, prompt: Any, words: str
) -> None:
    body = {"model": "textgen_ids", "prompt": prompt}
    answer = httpx.post(server.base_url + "/v1/completions", json=body, timeout=30)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "prompt" and words in error["message"]
