"""The Python backend in process: real worker processes, the lifecycle and the core, no
network. Models are tests/pymodels.py's (the python_backend examples' behaviour)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pymodels
import pytest
from polling import poll

from ge_serve.backends.config_json import config_to_json
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.backends.python.host.backend import PythonBackend
from ge_serve.backends.python.host.instance import PythonInstance
from ge_serve.scheduler.factory import SchedulerOptions
from ge_serve.server.app import make_scheduler
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.bls import CoreBridge
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.reports import ModelState, RepositoryEntry
from ge_serve.server.inference.types import (
    DataType,
    InferRequest,
    InferResponse,
    RequestedOutput,
    Tensor,
)
from ge_serve.server.models.lifecycle import LifecycleSettings, ModelLifecycle
from ge_serve.server.models.repository import ModelRepository

pytestmark = pytest.mark.timeout(120)


@dataclass
class Served:
    core: InferenceServer
    lifecycle: ModelLifecycle
    python: PythonBackend


async def serve(
    repo: Path,
    names: list[str],
    delay_count: int = 0,
    errors: dict[str, str] | None = None,
    unload_timeout_s: float = 10.0,
    backend_directory: Path | None = None,
    autocomplete: bool = True,
) -> Served:
    """The models loaded (each must load, unless `errors` is given: it gets the reasons)."""
    python = PythonBackend(backend_directory=backend_directory)
    lifecycle = ModelLifecycle(
        ModelRepository([repo]),
        {"onnxruntime": OnnxRuntimeBackend(), "python": python},
        functools.partial(make_scheduler, options=SchedulerOptions(delay_count=delay_count)),
        LifecycleSettings(unload_timeout_s=unload_timeout_s, autocomplete=autocomplete),
    )
    lifecycle.on_retired.append(lambda model: python.retire(model.loaded))
    core = InferenceServer(lifecycle)
    python.attach_core(CoreBridge(core, asyncio.get_running_loop()))
    failed = await lifecycle.load_many(names)
    if errors is None:
        assert failed == {}, failed
    else:
        errors.update(failed)
    return Served(core, lifecycle, python)


async def load_error(repo: Path, name: str, **options: Any) -> str:
    """Why the model cannot load (`options`: serve()'s)."""
    errors: dict[str, str] = {}
    found = await serve(repo, [name], errors=errors, **options)
    await found.lifecycle.close()
    found.python.close()
    return errors[name]


Open = Callable[..., Awaitable[Served]]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Open]:
    """`await served(*model names, delay_count=0)`: those models loaded; closed after."""
    opened: list[Served] = []

    async def open_(*names: str, delay_count: int = 0) -> Served:
        pymodels.write(tmp_path, *names)
        found = await serve(tmp_path, list(names), delay_count)
        opened.append(found)
        return found

    try:
        yield open_
    finally:
        for found in opened:
            await found.lifecycle.close()
            found.python.close()


def tensor(name: str, data: np.ndarray) -> Tensor:
    if data.dtype == object:
        return Tensor(name, DataType.BYTES, data.shape, data)
    return Tensor(name, DataType.from_numpy(data.dtype), data.shape, data)


def request(model: str, **inputs: np.ndarray) -> InferRequest:
    return InferRequest(model, inputs=[tensor(k, v) for k, v in inputs.items()])


def outputs(response: InferResponse) -> dict[str, np.ndarray]:
    return {t.name: t.data for t in response.outputs}


def add_sub_inputs(rows: int | None = None) -> dict[str, np.ndarray]:
    shape = (4,) if rows is None else (rows, 4)
    a = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return {"INPUT0": a, "INPUT1": np.full(shape, 0.5, np.float32)}


def workers_of(served: Served, model: str) -> list[int]:
    version = served.lifecycle.get(model)
    pids = []
    for executor in version.loaded.executors:
        assert isinstance(executor, PythonInstance)
        assert executor.worker is not None
        pids.append(executor.worker.pid)
    return pids


