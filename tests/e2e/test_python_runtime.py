"""The Python model's runtime, as Triton's stub gives it, seen by a client of the real
server: the model's asyncio event loop lives across executes (tasks answer after execute
returned), `sys.argv`, BLS only in execute, and an async decoupled execute's exception
in the server's log."""

from __future__ import annotations

import concurrent.futures
import json
import queue
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pymodels
import pytest
import tritonclient.grpc as grpcclient
from polling import poll
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

_STRING_OUT = """
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

_INT_IN_OUT = """
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

# Default mode, async execute: each request is answered by a task 0.5 s after execute
# returned None (python_backend's qa/python_models/response_sender/model_async.py).
# A request with IN -1 starts a task that never ends: finalize cancels it.
ASYNC_POST = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.tasks = set()

    async def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            task = asyncio.create_task(self.later(sender, value))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return None

    async def later(self, sender, value):
        if int(value[0]) == -1:
            sender.send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                print("async_post: a task still pending was cancelled at finalize", flush=True)
                raise
        await asyncio.sleep(0.5)
        sender.send(
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value + 1)]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def finalize(self):
        print(f"async_post: finalize with {len(self.tasks)} task(s) pending", flush=True)
"""

# python_backend's qa/python_models/async_execute_decouple/model.py, shortened: a
# negative WAIT_SECONDS sends the final flag, then raises.
ASYNC_DECOUPLED = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        senders = []
        waits = []
        for request in requests:
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT_SECONDS").as_numpy()
            if wait[0][0] < 0:
                for each in requests:
                    each.get_response_sender().send(
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    )
                raise ValueError("wait_secs cannot be negative")
            waits.append(asyncio.create_task(asyncio.sleep(float(wait[0][0]))))
            senders.append(request.get_response_sender())
        await asyncio.gather(*waits)
        for sender in senders:
            out = pb_utils.Tensor("DUMMY_OUT", np.array([0], np.float32))
            sender.send(
                pb_utils.InferenceResponse([out]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        return None
"""
_ASYNC_DECOUPLED_CONFIG = """
model_transaction_policy { decoupled: true }
input [ { name: "WAIT_SECONDS" data_type: TYPE_FP32 dims: [ 1, 1 ] } ]
output [ { name: "DUMMY_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""

# sys.argv as the model sees it, and a unittest run the way python_backend's qa models run
# theirs (`unittest.main("model", exit=False)` reads sys.argv).
ARGV = """
import json
import sys
import unittest

import numpy as np
import triton_python_backend_utils as pb_utils


class ArgvTest(unittest.TestCase):
    def test_nothing(self):
        self.assertTrue(True)


class TritonPythonModel:
    def execute(self, requests):
        test = unittest.main("model", exit=False)
        facts = {"argv": sys.argv, "ran": test.result.testsRun, "ok": test.result.wasSuccessful()}
        text = np.array([json.dumps(facts)], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", text)]) for _ in requests]
"""


# python_backend's qa/python_models/bls_init_error and bls_finalize_error: BLS in
# initialize (or finalize), to a model that need not exist.
BLS_OUTSIDE_EXECUTE = """
import numpy as np
import triton_python_backend_utils as pb_utils


def call():
    tensor = pb_utils.Tensor("IN", np.array([1], np.int32))
    request = pb_utils.InferenceRequest(
        model_name="square_int32", inputs=[tensor], requested_output_names=["OUT"]
    )
    request.exec(decoupled=True)


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_name"]
        if self.name == "bls_init_error":
            call()

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]
            )
            for r in requests
        ]

    def finalize(self):
        if self.name == "bls_finalize_error":
            call()
