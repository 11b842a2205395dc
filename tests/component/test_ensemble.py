"""Ensembles in process: through the control, the lifecycle and the core, with small ONNX
step models (tests/ensemblerepo.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from ensemblecore import explicit_core, ones, outputs, request, row, stats, without_heap_settling
from ensemblerepo import (
    ensemble_config,
    step,
    tensor,
    write_ensemble,
    write_pipelines,
)
from modelgen import add_const_model, lookup_model, make_lifecycle, write_model

from ge_serve.scheduler.base import Scheduler
from ge_serve.scheduler.work import Array, WorkItem
from ge_serve.server.control.model_control import ControlMode, ControlSettings, ModelControl
from ge_serve.server.errors import (
    ErrorCode,
    FailureReason,
    ServerError,
    invalid_arg,
    queue_full,
)
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.reports import ModelState

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def no_heap_settling(monkeypatch: pytest.MonkeyPatch) -> None:
    without_heap_settling(monkeypatch)


@pytest.fixture
async def core(tmp_path: Path) -> AsyncIterator[InferenceServer]:
    async with explicit_core(tmp_path) as served:
        yield served


# --- running -------------------------------------------------------------------------------


async def test_a_chain_runs_its_steps_in_order_and_counts_each_model(
    tmp_path: Path, core: InferenceServer
) -> None:
    write_pipelines(tmp_path)
    await core.load_model("chain")
    # Loading the ensemble loaded what it is built on, as Triton's explicit mode does.
    assert all(core.model_ready(n) for n in ("chain", "add1", "add10"))
    assert not core.model_ready("add_sub")
    got = await outputs(core, "chain", np.arange(8, dtype=np.float32).reshape(2, 4))
    np.testing.assert_array_equal(got["OUT"], np.arange(8).reshape(2, 4) + 11)

    chain, add1, add10 = (stats(core, n) for n in ("chain", "add1", "add10"))
    for model in (chain, add1, add10):
        assert (model.inference_count, model.execution_count) == (2, 1)
        assert model.inference_stats.success.count == 1
    # The ensemble's compute time is its steps' together, as Triton reports it.
    for kind in ("compute_input", "compute_infer", "compute_output"):
        steps = sum(getattr(m.inference_stats, kind).ns for m in (add1, add10))
        assert getattr(chain.inference_stats, kind).ns == steps
    assert [b.batch_size for b in chain.batch_stats] == [2]
    metadata = core.model_metadata("chain")
    assert metadata.platform == "ensemble"
    assert [i.shape for i in metadata.inputs] == [(-1, 4)]
    assert not core.model_config("chain").instance_group


class Rendezvous:
    """Lets submits through only once `count` of them are waiting at the same time: steps
    run one after another never all get there."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.arrived = 0
        self.all_in = asyncio.Event()


class Gated:
    """A step model's scheduler that first waits at a rendezvous."""

    def __init__(self, inner: Scheduler, meeting: Rendezvous) -> None:
        self.inner = inner
        self.meeting = meeting

    @property
    def pending(self) -> int:
        return self.inner.pending

    async def submit(self, item: WorkItem) -> dict[str, Array]:
        self.meeting.arrived += 1
        if self.meeting.arrived == self.meeting.count:
            self.meeting.all_in.set()
        await asyncio.wait_for(self.meeting.all_in.wait(), 10)
        return await self.inner.submit(item)

    async def close(self, drain_timeout_s: float) -> None:
        await self.inner.close(drain_timeout_s)


async def test_independent_steps_of_a_diamond_run_at_once(
    tmp_path: Path, core: InferenceServer
) -> None:
    write_pipelines(tmp_path)
    await core.load_model("diamond")
    meeting = Rendezvous(2)
    for name in ("add1", "add10"):
        model = core.model(name)
        model.scheduler = Gated(model.scheduler, meeting)
    got = await outputs(core, "diamond", np.full((1, 4), 3, np.float32))
    np.testing.assert_array_equal(got["SUM"], np.full((1, 4), 2 * 3 + 11))
    np.testing.assert_array_equal(got["DIFF"], np.full((1, 4), -9))
    assert meeting.arrived == 2