async def wait_state(
    lifecycle: ModelLifecycle, model: str, state: ModelState, within_s: float
) -> RepositoryEntry:
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        rows = [r for r in lifecycle.index() if r.name == model]
        if rows and rows[0].state is state:
            return rows[0]
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{model} never became {state}: {rows}")
        await asyncio.sleep(0.02)


# --- lifecycle and the pb_utils basics -------------------------------------------------------


async def test_add_sub_answers_and_initialize_gets_tritons_args(served: Open) -> None:
    found = await served("add_sub", "introspect")
    inputs = add_sub_inputs()
    response = await found.core.infer(request("add_sub", **inputs))
    got = outputs(response)
    np.testing.assert_allclose(got["OUTPUT0"], inputs["INPUT0"] + 0.5)
    np.testing.assert_allclose(got["OUTPUT1"], inputs["INPUT0"] - 0.5)
    assert got["OUTPUT0"].dtype == np.float32 and response.model_version == "1"

    probe = request("introspect", IN=np.array([7], np.int32))
    probe.id = "req-9"
    probe.parameters = {"flavour": "mild", "n": 3}
    facts = json.loads(outputs(await found.core.infer(probe))["FACTS"][0])
    args = facts["args"]
    assert set(args) == {
        "model_config", "model_instance_kind", "model_instance_name",
        "model_instance_device_id", "model_repository", "model_version", "model_name",
    }  # fmt: skip
    config = json.loads(args["model_config"])
    assert config["name"] == "introspect" and config["backend"] == "python"
    assert config["parameters"] == {"custom_key": {"string_value": "custom_value"}}
    assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] in ("probe_0", "probe_1")
    assert Path(args["model_repository"]).name == "introspect"
    assert (args["model_version"], args["model_name"]) == ("1", "introspect")
    assert facts["request_id"] == "req-9"
    assert facts["parameters"] == {"flavour": "mild", "n": 3}
    assert facts["requested"] == ["FACTS"] and facts["cancelled"] is False
    # Each instance is a process of its own, none of them the server.
    pids = workers_of(found, "introspect")
    assert len(set(pids)) == 2 and os.getpid() not in pids and facts["pid"] in pids


async def test_without_dynamic_batching_each_request_executes_alone(served: Open) -> None:
    # max_batch_size 8 and no dynamic_batching: as in Triton, no batcher is added, so the
    # scheduler hold (delay_count) that would merge all three does not apply either.
    found = await served("add_sub_unbatched", delay_count=3)
    assert "dynamic_batching" not in config_to_json(found.core.model_config("add_sub_unbatched"))
    sent = [add_sub_inputs(rows) for rows in (1, 2, 1)]
    responses = await asyncio.gather(
        *(found.core.infer(request("add_sub_unbatched", **inputs)) for inputs in sent)
    )
    for inputs, response in zip(sent, responses, strict=True):
        got = outputs(response)
        rows = inputs["INPUT0"].shape[0]
        np.testing.assert_array_equal(got["REQUESTS"], np.full((rows, 1), 1, np.int32))


async def test_dynamic_batching_hands_execute_each_request(served: Open) -> None:
    found = await served("add_sub_batch", delay_count=3)
    sizes = [1, 2, 1]
    sent = [add_sub_inputs(rows) for rows in sizes]
    responses = await asyncio.gather(
        *(found.core.infer(request("add_sub_batch", **inputs)) for inputs in sent)
    )
    for inputs, response, rows in zip(sent, responses, sizes, strict=True):
        got = outputs(response)
        # One execute() got all three requests, each with its own rows.
        np.testing.assert_array_equal(got["REQUESTS"], np.full((rows, 1), 3, np.int32))
        np.testing.assert_allclose(got["OUTPUT0"], inputs["INPUT0"] + 0.5)
        assert got["OUTPUT0"].shape == (rows, 4)
    stats = found.core.statistics("add_sub_batch")[0]
    assert stats.inference_count == 4 and stats.execution_count == 1