"""

MODELS = {
    "async_post": (ASYNC_POST, _INT_IN_OUT),
    "async_execute_decouple": (ASYNC_DECOUPLED, _ASYNC_DECOUPLED_CONFIG),
    "argv": (ARGV, _STRING_OUT),
    "bls_init_error": (BLS_OUTSIDE_EXECUTE, _INT_IN_OUT),
    "bls_finalize_error": (BLS_OUTSIDE_EXECUTE, _INT_IN_OUT),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("python-runtime")
    pymodels.write_models(repo, MODELS)
    with running_server([repo], ["--model-control-mode=explicit"]) as proc:
        yield proc


def load(server: ServerProcess, model: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v2/repository/models/{model}/load", timeout=60)


def unload(server: ServerProcess, model: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v2/repository/models/{model}/unload", timeout=60)


def infer(server: ServerProcess, model: str, value: int) -> httpx.Response:
    return pymodels.infer_in(server.base_url, model, value, 20)


def test_tasks_an_async_execute_started_answer_after_it_returned(server: ServerProcess) -> None:
    assert load(server, "async_post").status_code == 200
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda k: infer(server, "async_post", k), range(4)))
    for k, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [k + 1]


def test_finalize_cancels_the_tasks_still_pending_and_the_model_unloads(
    server: ServerProcess,
) -> None:
    assert load(server, "async_post").status_code == 200
    answer = infer(server, "async_post", -1)  # answered; its task then waits an hour
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [-1]
    assert unload(server, "async_post").status_code == 200

    def unloaded() -> bool:
        return "async_post: a task still pending was cancelled at finalize" in server.log()

    poll(unloaded, timeout=20, interval=0.2)
    log = server.log()
    assert "async_post: finalize with 1 task(s) pending" in log
    assert "Task was destroyed but it is pending" not in log


def _stream(server: ServerProcess, wait: float) -> list[Any]:
    """What one streamed request to async_execute_decouple gets, until its final flag."""
    answers: queue.Queue[Any] = queue.Queue()
    tensor = grpcclient.InferInput("WAIT_SECONDS", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.full([1, 1], wait, np.float32))
    got: list[Any] = []
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: answers.put(error or result))
        client.async_stream_infer(
            "async_execute_decouple", [tensor], enable_empty_final_response=True
        )
        while True:
            one = answers.get(timeout=20)
            got.append(one)
            if not isinstance(one, grpcclient.InferResult):
                break
            final = one.get_response().parameters["triton_final_response"].bool_param
            if final:
                break
        client.stop_stream()
    return got


def test_an_async_decoupled_execute_still_runs_in_the_background(server: ServerProcess) -> None:
    assert load(server, "async_execute_decouple").status_code == 200
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        streams = list(pool.map(lambda _: _stream(server, 1.0), range(3)))
    for got in streams:
        assert isinstance(got[0], grpcclient.InferResult)
        assert got[0].as_numpy("DUMMY_OUT").tolist() == [0.0]


def test_the_model_sees_sys_argv_as_under_triton_and_unittest_main_runs(
    server: ServerProcess,
) -> None:
    assert load(server, "argv").status_code == 200
    answer = infer(server, "argv", 1)
    assert answer.status_code == 200, answer.text
    facts = json.loads(answer.json()["outputs"][0]["data"][0])
    assert facts == {"argv": [""], "ran": 1, "ok": True}


_BLS_REFUSED = "BLS is only supported during the 'execute' function."


def test_bls_in_initialize_fails_the_load(server: ServerProcess) -> None:
    refused = load(server, "bls_init_error")
    assert refused.status_code == 400, refused.text
    assert (
        "Failed to initialize Python stub: TritonModelException: " + _BLS_REFUSED
        in (refused.json()["error"])
    )


def test_bls_in_finalize_is_refused_and_logged(server: ServerProcess) -> None:
    assert load(server, "bls_finalize_error").status_code == 200
    assert infer(server, "bls_finalize_error", 3).json()["outputs"][0]["data"] == [3]
    assert unload(server, "bls_finalize_error").status_code == 200
    poll(lambda: _BLS_REFUSED in server.log(), timeout=20, interval=0.2)


def test_an_async_decoupled_execute_that_raises_after_its_final_flag_is_logged(
    server: ServerProcess,
) -> None:
    assert load(server, "async_execute_decouple").status_code == 200
    got = _stream(server, -1.0)
    assert len(got) == 1 and isinstance(got[0], grpcclient.InferResult)
    assert got[0].as_numpy("DUMMY_OUT") is None

    def logged() -> bool:
        return "ValueError: wait_secs cannot be negative" in server.log()

    poll(logged, timeout=10, interval=0.2)
    log = server.log()
    assert "Traceback (most recent call last):" in log
    assert "in execute" in log
