"""The generation engine in a real ge-serve: a tiny random-weight LLaMA (tests/llmrepo.py)
served by the `llm` backend, over Triton's generate endpoints (httpx) and gRPC
ModelStreamInfer (tritonclient).

Greedy answers are compared with the numpy reference's, token for token (through the
text, which the byte tokenizer maps one to one): alone, and sixteen at once, since batching
must not change results. A small KV budget forces preemption, which the metrics show, and
every request still finishes with the right answer. A client that leaves frees its blocks;
a request that arrives while others generate gets its first token while they are still
generating. Bad input is a 4xx or INVALID_ARGUMENT, never a 500.
"""

from __future__ import annotations

import asyncio
import json
import queue
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from deployfiles import DEPLOY
from metricdocs import documented, undocumented
from polling import poll
from promtext import Exposition, scrape
from serverproc import REPO_ROOT, ServerProcess, running_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

MODEL = "tiny_llm"
# The same model under a config as minimal as Triton's vLLM backend's samples.
MINIMAL = "minimal_llm"
GREEDY = json.dumps({"temperature": 0})


@cache
def reference(prompt: str, tokens: int) -> str:
    return llmrepo.reference_text(prompt, tokens)


def prompts(count: int, base: str = "Request") -> list[str]:
    return [f"{base} {i}: " + "abcdefgh"[: 1 + i % 8] * (1 + i % 3) for i in range(count)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("llm")
    # Long enough a context that a request of 1000 tokens is still running when its client
    # leaves.
    llmrepo.write_tiny_llm(repo, MODEL, {"max_model_len": "1024", "kv_cache_blocks": "256"})
    llmrepo.write_tiny_llm(repo, MINIMAL, interface=False)
    with running_server([repo]) as proc:
        yield proc


def generate_url(server: ServerProcess, stream: bool = False) -> str:
    suffix = "generate_stream" if stream else "generate"
    return f"{server.base_url}/v2/models/{MODEL}/{suffix}"


def events(response: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]


def metric(server: ServerProcess, name: str, **labels: str) -> float:
    return scrape(server.metrics_url).value(name, model_name=MODEL, **labels)


# --- answers ------------------------------------------------------------------------------


def test_greedy_generate_equals_reference(server: ServerProcess) -> None:
    prompt = "The quick brown fox"
    body = {"text_input": prompt, "max_tokens": 24, "sampling_parameters": GREEDY}
    answer = httpx.post(generate_url(server), json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    doc = answer.json()
    # Not streamed: one response with the prompt and the whole answer (Triton's vLLM way).
    assert doc["text_output"] == prompt + reference(prompt, 24)
    assert doc["num_input_tokens"] == len(llmrepo.prompt_ids(prompt))
    expected_tokens = len(llmrepo.reference_greedy(prompt, 24))
    assert doc["num_output_tokens"] == expected_tokens
    assert doc["finish_reason"] == ("length" if expected_tokens == 24 else "stop")


def test_parameters_object_and_top_level_fields_both_work(server: ServerProcess) -> None:
    prompt = "Triton forms"
    nested = {
        "text_input": prompt,
        "parameters": {"max_tokens": 10, "temperature": 0, "exclude_input_in_output": True},
    }
    flat = {"text_input": prompt, "max_tokens": 10, "temperature": 0,
            "exclude_input_in_output": True}  # fmt: skip
    for body in (nested, flat):
        answer = httpx.post(generate_url(server), json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["text_output"] == reference(prompt, 10)


def test_stream_sends_deltas_and_the_last_carries_the_reason(server: ServerProcess) -> None:
    prompt = "Streaming"
    body = {"text_input": prompt, "max_tokens": 16, "stream": True, "sampling_parameters": GREEDY}
    answer = httpx.post(generate_url(server, stream=True), json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    got = events(answer)
    assert len(got) >= 2
    assert "".join(e["text_output"] for e in got) == reference(prompt, 16)
    assert all("finish_reason" not in e for e in got[:-1])
    assert got[-1]["finish_reason"] in ("length", "stop")


def test_a_config_without_an_interface_gets_the_vllm_backends(server: ServerProcess) -> None:
    """Auto-complete declares Triton's vLLM backend's inputs, outputs and decoupled policy,
    so its other outputs are opt-in by their `return_*` flags, as there; and, unlike it,
    `input_ids` beside an optional `text_input` (a prompt as token ids)."""
    config = httpx.get(f"{server.base_url}/v2/models/{MINIMAL}/config", timeout=10).json()
    inputs = {i["name"]: (i["data_type"], i["optional"]) for i in config["input"]}
    assert inputs["text_input"] == ("TYPE_STRING", True)
    assert inputs["input_ids"] == ("TYPE_INT32", True)
    assert next(i["dims"] for i in config["input"] if i["name"] == "input_ids") == [-1]
    assert inputs["return_finish_reason"] == ("TYPE_BOOL", True)
    assert {"stream", "sampling_parameters", "exclude_input_in_output"} < set(inputs)
    assert "image" not in inputs
    outputs = {o["name"]: (o["data_type"], o["dims"]) for o in config["output"]}
    assert outputs["num_input_tokens"] == ("TYPE_UINT32", [1])
    assert outputs["logprobs"] == ("TYPE_STRING", [-1])
    assert config["model_transaction_policy"] == {"decoupled": True}
    url = f"{server.base_url}/v2/models/{MINIMAL}/generate"
    body = {"text_input": "Minimal", "max_tokens": 6, "sampling_parameters": GREEDY}
    plain = httpx.post(url, json=body, timeout=30)
    assert plain.status_code == 200, plain.text
    assert set(plain.json()) == {"model_name", "model_version", "text_output"}
    assert plain.json()["text_output"] == "Minimal" + reference("Minimal", 6)
    flagged = {**body, "return_finish_reason": True, "return_num_output_tokens": True}
    answer = httpx.post(url, json=flagged, timeout=30).json()
    tokens = len(llmrepo.reference_greedy("Minimal", 6))
    assert answer["num_output_tokens"] == tokens
    assert answer["finish_reason"] == ("length" if tokens == 6 else "stop")


ONE_PROMPT = (
    "a request carries exactly one of the inputs 'text_input' (the prompt as text) and "
    "'input_ids' (the prompt as token ids)"
)


def test_v2_generate_takes_a_prompt_as_token_ids(server: ServerProcess) -> None:
    """The auto-completed `input_ids`: the ids answer as the text they encode, the text
    repeated before the answer is theirs decoded; both, neither or an id past the
    tokenizer's are a 400 in the engine's words (vLLM's for the id)."""
    ids = llmrepo.prompt_ids("Minimal")
    for stream in (False, True):
        url = f"{server.base_url}/v2/models/{MINIMAL}/generate{'_stream' if stream else ''}"
        body: dict[str, Any] = {"input_ids": ids, "max_tokens": 6, "stream": stream,
                                "sampling_parameters": GREEDY}  # fmt: skip
        answer = httpx.post(url, json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        expected = reference("Minimal", 6)
        if stream:  # a stream never repeats the prompt
            assert "".join(e["text_output"] for e in events(answer)) == expected
        else:
            assert answer.json()["text_output"] == "Minimal" + expected
        for bad, message in (
            ({**body, "text_input": "Minimal"}, f"{ONE_PROMPT}; it has both"),
            ({k: v for k, v in body.items() if k != "input_ids"}, f"{ONE_PROMPT}; it has neither"),
            (
                {**body, "input_ids": [*ids, llmrepo.VOCAB]},
                f"Token id {llmrepo.VOCAB} is out of vocabulary",
            ),
            ({**body, "input_ids": []}, "The decoder prompt cannot be empty"),
        ):
            refused = httpx.post(url, json=bad, timeout=30)
            assert refused.status_code == 400, refused.text
            assert message in refused.text


def test_grpc_stream_takes_a_prompt_as_token_ids(server: ServerProcess) -> None:
    """tritonclient's decoupled stream with an INT32 `input_ids` tensor: the answer is the
    text's; an id out of the vocabulary is the request's error, in vLLM's words."""
    ids = llmrepo.prompt_ids("gRPC ids")
    sampling = json.dumps({"temperature": 0, "max_tokens": 12}).encode()
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def request(prompt: list[int], request_id: str) -> None:
        inputs = []
        for name, array, kind in (
            ("input_ids", np.array(prompt, dtype=np.int32), "INT32"),
            ("stream", np.array([True]), "BOOL"),
            ("return_finish_reason", np.array([True]), "BOOL"),
            ("sampling_parameters", np.array([sampling], dtype=object), "BYTES"),
        ):
            tensor = grpcclient.InferInput(name, list(array.shape), kind)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        client.async_stream_infer(MINIMAL, inputs, request_id=request_id)

    text = ""
    try:
        client.start_stream(callback=lambda result, error: results.put(error or result))
        request([*ids, -3], "bad")
        error = results.get(timeout=30)
        assert isinstance(error, InferenceServerException)
        assert "Token id -3 is out of vocabulary" in str(error.message())
        request(ids, "good")
        while True:
            result = results.get(timeout=60)
            assert not isinstance(result, InferenceServerException), result
            text += result.as_numpy("text_output")[0].decode()
            if result.as_numpy("finish_reason")[0] != b"None":
                break
    finally:
        client.stop_stream()
        client.close()
    assert text == reference("gRPC ids", 12)


def test_v2_generate_gives_the_vllm_backends_logprobs(server: ServerProcess) -> None:
    """return_logprobs / return_cumulative_logprob with sampling `logprobs`: per response,
    the JSON of its tokens' {token_id: {logprob, rank, decoded_token}}, and the sum."""
    url = f"{server.base_url}/v2/models/{MINIMAL}/generate"
    sampling = json.dumps({"temperature": 0, "logprobs": 2, "max_tokens": 4, "ignore_eos": True})
    body = {
        "text_input": "Minimal",
        "sampling_parameters": sampling,
        "return_logprobs": True,
        "return_cumulative_logprob": True,
    }
    answer = httpx.post(url, json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    found = answer.json()
    entries = json.loads(found["logprobs"])
    assert [int(next(iter(e))) for e in entries] == llmrepo.reference_ids("Minimal", 4)
    for entry in entries:
        assert 2 <= len(entry) <= 3
        assert next(iter(entry.values()))["rank"] == 1  # greedy: the argmax
        assert set(next(iter(entry.values()))) == {"logprob", "rank", "decoded_token"}
    total = sum(next(iter(e.values()))["logprob"] for e in entries)
    assert found["cumulative_logprob"] == pytest.approx(total, abs=1e-4)
    # The flag without sampling logprobs: "null", as the vLLM backend sends it.
    body["sampling_parameters"] = GREEDY
    assert httpx.post(url, json=body, timeout=30).json()["logprobs"] == "null"


async def test_sixteen_concurrent_streams_equal_the_reference(server: ServerProcess) -> None:
    texts = prompts(16)
    async with httpx.AsyncClient(timeout=120) as client:

        async def one(prompt: str) -> str:
            body = {"text_input": prompt, "max_tokens": 40, "stream": True,
                    "sampling_parameters": GREEDY}  # fmt: skip
            answer = await client.post(generate_url(server, stream=True), json=body)
            assert answer.status_code == 200, answer.text
            return "".join(e["text_output"] for e in events(answer))

        answers = await asyncio.gather(*(one(p) for p in texts))
    for prompt, answer in zip(texts, answers, strict=True):
        assert answer == reference(prompt, 40), prompt


def test_grpc_model_stream_infer_sixteen_requests(server: ServerProcess) -> None:
    texts = prompts(16, "gRPC")
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put(error or result))
        for index, prompt in enumerate(texts):
            inputs = []
            for name, array, kind in (
                ("text_input", np.array([prompt.encode()], dtype=object), "BYTES"),
                ("stream", np.array([True]), "BOOL"),
                ("max_tokens", np.array([30], dtype=np.int32), "INT32"),
                ("sampling_parameters", np.array([GREEDY.encode()], dtype=object), "BYTES"),
            ):
                tensor = grpcclient.InferInput(name, [1], kind)
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            client.async_stream_infer(MODEL, inputs, request_id=str(index))
        texts_by_id: dict[str, str] = {str(i): "" for i in range(len(texts))}
        finished: set[str] = set()
        while len(finished) < len(texts):
            result = results.get(timeout=60)
            assert not isinstance(result, InferenceServerException), result
            request_id = result.get_response().id
            texts_by_id[request_id] += result.as_numpy("text_output")[0].decode()
            reason = result.as_numpy("finish_reason")
            if reason is not None and reason.size:
                finished.add(request_id)
    finally:
        client.stop_stream()
        client.close()
    for index, prompt in enumerate(texts):
        assert texts_by_id[str(index)] == reference(prompt, 30), prompt


def test_stop_string_ends_the_answer_before_it(server: ServerProcess) -> None:
    prompt = "Stop me"
    full = reference(prompt, 30)
    stop = full[6:8]
    cut = full.index(stop)
    params = json.dumps({"temperature": 0, "stop": [stop]})
    body = {"text_input": prompt, "max_tokens": 30, "stream": True, "sampling_parameters": params}
    answer = httpx.post(generate_url(server, stream=True), json=body, timeout=30)
    got = events(answer)
    assert "".join(e["text_output"] for e in got) == full[:cut]
    assert got[-1]["finish_reason"] == "stop"


def test_seeded_sampling_repeats_and_differs_by_seed(server: ServerProcess) -> None:
    def sample(seed: int) -> str:
        params = json.dumps({"temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": seed})
        body = {"text_input": "Sample", "max_tokens": 30, "sampling_parameters": params,
                "exclude_input_in_output": True}  # fmt: skip
        answer = httpx.post(generate_url(server), json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["text_output"])

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


# --- scheduling ---------------------------------------------------------------------------


def test_late_request_gets_its_first_token_while_others_generate(server: ServerProcess) -> None:
    params = json.dumps({"temperature": 0, "ignore_eos": True})

    async def run() -> list[int]:
        counts = [0] * 6
        generating = asyncio.Event()
        async with httpx.AsyncClient(timeout=120) as client:

            async def long(index: int) -> None:
                body = {"text_input": f"Long one {index}", "max_tokens": 600, "stream": True,
                        "sampling_parameters": params}  # fmt: skip
                url = generate_url(server, stream=True)
                async with client.stream("POST", url, json=body) as answer:
                    async for line in answer.aiter_lines():
                        if line.startswith("data:"):
                            # Each response counts its own tokens.
                            counts[index] += json.loads(line[5:])["num_output_tokens"]
                            if min(counts) >= 5:
                                generating.set()

            tasks = [asyncio.create_task(long(i)) for i in range(len(counts))]
            await asyncio.wait_for(generating.wait(), 60)
            late = {"text_input": "Late", "max_tokens": 1, "sampling_parameters": GREEDY}
            answer = await client.post(generate_url(server), json=late)
            assert answer.status_code == 200, answer.text
            seen = list(counts)
            await asyncio.gather(*tasks)
            return seen

    seen = asyncio.run(run())
    # The late request was answered while every long one was still generating.
    assert max(seen) < 600, seen


def test_disconnect_frees_the_sequence_and_its_blocks(server: ServerProcess) -> None:
    aborted = metric(server, "vllm:request_success_total", finished_reason="abort")
    params = json.dumps({"temperature": 0, "ignore_eos": True})
    body = {"text_input": "Leave early", "max_tokens": 1000, "stream": True,
            "sampling_parameters": params}  # fmt: skip
    with httpx.stream("POST", generate_url(server, stream=True), json=body, timeout=30) as answer:
        lines = answer.iter_lines()
        generated = 0
        for line in lines:
            if line.startswith("data:"):
                generated += json.loads(line[5:])["num_output_tokens"]
            if generated >= 3:
                break
        assert metric(server, "vllm:kv_cache_usage_perc") > 0
    # The connection is closed: the engine drops the sequence at its next step.
    poll(
        lambda: (
            metric(server, "vllm:request_success_total", finished_reason="abort") == aborted + 1
        ),
        10,
        "the abort to be counted",
    )
    assert metric(server, "vllm:kv_cache_usage_perc") == 0
    assert metric(server, "vllm:num_requests_running") == 0


def test_sixty_four_long_requests_on_a_small_kv_budget(tmp_path: Path) -> None:
    # 32 blocks of 8 tokens: room for one full-length sequence, not for 64 long ones.
    llmrepo.write_tiny_llm(tmp_path, MODEL, {"kv_cache_blocks": "32", "max_num_seqs": "64"})
    texts = prompts(64, "Many")
    with running_server([tmp_path]) as server:

        async def run() -> list[list[int]]:
            async with httpx.AsyncClient(timeout=180) as client:

                async def one(prompt: str) -> list[int]:
                    params = json.dumps({"temperature": 0})
                    body = {"text_input": prompt, "max_tokens": 100, "sampling_parameters": params,
                            "exclude_input_in_output": True}  # fmt: skip
                    answer = await client.post(generate_url(server), json=body)
                    assert answer.status_code == 200, answer.text
                    return [int(i) for i in answer.json()["output_ids"]]

                return await asyncio.gather(*(one(p) for p in texts))

        answers = asyncio.run(run())
        assert metric(server, "vllm:num_preemptions_total") > 0
        # Each preemption is counted again on its request, once that finishes.
        per_request = metric(server, "vllm:request_num_preemptions_sum")
        assert per_request == metric(server, "vllm:num_preemptions_total")
        assert metric(server, "vllm:request_num_preemptions_count") == 64
        assert metric(server, "vllm:request_success_total", finished_reason="abort") == 0
        assert metric(server, "vllm:kv_cache_usage_perc") == 0
    for prompt, ids in zip(texts, answers, strict=True):
        assert llmrepo.reference_mismatch(prompt, ids, 100) is None, prompt


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_tokens": 4}, "text_input"),
        ({"text_input": "x" * 1100}, "maximum context length is 1024"),
        ({"text_input": "hi", "max_tokens": 1100}, "maximum context length is 1024"),
        ({"text_input": "hi", "sampling_parameters": '{"temperature": -1}'}, "temperature"),
        ({"text_input": "hi", "sampling_parameters": '{"top_p": 0}'}, "top_p"),
        ({"text_input": "hi", "sampling_parameters": '{"top_p": 1.5}'}, "top_p"),
        ({"text_input": "hi", "sampling_parameters": '{"temprature": 1}'}, "unknown key"),
        ({"text_input": "hi", "sampling_parameters": "not json"}, "not valid JSON"),
        ({"text_input": "hi", "parameters": {"temperature": "hot"}}, "temperature"),
        ({"text_input": "hi", "sampling_parameters": '{"n": 2}'}, "not supported"),
        # Would index the logits in a step shared with other requests (with min_tokens,
        # the sampler bans it before it may come).
        (
            {
                "text_input": "hi",
                "sampling_parameters": '{"stop_token_ids": [1000000], "min_tokens": 2}',
            },
            "outside the vocabulary",
        ),
        (
            {"text_input": "hi", "sampling_parameters": json.dumps({"stop_token_ids": [2**70]})},
            "outside the vocabulary",
        ),
        (
            {
                "text_input": "hi",
                "sampling_parameters": '{"stop": ' + "[" * 100_000 + "]" * 100_000 + "}",
            },
            "not valid JSON",
        ),
    ],
)
def test_bad_input_is_a_400(server: ServerProcess, body: dict[str, Any], message: str) -> None:
    for stream in (False, True):
        answer = httpx.post(generate_url(server, stream), json=body, timeout=30)
        assert answer.status_code == 400, answer.text
        assert message in answer.text


def test_unknown_model_is_a_404(server: ServerProcess) -> None:
    url = f"{server.base_url}/v2/models/nope/generate"
    answer = httpx.post(url, json={"text_input": "hi"}, timeout=30)
    assert answer.status_code == 404


def test_grpc_bad_sampling_values_are_invalid_argument(server: ServerProcess) -> None:
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put(error or result))
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"hi"], dtype=object))
        params = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        params.set_data_from_numpy(np.array([b'{"top_p": -2}'], dtype=object))
        client.async_stream_infer(MODEL, [text, params])
        error = results.get(timeout=30)
    finally:
        client.stop_stream()
        client.close()
    assert isinstance(error, InferenceServerException)
    # In a stream, Triton reports a request's error in the stream's response, with no
    # status code; the stream itself stays open.
    assert "top_p must be in (0, 1]" in str(error.message())