async def test_steps_of_concurrent_ensemble_requests_batch_together(
    tmp_path: Path, core: InferenceServer
) -> None:
    batching = (
        "dynamic_batching { preferred_batch_size: [4] max_queue_delay_microseconds: 30000000 }"
    )
    write_pipelines(tmp_path, add1_extra=batching)
    await core.load_model("chain")
    results = await asyncio.gather(
        *(outputs(core, "chain", np.full((1, 4), i, np.float32)) for i in range(4))
    )
    for i, got in enumerate(results):
        np.testing.assert_array_equal(got["OUT"], np.full((1, 4), i + 11))
    add1, add10, chain = (stats(core, n) for n in ("add1", "add10", "chain"))
    # The four requests' first steps ran as one batch of 4 in the batching model.
    assert (add1.inference_count, add1.execution_count) == (4, 1)
    assert [(b.batch_size, b.compute_infer.count) for b in add1.batch_stats] == [(4, 1)]
    assert add10.inference_count == 4
    assert (chain.inference_count, chain.execution_count) == (4, 4)


async def test_a_failing_step_fails_the_ensemble_with_its_error(
    tmp_path: Path, core: InferenceServer
) -> None:
    config = (
        'name: "lookup"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        f"input [{tensor('INDEX', 'TYPE_INT64', [1])}]\n"
        f"output [{tensor('VALUE', 'TYPE_FP32', [1])}]\n"
    )
    write_model(tmp_path, "lookup", lookup_model(), config)
    steps = [step("lookup", {"INDEX": "IN"}, {"VALUE": "OUT"})]
    pipe = ensemble_config(
        "pipe", steps, (tensor("IN", "TYPE_INT64", [1]),), (tensor("OUT", "TYPE_FP32", [1]),)
    )
    write_ensemble(tmp_path, "pipe", pipe)
    await core.load_model("pipe")
    good = await outputs(core, "pipe", np.array([[2]], np.int64))
    np.testing.assert_array_equal(good["OUT"], [[3.5]])
    with pytest.raises(ServerError) as caught:
        await core.infer(request("pipe", np.array([[7]], np.int64)))
    # The step's model could not run on the data the ensemble's client sent.
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message.startswith(
        "in ensemble 'pipe', the model could not run on this request's data: Gather node: "
        "indices element out of data bounds"
    )
    for name in ("pipe", "lookup"):
        assert stats(core, name).inference_stats.fail.count == 1
        assert stats(core, name).inference_stats.success.count == 1


async def test_a_bad_request_is_refused_against_the_ensembles_own_inputs(
    tmp_path: Path, core: InferenceServer
) -> None:
    write_pipelines(tmp_path)
    await core.load_model("chain")
    with pytest.raises(ServerError) as caught:
        await core.infer(request("chain", ones(), name="INPUT0"))
    assert (
        caught.value.message
        == "[request id: <id_unknown>] unexpected inference input 'INPUT0' for model 'chain'"
    )
    assert stats(core, "add1").inference_stats.fail.count == 0


class Refusing:
    """A step model's scheduler that refuses every request before taking it."""

    pending = 0

    def __init__(self, error: ServerError) -> None:
        self.error = error

    async def submit(self, item: WorkItem) -> dict[str, Array]:
        raise self.error

    async def close(self, drain_timeout_s: float) -> None:
        return None


@pytest.mark.parametrize(
    "error",
    [queue_full(), invalid_arg("a check of the step model's scheduler")],
    ids=["full queue", "check"],
)
async def test_a_step_refused_by_its_model_fails_the_ensemble_as_other(
    tmp_path: Path, core: InferenceServer, error: ServerError
) -> None:
    """The step's model never took the request, so it counts nothing; the ensemble did,
    and its request failed: counted, under Triton's reason for an ensemble, OTHER."""
    write_pipelines(tmp_path)
    await core.load_model("chain")
    core.model("add10").scheduler = Refusing(error)
    with pytest.raises(ServerError, match=f"in ensemble 'chain', {error.message}"):
        await core.infer(request("chain", ones()))
    assert stats(core, "add10").inference_stats.fail.count == 0
    assert stats(core, "chain").inference_stats.fail.count == 1
    (chain,) = (r for r in core.stats.records() if r.model.name == "chain")
    assert chain.failures[FailureReason.OTHER] == 1


