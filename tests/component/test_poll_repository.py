"""Poll mode against repository layouts deploy tools make: Kubernetes ConfigMap links,
a name in two repositories, a config.pbtxt that is not a file (in process, no network)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from swapmodels import ADDK, addk_config, write_addk, write_addk_version

from ge_serve.server.control.model_control import ControlMode, ControlSettings, ModelControl
from ge_serve.server.models.lifecycle import ModelLifecycle
from ge_serve.server.models.repository import fingerprint

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
