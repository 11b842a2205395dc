"""Reload, unload and poll through the lifecycle and the control, in process.

These check what a network test cannot see directly: the retired version's slot threads
are joined and its executors closed, override folders are deleted, and the core retries a
request that raced a swap.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from modelgen import add_const_model, make_lifecycle
from swapmodels import (
    ADDK,
    SLOW,
    addk_config,
    write_addk,
    write_addk_version,
    write_atomic,
    write_slow,
)

from ge_serve.backends.base import LoadedModel, ModelSpec
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.server.control.model_control import ControlMode, ControlSettings, ModelControl
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.model import ModelVersion
from ge_serve.server.inference.reports import ModelState, RepositoryEntry
from ge_serve.server.inference.types import DataType, InferRequest, Tensor
from ge_serve.server.models.lifecycle import ModelLifecycle

pytestmark = pytest.mark.timeout(120)


def slot_threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"slot-{name}_")]


def addk_request(version: str = "") -> InferRequest:
    data = np.zeros((1, 4), np.float32)
    return InferRequest(
        model_name=ADDK,
        model_version=version,
        inputs=[Tensor("INPUT0", DataType.FP32, (1, 4), data)],
    )


async def infer_value(core: InferenceServer, version: str = "") -> tuple[str, float]:
    response = await core.infer(addk_request(version))
    return response.model_version, float(response.outputs[0].data[0, 0])


def make_control(life: ModelLifecycle, mode: ControlMode) -> ModelControl:
    return ModelControl(life, life.repository, ControlSettings(mode, (), 1.0))


async def test_reload_swaps_and_releases_the_old_version(
    tmp_path: Path, lifecycle: ModelLifecycle
) -> None:
    folder = write_addk(tmp_path, [1])
    retired: list[ModelVersion] = []
    lifecycle.on_retired.append(retired.append)
    core = InferenceServer(lifecycle)
    await lifecycle.load(ADDK)
    old = lifecycle.get(ADDK)
    assert await infer_value(core) == ("1", 1.0)
    assert len(slot_threads(f"{ADDK}_1")) == 1

    write_addk_version(folder, 2)
    await lifecycle.load(ADDK)
    assert await infer_value(core) == ("2", 2.0)
    assert retired == [old] and old.retiring
    # The old version's slot thread is joined and its executor closed.
    assert slot_threads(f"{ADDK}_1") == []
    with pytest.raises(RuntimeError, match="is closed"):
        old.loaded.executors[0].execute({"INPUT0": np.zeros((1, 4), np.float32)})
    assert [r.version for r in lifecycle.index() if r.name == ADDK] == [2]


async def test_unload_frees_everything_and_later_requests_get_a_clean_error(
    tmp_path: Path, lifecycle: ModelLifecycle
) -> None:
    write_addk(tmp_path, [1, 2], "version_policy { all {} }")
    core = InferenceServer(lifecycle)
    await lifecycle.load(ADDK)
    models = [lifecycle.get(ADDK, "1"), lifecycle.get(ADDK, "2")]
    assert len(slot_threads(ADDK)) == 2
    await lifecycle.unload(ADDK)
    assert slot_threads(ADDK) == []
    for model in models:
        with pytest.raises(RuntimeError, match="is closed"):
            model.loaded.executors[0].execute({"INPUT0": np.zeros((1, 4), np.float32)})
    with pytest.raises(ServerError) as caught:
        await core.infer(addk_request())
    assert caught.value.code is ErrorCode.NOT_FOUND
    assert caught.value.message == "Request for unknown model: 'addk' has no available versions"
    rows = [r for r in lifecycle.index() if r.name == ADDK]
    assert {(r.state, r.reason) for r in rows} == {(ModelState.UNAVAILABLE, "unloaded")}
    # A model unloaded on purpose does not hold strict readiness back.
    assert lifecycle.all_ready()


async def test_a_failed_reload_keeps_the_old_version_and_says_why(
    tmp_path: Path, lifecycle: ModelLifecycle
) -> None:
    folder = write_addk(tmp_path, [1])
    core = InferenceServer(lifecycle)
    await lifecycle.load(ADDK)
    write_atomic(folder / "config.pbtxt", "this is { not a config")
    with pytest.raises(ServerError, match="failed to load 'addk'"):
        await lifecycle.load(ADDK)
    assert await infer_value(core) == ("1", 1.0)
    (row,) = [r for r in lifecycle.index() if r.name == ADDK]
    assert row.state is ModelState.READY
    assert "reload failed" in row.reason and "failed to parse config.pbtxt" in row.reason

    # A broken model file for a new version: same story.
    write_atomic(folder / "config.pbtxt", addk_config())
    (folder / "2").mkdir()
    (folder / "2" / "model.onnx").write_bytes(b"not onnx")
    with pytest.raises(ServerError, match="failed to parse ONNX file"):
        await lifecycle.load(ADDK)
    assert await infer_value(core) == ("1", 1.0)
    assert len(slot_threads(f"{ADDK}_1")) == 1

    # Fixed: the next reload clears the reason.
    write_addk_version(folder, 2)
    await lifecycle.load(ADDK)
    assert await infer_value(core) == ("2", 2.0)
    (row,) = [r for r in lifecycle.index() if r.name == ADDK]
    assert row == RepositoryEntry(ADDK, 2, ModelState.READY, "")


class RecordingBackend(OnnxRuntimeBackend):
    """Notes when each (blocking) version load starts and ends."""

    def __init__(self, events: list[str]) -> None:
        super().__init__()
        self.events = events

    def load(self, spec: ModelSpec) -> LoadedModel:
        self.events.append("start")
        time.sleep(0.05)  # widen the window in which an unserialized load would overlap
        try:
            return super().load(spec)
        finally:
            self.events.append("end")


async def test_concurrent_loads_and_unloads_of_one_model_are_serialized(
    tmp_path: Path, lifecycle: ModelLifecycle
) -> None:
    write_addk(tmp_path, [1])
    events: list[str] = []
    lifecycle.backends["onnxruntime"] = RecordingBackend(events)
    lifecycle.on_loaded.append(lambda m, s: events.append("installed"))
    lifecycle.on_retired.append(lambda m: events.append("retired"))
    await asyncio.gather(
        lifecycle.load(ADDK),
        lifecycle.unload(ADDK),
        lifecycle.load(ADDK),
        lifecycle.load(ADDK),
        lifecycle.unload(ADDK),
        lifecycle.load(ADDK),
    )
    # In call order, each one finished before the next began: no two loads overlap and
    # nothing is retired while a load is underway.
    load = ["start", "end", "installed"]
    assert events == [*load, "retired", *load, *load, "retired", "retired", *load]
    assert lifecycle.is_ready(ADDK)
    assert len(slot_threads(ADDK)) == 1


class StaleOnce(ModelLifecycle):
    """Hands out a retired version once, as if a swap landed between lookup and submit."""

    stale: ModelVersion | None = None

    def get(self, name: str, version: str = "") -> ModelVersion:
        if self.stale is not None:
            stale, self.stale = self.stale, None
            return stale
        return super().get(name, version)


async def test_a_request_that_raced_a_swap_runs_on_the_new_version(tmp_path: Path) -> None:
    folder = write_addk(tmp_path, [1])
    plain = make_lifecycle(tmp_path)
    life = StaleOnce(plain.repository, plain.backends, plain.scheduler_factory, plain.settings)
    core = InferenceServer(life)
    try:
        await life.load(ADDK)
        old = life.get(ADDK)
        write_addk_version(folder, 2)
        await life.load(ADDK)
        life.stale = old
        assert await infer_value(core) == ("2", 2.0)
        assert life.stale is None  # the stale version really was handed out
        # The same when only the scheduler's refusal (SchedulerClosed) tells the core.
        old.retiring = False
        life.stale = old
        assert await infer_value(core) == ("2", 2.0)
        assert life.stale is None
        # Without a replacement (unloaded), the stale path ends in the clean error.
        life.stale = life.get(ADDK)
        await life.unload(ADDK)
        with pytest.raises(ServerError, match="has no available versions"):
            await infer_value(core)
    finally:
        await life.close()


async def test_unload_drains_within_its_timeout_then_fails_the_queued(tmp_path: Path) -> None:
    write_slow(tmp_path)
    life = make_lifecycle(tmp_path)
    life.settings = type(life.settings)(unload_timeout_s=0.05)
    core = InferenceServer(life)
    await life.load(SLOW)

    def request(iters: int) -> InferRequest:
        x = np.ones((1, 256), np.float32)
        return InferRequest(
            model_name=SLOW,
            model_version="",
            inputs=[
                Tensor("X", DataType.FP32, (1, 256), x),
                Tensor("ITERS", DataType.INT64, (1,), np.array([iters], np.int64)),
            ],
        )

    try:
        # One executes (about a second), three wait for the single slot.
        tasks = [asyncio.create_task(core.infer(request(80_000))) for _ in range(4)]
        await asyncio.sleep(0)
        await life.unload(SLOW)
        results = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await life.close()
    done = [r for r in results if not isinstance(r, BaseException)]
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(done) >= 1  # the executing one finished
    assert failed, "the queued requests outlived a 50 ms drain timeout"
    for error in failed:
        assert isinstance(error, ServerError)
        assert error.message == "Request for unknown model: 'slow' has no available versions"
    # The run that outlived the timeout could not be aborted; its slot closes right after.
    for thread in slot_threads(SLOW):
        thread.join(30)
    assert slot_threads(SLOW) == []


class Marker:
    def __init__(self) -> None:
        self.me = self  # a cycle, as a model's own objects form: only a collection frees it


@contextlib.asynccontextmanager
async def frozen_marker(
    tmp_path: Path, lifecycle: ModelLifecycle
) -> AsyncIterator[tuple[ModelControl, weakref.ref[Marker]]]:
    """An explicit-mode control with `addk` loaded, a cyclic marker held by its version,
    and a later change (loading `second`) that froze the marker with the standing heap
    (startup/gcheap.py). The control is stopped on exit, after any change it still runs."""
    write_addk(tmp_path, [1])
    write_addk(tmp_path, [1], name="second")
    control = make_control(lifecycle, ControlMode.EXPLICIT)
    await control.start()
    try:
        await control.load(ADDK)
        marker = Marker()
        lifecycle.get(ADDK).loaded.extra["marker"] = marker
        freed = weakref.ref(marker)
        del marker
        await control.load("second")
        assert gc.get_freeze_count() > 0
        yield control, freed
    finally:
        await control.stop()


async def test_a_reload_through_the_control_frees_the_old_version_at_once(
    tmp_path: Path, lifecycle: ModelLifecycle
) -> None:
    """The reload thaws and collects what it retired, with no collection of the test's."""
    async with frozen_marker(tmp_path, lifecycle) as (control, freed):
        await control.load(ADDK)
        assert freed() is None, "the replaced version is still held"