async def test_a_step_that_fails_in_its_backend_fails_the_ensemble_as_other(
    tmp_path: Path, core: InferenceServer
) -> None:
    """Triton's ensemble scheduler answers its own request with reason OTHER whatever
    failed in a step (core ensemble_scheduler.cc); the step's model counts its own."""
    write_pipelines(tmp_path)
    await core.load_model("chain")
    failed = ServerError(ErrorCode.INTERNAL, "the graph failed", FailureReason.BACKEND)
    core.model("add10").scheduler = Refusing(failed)
    with pytest.raises(ServerError, match="in ensemble 'chain', the graph failed"):
        await core.infer(request("chain", ones()))
    (chain,) = (r for r in core.stats.records() if r.model.name == "chain")
    assert (chain.failures[FailureReason.OTHER], chain.failures[FailureReason.BACKEND]) == (1, 0)


# --- ensembles and the models they are built on --------------------------------------------


async def test_an_ensemble_missing_a_model_serves_once_the_model_loads(
    tmp_path: Path, core: InferenceServer
) -> None:
    write_pipelines(tmp_path)
    folder = tmp_path / "add10"
    folder.rename(tmp_path.parent / f"{tmp_path.name}-add10")
    reason = "ensemble chain contains models that are not available or ambiguous: add10"
    with pytest.raises(ServerError, match="not available or ambiguous: add10"):
        await core.load_model("chain")
    assert (row(core, "chain").state, row(core, "chain").reason) == (ModelState.UNAVAILABLE, reason)
    assert not core.model_ready("add1")  # nothing was loaded for a load that cannot work
    with pytest.raises(ServerError) as caught:
        await core.infer(request("chain", ones()))
    assert caught.value.code is ErrorCode.NOT_FOUND

    (tmp_path.parent / f"{tmp_path.name}-add10").rename(folder)
    await core.load_model("add10")
    assert core.model_ready("chain") and core.model_ready("add1")
    assert row(core, "chain").reason == ""
    np.testing.assert_array_equal((await outputs(core, "chain", ones()))["OUT"], ones() + 11)
    assert core.ready()


async def test_unloading_a_model_takes_its_ensembles_down_until_it_is_back(
    tmp_path: Path, core: InferenceServer
) -> None:
    write_pipelines(tmp_path)
    await core.load_model("chain")
    await core.load_model("diamond")
    await core.unload_model("add10")
    for name in ("chain", "diamond"):
        state = row(core, name)
        assert state.state is ModelState.UNAVAILABLE
        assert state.reason == f"ensemble '{name}' depends on 'add10' which has no loaded version."
    with pytest.raises(ServerError) as caught:
        await core.infer(request("chain", ones()))
    assert caught.value.message == "Request for unknown model: 'chain' has no available versions"
    # Down because of an unload on purpose: strict readiness does not wait for them.
    assert core.ready() and core.model_ready("add1") and core.model_ready("add_sub")

    await core.load_model("add10")
    assert core.model_ready("chain") and core.model_ready("diamond")
    np.testing.assert_array_equal((await outputs(core, "chain", ones()))["OUT"], ones() + 11)


async def test_unload_dependents_unloads_what_was_loaded_along_with_an_ensemble(
    tmp_path: Path, core: InferenceServer
) -> None:
    write_pipelines(tmp_path)
    await core.load_model("add1")  # loaded on its own
    await core.load_model("chain")  # brings add10 along
    await core.load_model("diamond")  # brings add_sub along, shares add1 and add10

    await core.unload_model("chain", unload_dependents=True)
    # add10 still serves diamond, add1 was loaded on its own.
    assert [core.model_ready(n) for n in ("chain", "add1", "add10")] == [False, True, True]
    await core.unload_model("diamond")
    assert core.model_ready("add10") and core.model_ready("add_sub")  # without the flag

    await core.load_model("diamond")
    await core.unload_model("diamond", unload_dependents=True)
    ready = {n: core.model_ready(n) for n in ("add1", "add10", "add_sub", "diamond")}
    assert ready == {"add1": True, "add10": False, "add_sub": False, "diamond": False}
    assert row(core, "diamond").reason == "unloaded"
    # Unloaded on purpose, an ensemble does not come back when its models load again.
    await core.load_model("add10")
    assert not core.model_ready("diamond") and not core.model_ready("chain")


