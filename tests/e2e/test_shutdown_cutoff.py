"""The real process under SIGTERM with requests that outlast `--exit-timeout-secs`: each is
answered with the server's error, the way its protocol says an error, before the
connections close; none is left with a text/plain 500, a stream cut mid-body or grpc
core's "Cancelling all calls". The process still exits soon after the exit timeout.

The generations are long, on a model whose steps take milliseconds, so that each takes
many times the exit timeout even on a fast host; the Python model sleeps a minute."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import numpy as np
import pymodels
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from polling import poll
from promtext import scrape
from serverproc import ServerProcess, start_server
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LLM = "tiny_llm"
EXIT_TIMEOUT_S = 1.0
# The exit timeout, then a margin for the answers, the unload and the exit, generous for
# a loaded machine: the point is that the process does not wait for the requests.
EXIT_WITHIN_S = EXIT_TIMEOUT_S + 15.0
# A generation of this many tokens takes many seconds on llmrepo.slow_model().
MAX_TOKENS = 2000
CUT_OFF = "Server is shutting down: the request did not finish within the exit timeout"
# What the log shows when the front end, not the server, ended the requests.
CANCELLED_BY_UVICORN = "timeout graceful shutdown exceeded"


def stopped_in_time(proc: ServerProcess, signalled: float) -> None:
    code = proc.process.wait(EXIT_WITHIN_S + 30)
    assert time.monotonic() - signalled < EXIT_WITHIN_S, proc.log()
    assert code == 0, proc.log()
    log = proc.log()
    assert CANCELLED_BY_UVICORN not in log
    assert "Traceback" not in log, log
    assert "still running at the exit timeout are ended UNAVAILABLE" in log


def gauge_reads(
    proc: ServerProcess, value: float, family: str, **labels: str
) -> Callable[[], bool]:
    """A poll condition: the metric `family` with `labels` reads `value`."""

    def reads() -> bool:
        found = scrape(proc.metrics_url).find(family, **labels)
        return bool(found) and found[0][1] == value

    return reads


def sse_data(lines: list[str]) -> list[str]:
    return [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]


@pytest.fixture
def llm_server(tmp_path: Path) -> Iterator[ServerProcess]:
    parameters = {"max_model_len": "2048", "kv_cache_blocks": "1024"}
    llmrepo.write_tiny_llm(tmp_path, LLM, parameters, llmrepo.slow_model())
    extra = ["--exit-timeout-secs", str(EXIT_TIMEOUT_S)]
    proc = start_server([tmp_path], extra, timeout=120.0)
    try:
        yield proc
    finally:
        proc.stop(signal.SIGKILL)


async def test_generations_running_at_the_exit_timeout_get_the_error_in_their_protocol(
    llm_server: ServerProcess,
) -> None:
    proc = llm_server
    chat = {
        "model": LLM,
        "messages": [{"role": "user", "content": "Tell me a long story"}],
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
    }
    first_events: list[asyncio.Event] = [asyncio.Event() for _ in range(3)]

    async def streamed(client: httpx.AsyncClient, url: str, body: Any, seen: int) -> list[str]:
        lines = []
        async with client.stream("POST", url, json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                lines.append(line)
                first_events[seen].set()
        return sse_data(lines)

    async def over_grpc() -> list[Any]:
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"Once upon a time"], dtype=np.object_))
        sampling = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
        parameters = {"max_tokens": MAX_TOKENS, "ignore_eos": True}
        sampling.set_data_from_numpy(np.array([json.dumps(parameters).encode()], np.object_))
        stream = grpcclient.InferInput("stream", [1], "BOOL")
        stream.set_data_from_numpy(np.array([True]))
        ended = asyncio.Event()

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": LLM, "inputs": [text, sampling, stream]}
            await ended.wait()  # the stream stays open until its answer ends

        client = grpcaio.InferenceServerClient(proc.grpc_url)
        got: list[Any] = []
        try:
            async for result, error in client.stream_infer(requests()):
                got.append(error if error is not None else result)
                first_events[2].set()
                if error is not None:
                    break
        finally:
            ended.set()
            await client.close()
        return got

    async with httpx.AsyncClient(base_url=proc.base_url, timeout=60) as client:
        whole = asyncio.create_task(client.post("/v1/chat/completions", json=chat))
        chat_stream = asyncio.create_task(
            streamed(client, "/v1/chat/completions", {**chat, "stream": True}, 0)
        )
        generate = {
            "text_input": "Once",
            "stream": True,
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
        }
        generate_stream = asyncio.create_task(
            streamed(client, f"/v2/models/{LLM}/generate_stream", generate, 1)
        )
        grpc_stream = asyncio.create_task(over_grpc())
        for event in first_events:
            await asyncio.wait_for(event.wait(), 60)

        all_running = gauge_reads(proc, 4, "vllm:num_requests_running", model_name=LLM)
        await asyncio.to_thread(poll, all_running, 30, "the four generations to run")
        signalled = time.monotonic()
        proc.process.send_signal(signal.SIGTERM)

        answer = await whole
        assert answer.status_code == 503, answer.text
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()["error"]
        assert error["type"] == "server_error"
        assert error["message"].startswith(CUT_OFF)

        # The chunks sent, then one error event ending the stream (docs/openai.md).
        events = await chat_stream
        assert len(events) > 1
        assert json.loads(events[0])["object"] == "chat.completion.chunk"
        last = json.loads(events[-1])
        assert last["error"]["type"] == "server_error", events[-3:]
        assert last["error"]["message"].startswith(CUT_OFF)

        events = await generate_stream
        assert "text_output" in json.loads(events[0])
        assert json.loads(events[-1])["error"].startswith(CUT_OFF), events[-3:]

        got = await grpc_stream
        assert got[0].as_numpy("text_output") is not None
        assert CUT_OFF in str(got[-1]), got[-1]
    await asyncio.to_thread(stopped_in_time, proc, signalled)


@pytest.mark.parametrize(
    "workers",
    [[], ["--http-workers", "1", "--grpc-workers", "1"]],
    ids=["in-process-front-ends", "worker-processes"],
)
async def test_a_model_execution_past_the_exit_timeout_is_answered_unavailable(
    tmp_path: Path, workers: list[str]
) -> None:
    """A Python model that sleeps: one request executing (over HTTP), one queued behind it
    (over gRPC). Neither is generation; both get the server's error."""
    pymodels.write(tmp_path / "repo", "sleeper")
    started = tmp_path / "started"
    proc = start_server([tmp_path / "repo"], ["--exit-timeout-secs", str(EXIT_TIMEOUT_S), *workers])
    try:
        body = {
            "parameters": {"started": str(started)},
            "inputs": [{"name": "IN", "shape": [1], "datatype": "FP32", "data": [60.0]}],
        }

        async def over_grpc() -> BaseException | None:
            client = grpcaio.InferenceServerClient(proc.grpc_url)
            value = grpcclient.InferInput("IN", [1], "FP32")
            value.set_data_from_numpy(np.array([60.0], np.float32))
            try:
                await client.infer("sleeper", [value], client_timeout=60)
            except Exception as exc:
                return exc
            finally:
                await client.close()
            return None

        queued = gauge_reads(proc, 1, "nv_inference_pending_request_count", model="sleeper")

        async with httpx.AsyncClient(base_url=proc.base_url, timeout=60) as client:
            executing = asyncio.create_task(client.post("/v2/models/sleeper/infer", json=body))
            await asyncio.to_thread(poll, started.exists, 30, "the first request to execute")
            waiting = asyncio.create_task(over_grpc())
            await asyncio.to_thread(poll, queued, 30, "the second request to queue")
            signalled = time.monotonic()
            proc.process.send_signal(signal.SIGTERM)

            answer = await executing
            assert answer.status_code == 503, answer.text
            assert answer.headers["content-type"] == "application/json"
            assert answer.json()["error"].startswith(CUT_OFF)
            error = await waiting
            assert isinstance(error, InferenceServerException), repr(error)
            assert error.status() == "StatusCode.UNAVAILABLE"
            assert CUT_OFF in str(error.message()), error
        await asyncio.to_thread(stopped_in_time, proc, signalled)
    finally:
        proc.stop(signal.SIGKILL)