async def test_a_reload_whose_caller_left_still_frees_the_old_version(
    tmp_path: Path, lifecycle: ModelLifecycle
) -> None:
    """A client whose deadline passes mid-reload leaves the reload to finish on its own;
    the change still thaws and collects what it retired."""
    async with frozen_marker(tmp_path, lifecycle) as (control, freed):
        caller = asyncio.ensure_future(control.load(ADDK))
        for _ in range(1000):  # until the reload runs as the control's own task
            if control._tasks:  # white box: nothing outside says that a load has begun
                break
            await asyncio.sleep(0.001)
        assert control._tasks, "the reload never began"
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
    # The control has stopped, which waits for the reload its caller left.
    assert lifecycle.get(ADDK).loaded.extra.get("marker") is None, "the reload did not run"
    assert freed() is None, "the replaced version is still held"


async def test_poll_picks_up_added_changed_and_removed_models(
    tmp_path: Path, lifecycle: ModelLifecycle
) -> None:
    folder = write_addk(tmp_path, [1, 2, 3], "version_policy { specific { versions: [1] } }")
    control = make_control(lifecycle, ControlMode.POLL)
    core = InferenceServer(lifecycle, control=control)
    assert await control.start() == {}
    try:
        assert await infer_value(core) == ("1", 1.0)
        await control.poll_once()  # nothing changed: nothing reloads
        assert lifecycle.get(ADDK).version == 1

        # A version policy edit takes effect on the reload the poll triggers.
        write_atomic(
            folder / "config.pbtxt", addk_config("version_policy { latest { num_versions: 1 } }")
        )
        await control.poll_once()
        assert await infer_value(core) == ("3", 3.0)
        assert slot_threads(f"{ADDK}_1") == []

        # A new version folder; requests without a version go to the highest.
        write_addk_version(folder, 4)
        await control.poll_once()
        assert await infer_value(core) == ("4", 4.0)

        # A broken edit keeps version 4 serving, with the reason in the index.
        write_atomic(folder / "config.pbtxt", 'name: "wrong_name"')
        await control.poll_once()
        assert await infer_value(core) == ("4", 4.0)
        (row,) = [r for r in await core.repository_index() if r.name == ADDK]
        assert row.state is ModelState.READY and "does not match" in row.reason

        # Added and removed models.
        write_addk(tmp_path, [1], name="second")
        await control.poll_once()
        assert lifecycle.is_ready("second")
        shutil.rmtree(tmp_path / "second")
        await control.poll_once()
        assert "second" not in {r.name for r in await core.repository_index()}
        assert slot_threads("second") == []

        # The API is refused in poll mode, with Triton's message.
        with pytest.raises(ServerError) as caught:
            await core.load_model(ADDK)
        assert caught.value.code is ErrorCode.UNAVAILABLE
        assert "explicit model load / unload is not allowed" in caught.value.message
    finally:
        await control.stop()