async def test_a_response_that_cannot_be_read_fails_only_its_request(
    served: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = await served("add_sub_batch", delay_count=3)
    (instance,) = found.lifecycle.get("add_sub_batch").loaded.executors
    assert isinstance(instance, PythonInstance) and instance.worker is not None
    worker = instance.worker
    read = worker.read_tensors
    calls: list[int] = []

    def first_fails(tensors: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("the region is gone")
        return read(tensors)

    monkeypatch.setattr(worker, "read_tensors", first_fails)
    answers = await asyncio.gather(
        *(found.core.infer(request("add_sub_batch", **add_sub_inputs(1))) for _ in range(3)),
        return_exceptions=True,
    )
    failed = [a for a in answers if isinstance(a, ServerError)]
    assert len(failed) == 1 and failed[0].code is ErrorCode.INTERNAL
    assert "the model's response could not be read: the region is gone" in failed[0].message
    assert sum(isinstance(a, InferResponse) for a in answers) == 2
    # Every request of the batch was finished: none is left waiting on the worker.
    assert instance.pending == {}
    assert found.core.statistics("add_sub_batch")[0].execution_count == 1


async def test_tensors_larger_than_a_segment_cross_both_ways(served: Open) -> None:
    found = await served("echo")
    for size in (5, 6_000_000, 3, 6_000_000):  # 24 MB: past the first 16 MiB segment
        given = np.arange(size, dtype=np.float32)
        got = outputs(await found.core.infer(request("echo", IN=given)))
        np.testing.assert_array_equal(got["OUT"], given)
        assert got["TEXT"][:3].tolist() == [b"0.0", b"1.0", b"2.0"]


async def test_a_model_error_fails_only_its_request(served: Open) -> None:
    found = await served("failing")

    async def send(value: int) -> InferResponse:
        return await found.core.infer(request("failing", IN=np.array([value], np.int32)))

    with pytest.raises(ServerError) as raised:
        await send(1)
    assert raised.value.code is ErrorCode.INTERNAL
    message = raised.value.message
    assert message.startswith(
        "Failed to process the request(s) for model instance 'failing_0', message: "
        "TritonModelException: the model refused this batch"
    )
    assert "model.py(" in message and "stub.py" not in message
    with pytest.raises(ServerError) as raised:
        await send(2)
    assert (raised.value.code, raised.value.message) == (ErrorCode.NOT_FOUND, "no such thing")
    with pytest.raises(ServerError, match="do not match the number of InferenceRequest"):
        await send(4)
    np.testing.assert_array_equal(outputs(await send(5))["OUT"], [5])
    stats = found.core.statistics("failing")[0].inference_stats
    assert stats.success.count == 1 and stats.fail.count == 3


async def test_a_worker_that_dies_fails_its_request_and_comes_back(served: Open) -> None:
    found = await served("failing", "add_sub")
    before = workers_of(found, "failing")
    with pytest.raises(ServerError) as raised:
        await found.core.infer(request("failing", IN=np.array([3], np.int32)))
    assert raised.value.code is ErrorCode.UNAVAILABLE
    assert "model instance 'failing_0' of 'failing' failed" in raised.value.message
    # Triton's words first (python_be.cc), which qa's restart test reads.
    assert raised.value.message.startswith("Stub process 'failing_0' is not healthy. ")
    assert "exited with code 7" in raised.value.message
    row = next(r for r in found.lifecycle.index() if r.name == "failing")
    if row.state is ModelState.UNAVAILABLE:  # it may already be back on a fast machine
        assert "is restarting" in row.reason and "exited with code 7" in row.reason
    # The other model never noticed.
    await found.core.infer(request("add_sub", **add_sub_inputs()))
    await wait_state(found.lifecycle, "failing", ModelState.READY, 30)
    response = await found.core.infer(request("failing", IN=np.array([5], np.int32)))
    np.testing.assert_array_equal(outputs(response)["OUT"], [5])
    assert workers_of(found, "failing") != before


async def test_unload_runs_finalize_and_leaves_no_worker(
    served: Open, capfd: pytest.CaptureFixture[str]
) -> None:
    found = await served("add_sub")
    pids = workers_of(found, "add_sub")
    await found.lifecycle.unload("add_sub")
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in pids
    )
    assert "add_sub finalized" in capfd.readouterr().out


def _running(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)  # psutil: untyped
    except psutil.NoSuchProcess:
        return False


async def test_a_hung_model_holds_only_its_own_requests(tmp_path: Path) -> None:
    pymodels.write(tmp_path, "hanger", "add_sub")
    found = await serve(tmp_path, ["hanger", "add_sub"], unload_timeout_s=0.5)
    try:
        pid = workers_of(found, "hanger")[0]
        started = tmp_path / "started"
        hang = request("hanger", IN=np.array([1], np.int32))
        hang.parameters = {"started": str(started)}
        stuck = asyncio.ensure_future(found.core.infer(hang))
        await asyncio.to_thread(poll, started.exists, 10, "the model to start executing")
        assert not stuck.done()
        # Everything else goes on.
        await found.core.infer(request("add_sub", **add_sub_inputs()))
        # Unloading ends the worker its execute holds, and the request learns why.
        await found.lifecycle.unload("hanger")
        with pytest.raises(ServerError, match="was killed by SIGKILL"):
            await asyncio.wait_for(stuck, 10)
        assert not _running(pid)
    finally:
        await found.lifecycle.close()
        found.python.close()


async def test_a_model_that_cannot_import_is_refused_with_the_reason(tmp_path: Path) -> None:
    pymodels.write(tmp_path, "broken_import")
    reason = await load_error(tmp_path, "broken_import")
    assert "Failed to initialize Python stub: ModuleNotFoundError: No module named" in reason
    assert "no_such_module_anywhere" in reason and "model.py(1)" in reason


async def test_a_model_whose_config_lists_no_outputs_loads_and_answers(tmp_path: Path) -> None:
    # Triton's Python backend loads it (qa L0_lifecycle's identity_fp32 stand-in).
    folder = tmp_path / "no_outputs"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        'backend: "python"\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    (folder / "1" / "model.py").write_text(
        "import triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        return [pb_utils.InferenceResponse([]) for _ in requests]\n"
    )
    found = await serve(tmp_path, ["no_outputs"])
    try:
        response = await found.core.infer(
            request("no_outputs", INPUT0=np.ones(1, dtype=np.float32))
        )
        assert response.outputs == []
    finally:
        await found.lifecycle.close()
        found.python.close()