def test_grpc_stream_cancelled_frees_the_sequence(server: ServerProcess) -> None:
    aborted = metric(server, "vllm:request_success_total", finished_reason="abort")
    results: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: results.put(error or result))
        inputs = []
        for name, array, kind in (
            ("text_input", np.array([b"Cancel me"], dtype=object), "BYTES"),
            ("stream", np.array([True]), "BOOL"),
            ("max_tokens", np.array([1000], dtype=np.int32), "INT32"),
            ("sampling_parameters", np.array([b'{"ignore_eos": true}'], dtype=object), "BYTES"),
        ):
            tensor = grpcclient.InferInput(name, [1], kind)
            tensor.set_data_from_numpy(array)
            inputs.append(tensor)
        client.async_stream_infer(MODEL, inputs)
        first = results.get(timeout=30)
        assert not isinstance(first, InferenceServerException), first
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    poll(
        lambda: (
            metric(server, "vllm:request_success_total", finished_reason="abort") == aborted + 1
        ),
        10,
        "the cancelled request to be counted",
    )
    assert metric(server, "vllm:kv_cache_usage_perc") == 0
    assert metric(server, "vllm:num_requests_running") == 0


def generated_between_scrapes(
    server: ServerProcess, body: dict[str, Any]
) -> tuple[Exposition, Exposition, dict[str, Any]]:
    """One generate request between two scrapes of the metrics: before, after, the answer."""
    before = scrape(server.metrics_url)
    answer = httpx.post(generate_url(server), json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    return before, scrape(server.metrics_url), answer.json()


def test_generation_metrics_have_vllm_names_and_types(server: ServerProcess) -> None:
    body = {"text_input": "Count me", "max_tokens": 8, "sampling_parameters": GREEDY}
    before, after, answer = generated_between_scrapes(server, body)
    tokens = before.value("vllm:generation_tokens_total", model_name=MODEL)
    generated = answer["num_output_tokens"]
    assert after.value("vllm:generation_tokens_total", model_name=MODEL) == tokens + generated
    for name, kind in (
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:inter_token_latency_seconds", "histogram"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
        ("vllm:request_queue_time_seconds", "histogram"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:num_preemptions_total", "counter"),
        ("vllm:request_success_total", "counter"),
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("ge_serve_generation_step_seconds_total", "counter"),
        ("ge_serve_generation_graph_seconds_total", "counter"),
    ):
        assert after.types.get(name) == kind, (name, after.types.get(name))
    count = "vllm:time_to_first_token_seconds_count"
    assert after.value(count, model_name=MODEL) == before.value(count, model_name=MODEL) + 1
    itl = "vllm:inter_token_latency_seconds_count"
    assert after.value(itl, model_name=MODEL) == before.value(itl, model_name=MODEL) + generated - 1


def test_triton_vllm_backend_families_with_its_model_label(server: ServerProcess) -> None:
    """The families Triton's vLLM backend exports (src/utils/metrics.py), with its `model`
    label beside vLLM's `model_name`, counted per finished request as there."""
    body = {"text_input": "Triton names", "max_tokens": 6, "sampling_parameters": GREEDY}
    before, after, answer = generated_between_scrapes(server, body)
    prompt, generated = answer["num_input_tokens"], answer["num_output_tokens"]

    def grew(name: str) -> float:
        return after.value(name, model=MODEL, version="1") - before.value(name, model=MODEL)

    for name in (
        "vllm:time_per_output_token_seconds",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:request_params_n",
    ):
        assert after.types.get(name) == "histogram", (name, after.types.get(name))
    for name in ("request_prompt_tokens", "request_generation_tokens", "request_params_n"):
        assert grew(f"vllm:{name}_count") == 1, name
    assert grew("vllm:request_prompt_tokens_sum") == prompt
    assert grew("vllm:request_generation_tokens_sum") == generated
    assert grew("vllm:request_params_n_sum") == 1

    # Triton's buckets: 1-2-5 up to max_model_len (1024 here), 0.01 s to 2.5 s per token.
    def les(name: str) -> list[float]:
        return sorted(float(labels["le"]) for labels, _ in after.find(name, model=MODEL))

    assert les("vllm:request_prompt_tokens_bucket") == [
        1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, float("inf")
    ]  # fmt: skip
    tpot = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
    assert les("vllm:time_per_output_token_seconds_bucket") == [*tpot, float("inf")]
    assert grew("vllm:time_per_output_token_seconds_count") == generated - 1
    assert after.value("vllm:e2e_request_latency_seconds_count", model=MODEL) == after.value(
        "vllm:e2e_request_latency_seconds_count", model_name=MODEL
    )


def test_vllms_phase_max_tokens_and_step_token_families(server: ServerProcess) -> None:
    """vLLM's per-phase request times, its max_tokens histograms and tokens per step,
    counted for one request whose prompt no earlier one shares (no prefix-cache hit)."""
    body = {"text_input": "Zq phases 9", "max_tokens": 7, "sampling_parameters": GREEDY}
    before, after, answer = generated_between_scrapes(server, body)
    prompt, generated = answer["num_input_tokens"], answer["num_output_tokens"]

    def grew(name: str) -> float:
        return after.value(name, model_name=MODEL) - before.value(name, model_name=MODEL)

    phases = ("inference", "prefill", "decode")
    for phase in phases:
        name = f"vllm:request_{phase}_time_seconds"
        assert after.types.get(name) == "histogram", name
        assert grew(name + "_count") == 1, name
    # Admission to first token, then first to last: together, admission to last.
    inference, prefill, decode = (grew(f"vllm:request_{p}_time_seconds_sum") for p in phases)
    assert prefill > 0 and decode > 0
    assert prefill + decode == pytest.approx(inference, abs=1e-6)
    # vLLM's time per output token: the decode time over the tokens after the first.
    assert grew("vllm:request_time_per_output_token_seconds_count") == 1
    tpot = grew("vllm:request_time_per_output_token_seconds_sum")
    assert tpot == pytest.approx(decode / (generated - 1), abs=1e-6)
    assert grew("vllm:request_num_preemptions_count") == 1
    assert grew("vllm:request_num_preemptions_sum") == 0
    for name in ("vllm:request_max_num_generation_tokens", "vllm:request_params_max_tokens"):
        assert after.types.get(name) == "histogram", name
        assert grew(name + "_count") == 1, name
    assert grew("vllm:request_params_max_tokens_sum") == 7
    assert grew("vllm:request_max_num_generation_tokens_sum") == generated
    # vLLM's count: the prompt's tokens once, and each token sampled (the first, which
    # the prefill's step sampled, included), as its test_metrics_counts asserts.
    assert after.types.get("vllm:iteration_tokens_total") == "histogram"
    assert grew("vllm:iteration_tokens_total_sum") == prompt + generated
    assert grew("vllm:iteration_tokens_total_count") == grew("ge_serve_generation_steps_total")


def test_max_num_generation_tokens_counts_what_was_generated(server: ServerProcess) -> None:
    """vLLM observes the tokens a request generated (the most of its n choices) in
    `vllm:request_max_num_generation_tokens`, despite its help text, and the limit the
    request gave in `vllm:request_params_max_tokens`: a request that stops at its first
    token shows 1 and 7."""
    stop_all = json.dumps({"temperature": 0, "stop_token_ids": list(range(llmrepo.VOCAB))})
    body = {"text_input": "Zq short 3", "max_tokens": 7, "sampling_parameters": stop_all}
    before, after, answer = generated_between_scrapes(server, body)
    assert answer["num_output_tokens"] == 1

    def grew(name: str) -> float:
        return after.value(name, model_name=MODEL) - before.value(name, model_name=MODEL)

    assert grew("vllm:request_max_num_generation_tokens_count") == 1
    assert grew("vllm:request_max_num_generation_tokens_sum") == 1
    assert grew("vllm:request_params_max_tokens_sum") == 7


def test_report_custom_metrics_false_exports_no_vllm_series(tmp_path: Path) -> None:
    """Triton's vLLM backend's switch, read as ge-serve reads booleans (any case): false
    leaves the model's `vllm:` series out; Triton's own metrics stay."""
    llmrepo.write_tiny_llm(tmp_path, MODEL, {"REPORT_CUSTOM_METRICS": "False"})
    with running_server([tmp_path]) as server:
        body = {"text_input": "Quiet", "max_tokens": 4, "sampling_parameters": GREEDY}
        answer = httpx.post(generate_url(server), json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        text = httpx.get(server.metrics_url, timeout=10).text
    assert "nv_inference_count" in text
    assert [line for line in text.splitlines() if "vllm:" in line] == []


def test_placed_on_the_simulated_npu_answers_equal_the_reference(tmp_path: Path) -> None:
    llmrepo.write_tiny_llm(
        tmp_path,
        MODEL,
        {"placement": "npu", "max_num_seqs": "8", "max_num_batched_tokens": "64"},
    )
    texts = prompts(8, "NPU")
    with running_server([tmp_path], ["--device", "sim", "--sim-cost", "default"]) as server:

        async def run() -> list[str]:
            async with httpx.AsyncClient(timeout=120) as client:

                async def one(prompt: str) -> str:
                    body = {"text_input": prompt, "max_tokens": 20, "sampling_parameters": GREEDY,
                            "exclude_input_in_output": True}  # fmt: skip
                    answer = await client.post(generate_url(server), json=body)
                    assert answer.status_code == 200, answer.text
                    return str(answer.json()["text_output"])

                return await asyncio.gather(*(one(p) for p in texts))

        answers = asyncio.run(run())
        assert "tiny_llm' on npu0" in server.log()
    for prompt, answer in zip(texts, answers, strict=True):
        assert answer == reference(prompt, 20), prompt


def test_statistics_count_generation_time_as_compute(server: ServerProcess) -> None:
    """A generation counts as one execution of batch 1 (as Triton's Python backend counts
    an execute call of a vLLM model), so execution_count and last_inference move."""
    url = f"{server.base_url}/v2/models/{MODEL}/stats"
    old = httpx.get(url, timeout=10).json()["model_stats"][0]
    body = {"text_input": "Stats", "max_tokens": 12, "sampling_parameters": GREEDY}
    assert httpx.post(generate_url(server), json=body, timeout=30).status_code == 200
    new = httpx.get(url, timeout=10).json()["model_stats"][0]
    before, after = old["inference_stats"], new["inference_stats"]
    assert after["success"]["count"] == before["success"]["count"] + 1
    assert after["compute_infer"]["ns"] > before["compute_infer"]["ns"]
    assert new["execution_count"] == old["execution_count"] + 1
    assert new["inference_count"] == old["inference_count"] + 1
    assert new["last_inference"] > old["last_inference"]


# --- metric names -------------------------------------------------------------------------


def test_every_metric_family_is_documented(server: ServerProcess) -> None:
    """vLLM's families and the engine's own, beside Triton's: all in deploy/README.md or
    docs/generation.md, where deploy/README.md points for them."""
    body = {"text_input": "Documented", "parameters": {"max_tokens": 2, "temperature": 0}}
    response = httpx.post(generate_url(server), json=body, timeout=60)
    assert response.status_code == 200, response.text
    exposition = scrape(server.metrics_url)
    assert "vllm:time_to_first_token_seconds" in exposition.types
    names = documented(DEPLOY / "README.md", REPO_ROOT / "docs" / "generation.md")
    missing = undocumented(exposition, names)
    assert not missing, f"exported, but in neither document: {missing}"
