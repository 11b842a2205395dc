"""vLLM's request `priority` on /v1 (and its `X-Vllm-Priority` header) reaching the `llm`
engine, whose `scheduling_policy` "priority" serves the waiting requests lowest priority
first, where "fcfs" serves them as they came. The tiny model runs one sequence at a time
(max_num_seqs 1); the engine's thread is held inside chosen steps (`Gate`), so the order
is the engine's, never a race."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import llmrepo
import numpy as np
import numpy.typing as npt
import pytest
import pytest_asyncio
from openai_inprocess import error, openai_app

from ge_serve.backends.llm.backend import MODEL_KEY, LlmModel
from ge_serve.backends.llm.runner import RowWork
from ge_serve.scheduler.work import Array, WorkItem
from ge_serve.server.inference.core import InferenceServer

pytest.importorskip("tokenizers", reason="tokenizers is not installed (runtime dependency)")
pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="module")]

ONE_AT_A_TIME = {"max_num_seqs": "1", "enable_prefix_caching": "false"}
SHORT: dict[str, Any] = {"max_tokens": 2, "temperature": 0, "ignore_eos": True}
HELD_S = 30.0


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openai-priority")
    llmrepo.write_tiny_llm(folder, "ranked", {**ONE_AT_A_TIME, "scheduling_policy": "priority"})
    llmrepo.write_tiny_llm(folder, "fcfs", ONE_AT_A_TIME)
    return folder


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app(repo: Path) -> AsyncIterator[tuple[httpx.AsyncClient, InferenceServer]]:
    async with openai_app(repo, ["ranked", "fcfs"]) as found:
        yield found


def marker(letter: str) -> int:
    """The token of `letter`, which only one request's prompt holds."""
    return llmrepo.prompt_ids(letter)[0]


class Gate:
    """Holds the engine's thread before the step that prefills a prompt holding a held
    marker token, until the test opens it."""

    def __init__(self, model: LlmModel) -> None:
        self._runner = model.runner
        self._run = model.runner.run
        self._opened: dict[int, threading.Event] = {}
        self.reached: dict[int, threading.Event] = {}
        setattr(self._runner, "run", self.run)  # noqa: B010 (a method, replaced)

    def hold(self, letter: str) -> None:
        token = marker(letter)
        self.reached[token], self._opened[token] = threading.Event(), threading.Event()

    def open(self, letter: str) -> None:
        self._opened[marker(letter)].set()

    async def reaches(self, letter: str) -> None:
        assert await asyncio.to_thread(self.reached[marker(letter)].wait, HELD_S), letter

    def close(self) -> None:
        for opened in self._opened.values():
            opened.set()
        setattr(self._runner, "run", self._run)  # noqa: B010

    def run(
        self, rows: Sequence[RowWork], chunk_rows: Sequence[RowWork] = (), hidden: bool = False
    ) -> npt.NDArray[np.float32]:
        for token, opened in list(self._opened.items()):
            if any(token in row.tokens for row in chunk_rows):
                self.reached[token].set()
                opened.wait(HELD_S)
        return self._run(rows, chunk_rows, hidden)


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll the engine's own count until it holds (bounded)."""
    deadline = time.monotonic() + HELD_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.005)


async def finished(task: Awaitable[httpx.Response]) -> dict[str, Any]:
    response = await asyncio.wait_for(task, HELD_S)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


@pytest.mark.parametrize(("name", "first", "last"), [("ranked", "C", "B"), ("fcfs", "B", "C")])
async def test_a_later_high_priority_request_is_served_first(
    app: tuple[httpx.AsyncClient, InferenceServer], name: str, first: str, last: str
) -> None:
    http, core = app
    version = core.model(name)
    scheduler = version.scheduler
    gate = Gate(version.loaded.extra[MODEL_KEY])
    try:
        gate.hold("A")
        held = asyncio.create_task(
            http.post("/v1/completions", json={"model": name, "prompt": "AAAA", **SHORT})
        )
        await gate.reaches("A")  # A runs, and holds the one place
        # B, priority 5, comes before C, whose header's -1 beats its body's 100.
        low = asyncio.create_task(
            http.post(
                "/v1/completions", json={"model": name, "prompt": "BBBB", "priority": 5, **SHORT}
            )
        )
        await until(lambda: scheduler.pending == 1, "B queued")
        chat = {"model": name, "messages": [{"role": "user", "content": "CCCC"}]}
        high = asyncio.create_task(
            http.post(
                "/v1/chat/completions",
                json={**chat, "priority": 100, **SHORT},
                headers={"X-Vllm-Priority": "-1"},
            )
        )
        await until(lambda: scheduler.pending == 2, "C queued")
        gate.hold(last)  # whichever comes second is held before its first step
        gate.open("A")
        await finished(held)
        tasks = {"B": low, "C": high}
        # The first finishes while the engine holds the other one, already admitted.
        await finished(tasks[first])
        await gate.reaches(last)
        assert not tasks[last].done()
        gate.open(last)
        await finished(tasks[last])
    finally:
        gate.close()