async def test_a_default_mode_model_may_answer_through_its_response_sender(
    served: Open, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="ge_serve.backends.python.model")
    found = await served("sender")
    responses = await asyncio.gather(
        *(found.core.infer(request("sender", IN=np.array([v], np.int32))) for v in (1, 5))
    )
    assert [outputs(r)["OUT"].tolist() for r in responses] == [[2], [6]]
    assert any(
        "Non-decoupled model cannot send more than one response" in r.getMessage()
        for r in caplog.records
    )


# --- decoupled --------------------------------------------------------------------------------


async def collect(core: InferenceServer, req: InferRequest) -> list[InferResponse]:
    return [r async for r in core.infer_responses(req)]


async def test_a_stream_closed_at_its_final_response_is_a_success(served: Open) -> None:
    # A gRPC stream cancelled, or an SSE client gone, just as the last response went out:
    # the request was answered in full, and counts as answered, not cancelled.
    found = await served("once")
    responses = found.core.infer_responses(request("once", IN=np.array([7], np.int32)))
    final = await anext(responses)
    assert final.final and outputs(final)["OUT"].tolist() == [14]
    await responses.aclose()
    # Counted once released (its execute returned), which takes a moment.
    for _ in range(1000):
        stats = found.core.statistics("once")[0].inference_stats
        if stats.success.count + stats.fail.count:
            break
        await asyncio.sleep(0.02)
    assert (stats.success.count, stats.fail.count) == (1, 0)