async def test_poll_reloads_on_a_labels_edit(tmp_path: Path, lifecycle: ModelLifecycle) -> None:
    folder = write_addk(tmp_path, [1])
    write_atomic(folder / "labels.txt", "a\nb\nc\nd\n")
    write_atomic(folder / "config.pbtxt", addk_config(label_file="labels.txt"))
    control = make_control(lifecycle, ControlMode.POLL)
    await control.start()
    try:
        assert lifecycle.get(ADDK).labels == {"OUTPUT0": ["a", "b", "c", "d"]}
        write_atomic(folder / "labels.txt", "w\nx\ny\nz\n")
        await control.poll_once()
        assert lifecycle.get(ADDK).labels == {"OUTPUT0": ["w", "x", "y", "z"]}
    finally:
        await control.stop()


async def test_file_overrides_load_from_a_private_folder_that_is_removed(
    tmp_path: Path, lifecycle: ModelLifecycle, monkeypatch: pytest.MonkeyPatch
) -> None:
    private = tmp_path / "private-tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    write_addk(tmp_path / "repo-unused", [1])  # not the lifecycle's repository
    control = make_control(lifecycle, ControlMode.EXPLICIT)
    core = InferenceServer(lifecycle, control=control)
    config = (
        '{"name": "addk", "backend": "onnxruntime", "max_batch_size": 8,'
        ' "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],'
        ' "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}'
    )
    files = {"file:7/model.onnx": add_const_model(70.0).SerializeToString()}
    await core.load_model(ADDK, config, files)
    assert await infer_value(core) == ("7", 70.0)
    (folder,) = private.iterdir()
    assert lifecycle.get(ADDK).model_dir == folder

    # An escaping name is refused before any folder is made; the loaded model is untouched.
    with pytest.raises(ServerError, match="must be a relative path"):
        await core.load_model(ADDK, config, {"../../evil.onnx": b"x"})
    assert list(private.iterdir()) == [folder]
    assert await infer_value(core) == ("7", 70.0)

    # Reloading with other overrides swaps folders; the old one goes with its version.
    files = {"8/model.onnx": add_const_model(80.0).SerializeToString()}
    await core.load_model(ADDK, config, files)
    assert await infer_value(core) == ("8", 80.0)
    (newer,) = private.iterdir()
    assert newer != folder
    await core.unload_model(ADDK)
    assert list(private.iterdir()) == []
    assert await asyncio.to_thread(lambda: list(tmp_path.glob("**/evil.onnx"))) == []
    assert lifecycle.index()[0].state is ModelState.UNAVAILABLE