class Recorder:
    """The `sampling_parameters` of each request the model's engine is handed."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler, self.submit = scheduler, scheduler.submit
        self.sent: list[dict[str, Any]] = []
        setattr(scheduler, "submit", self.record)  # noqa: B010

    async def record(self, item: WorkItem) -> dict[str, Array]:
        raw = item.inputs.get("sampling_parameters")
        self.sent.append({} if raw is None else json.loads(raw.reshape(-1)[0]))
        found: dict[str, Array] = await self.submit(item)
        return found

    def close(self) -> None:
        setattr(self.scheduler, "submit", self.submit)  # noqa: B010


CHAT = {"model": "fcfs", "messages": [{"role": "user", "content": "hi"}], **SHORT}
ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"model": "fcfs", "prompt": "hi", **SHORT}),
    ("/v1/chat/completions/batch", {**CHAT, "messages": [CHAT["messages"]] * 2}),
    ("/v1/responses", {"model": "fcfs", "input": "hi", "max_output_tokens": 2, "temperature": 0}),
]


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_every_generation_route_passes_the_priority_on(
    app: tuple[httpx.AsyncClient, InferenceServer], path: str, body: dict[str, Any]
) -> None:
    http, core = app
    recorder = Recorder(core.model("fcfs").scheduler)
    try:
        # Once refused ("only 0"); served now, also by the fcfs engine, which ignores it.
        response = await http.post(path, json={**body, "priority": 5})
        assert response.status_code == 200, response.text
        response = await http.post(
            path, json={**body, "priority": 5}, headers={"x-vllm-priority": "-3"}
        )
        assert response.status_code == 200, response.text
        # A header that is no integer leaves the body's; 0, the default, is not sent.
        response = await http.post(path, json=body, headers={"x-vllm-priority": "soon"})
        assert response.status_code == 200, response.text
    finally:
        recorder.close()
    per_request = 2 if path.endswith("batch") else 1
    found = [sent.get("priority") for sent in recorder.sent]
    assert found == [5] * per_request + [-3] * per_request + [None] * per_request


@pytest.mark.parametrize(
    ("body", "headers"),
    [({"priority": 2**63}, {}), ({"priority": -(2**63) - 1}, {}),
     ({}, {"X-Vllm-Priority": str(2**63)})],
)  # fmt: skip
async def test_a_priority_past_64_bits_is_a_400(
    app: tuple[httpx.AsyncClient, InferenceServer], body: dict[str, Any], headers: dict[str, str]
) -> None:
    http, _ = app
    response = await http.post("/v1/chat/completions", json={**CHAT, **body}, headers=headers)
    assert error(response)["param"] == "priority"


async def test_the_messages_route_passes_the_header_on(
    app: tuple[httpx.AsyncClient, InferenceServer],
) -> None:
    http, core = app
    body = {"model": "fcfs", "messages": CHAT["messages"], "max_tokens": 2, "temperature": 0}
    recorder = Recorder(core.model("fcfs").scheduler)
    try:
        response = await http.post("/v1/messages", json=body, headers={"x-vllm-priority": "-3"})
        assert response.status_code == 200, response.text
        # vLLM's Messages request has no `priority`: the body's is ignored, as vLLM's.
        response = await http.post("/v1/messages", json={**body, "priority": 5})
        assert response.status_code == 200, response.text
    finally:
        recorder.close()
    assert [sent.get("priority") for sent in recorder.sent] == [-3, None]
    past = await http.post("/v1/messages", json=body, headers={"X-Vllm-Priority": str(2**63)})
    assert past.status_code == 400, past.text
    assert "X-Vllm-Priority" in past.json()["error"]["message"]