async def test_decoupled_models_stream_any_number_of_responses(served: Open) -> None:
    found = await served("square", "repeat")
    answers = await collect(found.core, request("square", IN=np.array([3], np.int32)))
    assert [outputs(a)["OUT"].tolist() for a in answers] == [[3], [3], [3]]
    assert await collect(found.core, request("square", IN=np.array([0], np.int32))) == []
    repeat = request(
        "repeat",
        IN=np.array([4, 2, 0, 1], np.int32),
        DELAY=np.array([1, 2, 3, 4], np.uint32),
        WAIT=np.array([5], np.uint32),
    )
    repeat.outputs = [RequestedOutput("OUT"), RequestedOutput("IDX")]
    answers = await collect(found.core, repeat)
    assert [outputs(a)["OUT"].tolist() for a in answers] == [[4], [2], [0], [1]]
    assert [outputs(a)["IDX"].tolist() for a in answers] == [[0], [1], [2], [3]]
    with pytest.raises(ServerError) as raised:
        await found.core.infer(request("square", IN=np.array([1], np.int32)), "HTTP end point")
    assert raised.value.code is ErrorCode.UNSUPPORTED
    assert raised.value.message == (
        "HTTP end point doesn't support models with decoupled transaction policy"
    )


# --- BLS --------------------------------------------------------------------------------------


async def test_bls_calls_go_through_the_core(served: Open) -> None:
    found = await served("bls", "add_sub", "add_sub_copy", "bls_async")
    inputs = add_sub_inputs()
    name = np.array([b"add_sub"], dtype=object)
    got = outputs(await found.core.infer(request("bls", MODEL_NAME=name, **inputs)))
    np.testing.assert_allclose(got["OUTPUT0"], inputs["INPUT0"] + 0.5)
    np.testing.assert_allclose(got["OUTPUT1"], inputs["INPUT0"] - 0.5)
    # The BLS call is a request of add_sub's like any other.
    assert found.core.statistics("add_sub")[0].inference_count == 1
    with pytest.raises(ServerError) as raised:
        missing = np.array([b"no_such_model"], dtype=object)
        await found.core.infer(request("bls", MODEL_NAME=missing, **inputs))
    assert (
        "TritonModelException: Model no_such_model - Error when running inference: "
        "Request for unknown model: 'no_such_model'"
    ) in raised.value.message
    got = outputs(await found.core.infer(request("bls_async", **inputs)))
    np.testing.assert_allclose(got["OUTPUT0"], inputs["INPUT0"] + 0.5)
    np.testing.assert_allclose(got["OUTPUT1"], inputs["INPUT0"] - 0.5)
    assert found.core.statistics("add_sub_copy")[0].inference_count == 1


async def test_a_model_asks_the_server_which_models_are_ready(served: Open) -> None:
    found = await served("ready_probe", "add_sub")
    got = outputs(await found.core.infer(request("ready_probe", IN=np.array([0], np.int32))))
    # add_sub is ready, no_such_model is not; loading needs the model control API.
    assert got["OUT"].tolist() == [1, 0, 1]


async def test_bls_on_a_decoupled_model_iterates_its_responses(served: Open) -> None:
    found = await served("bls_decoupled", "bls_decoupled_async", "square")
    for value in (4, 2, 0, 1):
        given = np.array([value], np.int32)
        got = outputs(await found.core.infer(request("bls_decoupled", IN=given)))
        assert got["SUM"].tolist() == [value * value]
        got = outputs(await found.core.infer(request("bls_decoupled_async", IN=given)))
        assert got["SUM"].tolist() == [2 * value * value]


# --- custom metrics and logging ----------------------------------------------------------------