async def test_a_reloaded_step_model_reloads_its_ensembles(
    tmp_path: Path, core: InferenceServer
) -> None:
    write_pipelines(tmp_path)
    await core.load_model("chain")
    old = core.model("chain")
    await outputs(core, "chain", ones())
    version = tmp_path / "add10" / "2"
    version.mkdir()
    (version / "model.onnx").write_bytes(add_const_model(20.0).SerializeToString())
    await core.load_model("add10")
    assert core.model("chain") is not old and old.retiring
    np.testing.assert_array_equal((await outputs(core, "chain", ones()))["OUT"], ones() + 21)
    # The ensemble's statistics start again with its new version, as after any reload.
    assert stats(core, "chain").inference_count == 1

    # A step model that no longer fits takes the ensemble down rather than let it run
    # steps it was not checked against.
    config = (tmp_path / "add10" / "config.pbtxt").read_text()
    (tmp_path / "add10" / "config.pbtxt").write_text(
        config.replace("max_batch_size: 8", "max_batch_size: 4")
    )
    await core.load_model("add10")
    state = row(core, "chain")
    assert state.state is ModelState.UNAVAILABLE
    assert state.reason == (
        "failed to load 'chain': ensemble chain allows maximum batch size 8, but it contains "
        "model add10 which only allows maximum batch size to be 4"
    )


async def test_startup_loads_models_before_the_ensembles_built_on_them(tmp_path: Path) -> None:
    write_pipelines(tmp_path)
    nested = [
        step("chain", {"IN": "IN"}, {"OUT": "mid"}),
        step("add1", {"INPUT0": "mid"}, {"OUTPUT0": "OUT"}),
    ]
    write_ensemble(tmp_path, "outer", ensemble_config("outer", nested))
    life = make_lifecycle(tmp_path)
    control = ModelControl(life, life.repository, ControlSettings(ControlMode.NONE))
    loads: list[str] = []
    life.on_loaded.append(lambda model, seconds: loads.append(model.name))
    core = InferenceServer(life, control=control)
    try:
        assert await control.start() == {}
        # Every model loaded once, each ensemble after the models it is built on.
        assert sorted(loads) == ["add1", "add10", "add_sub", "chain", "diamond", "outer"]
        assert loads.index("chain") < loads.index("outer")
        assert max(loads.index(n) for n in ("add1", "add10", "add_sub")) < min(
            loads.index(n) for n in ("chain", "diamond")
        )
        assert core.ready()
        np.testing.assert_array_equal((await outputs(core, "outer", ones()))["OUT"], ones() + 12)
        assert stats(core, "chain").inference_count == 1  # a nested ensemble counts too
    finally:
        await control.stop()
        await life.close()


async def test_in_poll_mode_ensembles_follow_their_models(tmp_path: Path) -> None:
    write_pipelines(tmp_path)
    life = make_lifecycle(tmp_path)
    # Polled by hand below; the poller's own interval never comes round.
    control = ModelControl(life, life.repository, ControlSettings(ControlMode.POLL, (), 3600.0))
    core = InferenceServer(life, control=control)
    try:
        assert await control.start() == {}
        version = tmp_path / "add10" / "2"
        version.mkdir()
        (version / "model.onnx").write_bytes(add_const_model(20.0).SerializeToString())
        await control.poll_once()
        np.testing.assert_array_equal((await outputs(core, "chain", ones()))["OUT"], ones() + 21)

        (tmp_path / "add10").rename(tmp_path.parent / f"{tmp_path.name}-gone")
        await control.poll_once()
        for name in ("chain", "diamond"):
            assert row(core, name).reason == (
                f"ensemble '{name}' depends on 'add10' which has no loaded version."
            )
        assert core.ready()
    finally:
        await control.stop()
        await life.close()
