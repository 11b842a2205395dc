"""Poll mode against repository layouts deploy tools make: Kubernetes ConfigMap links,
a name in two repositories, a config.pbtxt that is not a file (in process, no network)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from modelgen import make_lifecycle
from swapmodels import ADDK, addk_config, write_addk, write_addk_version, write_atomic

from ge_serve.server.control.model_control import ControlMode, ControlSettings, ModelControl
from ge_serve.server.inference.reports import ModelState, RepositoryEntry
from ge_serve.server.models.lifecycle import ModelLifecycle
from ge_serve.server.models.repository import ModelRepository, fingerprint

pytestmark = pytest.mark.timeout(120)


def poll_control(life: ModelLifecycle) -> ModelControl:
    return ModelControl(life, life.repository, ControlSettings(ControlMode.POLL, (), 1.0))


def write_configmap_data(folder: Path, data: str, max_batch_size: int) -> None:
    """One `..<data>` folder as the kubelet writes it: the config and a version folder."""
    (folder / data).mkdir()
    write_addk_version(folder / data, 1)
    text = addk_config().replace("max_batch_size: 8", f"max_batch_size: {max_batch_size}")
    (folder / data / "config.pbtxt").write_text(text, encoding="utf-8")


def swap_link(link: Path, target: str) -> None:
    """Point `link` at `target` in one rename, as the kubelet swaps `..data`."""
    staged = link.with_name("..data_tmp")
    os.symlink(target, staged)
    os.replace(staged, link)


async def test_a_configmap_data_swap_is_reloaded(tmp_path: Path, lifecycle: ModelLifecycle) -> None:
    folder = tmp_path / ADDK
    folder.mkdir()
    write_configmap_data(folder, "..v1", 8)
    os.symlink("..v1", folder / "..data")
    os.symlink("..data/config.pbtxt", folder / "config.pbtxt")
    os.symlink("..data/1", folder / "1")
    control = poll_control(lifecycle)
    assert await control.start() == {}
    try:
        assert lifecycle.get(ADDK).config.max_batch_size == 8
        write_configmap_data(folder, "..v2", 4)
        swap_link(folder / "..data", "..v2")
        shutil.rmtree(folder / "..v1")
        await control.poll_once()
        assert lifecycle.get(ADDK).config.max_batch_size == 4
    finally:
        await control.stop()


def test_a_link_inside_counts_by_what_it_resolves_to(tmp_path: Path) -> None:
    folder = write_addk(tmp_path)
    real = folder / "real"
    real.mkdir()
    (folder / "config.pbtxt").rename(real / "config.pbtxt")
    os.symlink("real/config.pbtxt", folder / "config.pbtxt")
    os.symlink(".", folder / "loop")  # a cycle is walked once, not forever
    first = fingerprint(folder)
    # Same size, same mtime: only the content says the config changed.
    info = (real / "config.pbtxt").stat()
    text = (real / "config.pbtxt").read_text(encoding="utf-8")
    (real / "config.pbtxt").write_text(text.replace(": 8", ": 4"), encoding="utf-8")
    os.utime(real / "config.pbtxt", ns=(info.st_atime_ns, info.st_mtime_ns))
    assert fingerprint(folder) != first


NOT_UNIQUE = f"failed to poll model '{ADDK}': not unique across all model repositories"
# Triton's index reason for it (qa L0_lifecycle test_multiple_model_repository_polling).
DUPLICATE = "model appears in two or more repositories"


def two_repositories(tmp_path: Path) -> tuple[Path, Path, ModelLifecycle]:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    life = make_lifecycle(first)
    life.repository = ModelRepository([first, second])
    return first, second, life


async def test_a_name_in_two_repositories_is_withdrawn_and_the_rest_poll_on(
    tmp_path: Path,
) -> None:
    first, second, life = two_repositories(tmp_path)
    write_addk(first)
    other = write_addk(second, name="other")
    control = poll_control(life)
    try:
        assert await control.start() == {}
        write_addk(second)
        await control.poll_once()
        assert not life.is_ready(ADDK)
        assert life.index()[0] == RepositoryEntry(ADDK, 1, ModelState.UNAVAILABLE, DUPLICATE)
        # Other models still follow their folders.
        write_atomic(other / "config.pbtxt", addk_config(name="other").replace(": 8", ": 2"))
        write_addk(second, name="new")
        await control.poll_once()
        assert life.get("other").config.max_batch_size == 2
        assert life.is_ready("new")
        # Once the name is unique again, the model serves again.
        shutil.rmtree(second / ADDK)
        await control.poll_once()
        assert life.is_ready(ADDK)
    finally:
        await control.stop()
        await life.close()


async def test_a_name_in_two_repositories_at_startup_fails_alone(tmp_path: Path) -> None:
    first, second, life = two_repositories(tmp_path)
    write_addk(first)
    write_addk(second)
    write_addk(second, name="other")
    control = poll_control(life)
    try:
        assert await control.start() == {ADDK: NOT_UNIQUE}
        assert life.is_ready("other")
        assert life.index() == [
            RepositoryEntry(ADDK, None, ModelState.UNAVAILABLE, DUPLICATE),
            RepositoryEntry("other", 1, ModelState.READY),
        ]
        assert life.all_ready()  # not served on purpose: strict readiness does not wait
        shutil.rmtree(first / ADDK)
        shutil.rmtree(second / ADDK)
        await control.poll_once()  # gone from both: gone from the index
        assert [row.name for row in life.index()] == ["other"]
    finally:
        await control.stop()
        await life.close()


async def test_a_config_pbtxt_that_is_a_folder_fails_the_reload(
    tmp_path: Path, lifecycle: ModelLifecycle
) -> None:
    folder = write_addk(tmp_path)
    write_atomic(folder / "config.pbtxt", addk_config().replace(": 8", ": 2"))
    control = poll_control(lifecycle)
    try:
        assert await control.start() == {}
        (folder / "config.pbtxt").unlink()
        (folder / "config.pbtxt").mkdir()
        await control.poll_once()
        # Not auto-completed from the model file: the written config keeps serving.
        assert lifecycle.get(ADDK).config.max_batch_size == 2
        (row,) = lifecycle.index()
        assert row.state is ModelState.READY
        assert "config.pbtxt exists but is not a regular file" in row.reason
    finally:
        await control.stop()