async def test_custom_metrics_are_kept_in_the_server(
    served: Open, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="ge_serve.backends.python.model")
    found = await served("metrics")
    counts = []
    for _ in range(3):
        response = await found.core.infer(request("metrics", **add_sub_inputs()))
        counts.append(response)
    families = {f.name: f for f in found.python.collect()}
    labels = {"model": "metrics", "version": "1"}
    counter = families["pbtest_requests_total_count"]
    assert counter.type == "counter"
    assert [(s.labels, s.value) for s in counter.samples] == [(labels, 3.0)]
    gauge = families["pbtest_last_sum"]
    assert gauge.samples[0].value == float((add_sub_inputs()["INPUT0"] + 0.5).sum() * 1)
    histogram = {s.name + s.labels.get("le", ""): s.value for s in families["pbtest_sum"].samples}
    assert histogram["pbtest_sum_count"] == 3 and histogram["pbtest_sum_bucket+Inf"] == 3
    assert any("metrics ready in metrics_0" in r.getMessage() for r in caplog.records)
    await found.lifecycle.unload("metrics")
    assert list(found.python.collect()) == []


# --- auto-complete and execution environments --------------------------------------------------


async def test_auto_complete_config_completes_a_model_with_no_config(tmp_path: Path) -> None:
    pymodels.write_auto_complete(tmp_path, "auto_batch", 4, "config.set_dynamic_batching()")
    pymodels.write_auto_complete(
        tmp_path, "auto_decoupled", 0, 'config.set_model_transaction_policy({"decoupled": True})'
    )
    found = await serve(tmp_path, ["auto_batch", "auto_decoupled"])
    try:
        config = config_to_json(found.core.model_config("auto_batch"))
        assert config["backend"] == "python" and config["max_batch_size"] == 4
        assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
            ("INPUT0", "TYPE_FP32", [4]),
            ("INPUT1", "TYPE_FP32", [4]),
        ]
        assert [o["name"] for o in config["output"]] == ["OUTPUT0", "OUTPUT1"]
        assert "dynamic_batching" in config
        assert config["instance_group"][0]["kind"] == "KIND_CPU"
        assert found.core.is_decoupled("auto_decoupled")
        got = outputs(await found.core.infer(request("auto_batch", **add_sub_inputs(2))))
        assert got["OUTPUT0"].shape == (2, 4)
    finally:
        await found.lifecycle.close()
        found.python.close()


async def test_auto_complete_may_not_contradict_the_config(tmp_path: Path) -> None:
    folder = pymodels.write_auto_complete(tmp_path, "auto_clash", 4)
    (folder / "config.pbtxt").write_text('backend: "python"\nmax_batch_size: 8\n')
    reason = await load_error(tmp_path, "auto_clash")
    assert reason.startswith(
        "failed to load 'auto_clash': auto_complete_config of model 'auto_clash' failed: "
        "ValueError: configuration "
        "specified max_batch_size 8, but in auto-complete-config function for model "
        "'auto_clash' specified max_batch_size 4"
    )


def _environment(root: Path, python: str) -> Path:
    site = root / "lib" / python / "site-packages"
    site.mkdir(parents=True)
    (site / "pbtest_env_only.py").write_text('WORD = "from the environment"\n')
    return root


async def test_an_execution_environment_is_used_or_the_load_refused(tmp_path: Path) -> None:
    python = f"python{sys.version_info.major}.{sys.version_info.minor}"
    unpacked = pymodels.write_env_model(tmp_path, "env_dir", "$$TRITON_MODEL_DIRECTORY/env")
    _environment(unpacked / "env", python)
    packed = pymodels.write_env_model(tmp_path, "env_tar", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    source = _environment(tmp_path / "staging", python)
    with tarfile.open(packed / "env.tar.gz", "w:gz") as tar:
        tar.add(source / "lib", arcname="lib")
    found = await serve(tmp_path, ["env_dir", "env_tar"])
    try:
        for name in ("env_dir", "env_tar"):
            got = outputs(await found.core.infer(request(name, IN=np.array([1], np.int32))))
            assert got["OUT"].tolist() == [b"from the environment"]
    finally:
        await found.lifecycle.close()
        found.python.close()
    other = pymodels.write_env_model(tmp_path, "env_old", "$$TRITON_MODEL_DIRECTORY/env")
    _environment(other / "env", "python3.6")
    reason = await load_error(tmp_path, "env_old")
    assert "is for python3.6, but the server runs " + python in reason


async def test_a_worker_that_dies_in_initialize_is_reported_in_tritons_words(
    tmp_path: Path,
) -> None:
    pymodels.write(tmp_path, "init_kill")
    reason = await load_error(tmp_path, "init_kill")
    # qa/L0_backend_python/test.sh greps the log for this sentence.
    assert "Stub process 'init_kill_0' is not healthy. " in reason
    assert "was killed by SIGKILL while it initialized" in reason


@pytest.mark.parametrize("autocomplete", [True, False])
async def test_a_missing_model_file_is_reported_in_tritons_words(
    tmp_path: Path, autocomplete: bool
) -> None:
    config = 'name: "absent"\nbackend: "python"\n' + pymodels.MODELS["failing"][1]
    folder = pymodels.write_model(tmp_path, "absent", "", config)
    (folder / "1" / "model.py").unlink()
    reason = await load_error(tmp_path, "absent", autocomplete=autocomplete)
    assert (
        "Failed to preinitialize Python stub: Python model file not found in "
        f"'{folder / '1' / 'model.py'}'"
    ) in reason


async def test_a_model_of_several_files_imports_them_by_name_and_relatively(
    tmp_path: Path,
) -> None:
    pymodels.write_multi_file(tmp_path, "multi_file")
    found = await serve(tmp_path, ["multi_file"])
    try:
        got = outputs(await found.core.infer(request("multi_file", IN=np.array([4], np.int32))))
        # 4 * 10 + 1 + 1 + len("1.model"): the module is its version folder's, as Triton's.
        assert got["OUT"].tolist() == [49]
    finally:
        await found.lifecycle.close()
        found.python.close()


async def test_a_python_based_backend_serves_the_models_that_name_it(tmp_path: Path) -> None:
    backends, repo = tmp_path / "backends", tmp_path / "models"
    pymodels.write_python_based(backends, "stepper", repo, "up_one", 1)
    pymodels.write_python_based(backends, "stepper", repo, "up_five", 5)
    found = await serve(repo, ["up_one", "up_five"], backend_directory=backends)
    try:
        for name, step in (("up_one", 1), ("up_five", 5)):
            got = outputs(await found.core.infer(request(name, IN=np.array([10], np.int32))))
            assert got["OUT"].tolist() == [10 + step]
            # Completed by the backend's auto_complete_config; it keeps its backend's name.
            config = found.lifecycle.get(name).config
            assert config.backend == "stepper" and [t.name for t in config.input] == ["IN"]
    finally:
        await found.lifecycle.close()
        found.python.close()


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        ("nowhere", "backend 'nowhere' is not supported"),
        ("../models/up_one", "is not a backend name"),
        ("..", "is not a backend name"),
    ],
)
async def test_a_python_based_backend_is_found_only_in_the_backend_directory(
    tmp_path: Path, backend: str, expected: str
) -> None:
    backends, repo = tmp_path / "backends", tmp_path / "models"
    pymodels.write_python_based(backends, "stepper", repo, "up_one", 1)
    # A model.py the name would reach if it could leave the backend directory.
    (repo / "up_one" / "model.py").write_text(pymodels.BASED_BACKEND)
    (tmp_path / "model.py").write_text(pymodels.BASED_BACKEND)
    config = repo / "up_one" / "config.pbtxt"
    config.write_text(config.read_text().replace('"stepper"', f'"{backend}"'))
    assert expected in await load_error(repo, "up_one", backend_directory=backends)
