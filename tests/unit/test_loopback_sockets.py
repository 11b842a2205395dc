"""The private folder of the sockets the server's own front ends answer its workers on
(server/workers/loopback.py): made for the owner alone, a clear error where it cannot be
made, and a killed server's removed by the next to start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ge_serve.server.errors import ServerError
from ge_serve.server.workers import loopback
from ge_serve.server.workers.loopback import HTTP_SOCKET, LoopbackSockets


def test_the_folder_and_its_sockets_are_the_owners_alone() -> None:
    sockets = LoopbackSockets()
    try:
        assert sockets.folder.stat().st_mode & 0o777 == 0o700
        listener = sockets.listen(HTTP_SOCKET, "Internal HTTP")
        try:
            assert Path(sockets.path(HTTP_SOCKET)).stat().st_mode & 0o777 == 0o600
            with socket.socket(socket.AF_UNIX) as client:
                listener.listen()
                client.connect(sockets.path(HTTP_SOCKET))
        finally:
            listener.close()
    finally:
        sockets.close()
    assert not sockets.folder.exists()


def test_a_long_temporary_folder_falls_back_to_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    sockets = LoopbackSockets()
    try:
        assert sockets.folder.parent == Path("/tmp")
        assert len(sockets.path("grpc.sock").encode()) <= loopback.MAX_SOCKET_PATH
    finally:
        sockets.close()


def test_no_folder_for_the_sockets_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(**_: object) -> str:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    with pytest.raises(ServerError) as raised:
        LoopbackSockets()
    assert raised.value.message.startswith("cannot make a folder for the workers' sockets in ")
    assert raised.value.message.endswith("Permission denied (set TMPDIR to a writable folder)")


def test_a_killed_servers_folder_goes_when_the_next_one_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server SIGKILLed cannot remove its folder; the next to start in the same place
    does, as the kernel has let go of the dead one's lock."""
    code = (
        "import sys, time\n"
        "from ge_serve.server.workers.loopback import LoopbackSockets\n"
        "print(LoopbackSockets().folder, flush=True)\n"
        "time.sleep(60)\n"
    )
    env = os.environ | {"TMPDIR": str(tmp_path)}
    with subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    ) as killed:
        try:
            assert killed.stdout is not None
            folder = Path(killed.stdout.readline().strip())
            assert folder.parent == tmp_path and (folder / loopback.LOCK).exists()
            # While it lives, a new server leaves its folder.
            monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
            LoopbackSockets().close()
            assert folder.exists()
        finally:
            killed.kill()
            killed.wait(timeout=30)
    assert folder.exists()
    sockets = LoopbackSockets()
    try:
        assert not folder.exists()
        assert sockets.folder.exists()
    finally:
        sockets.close()


def test_only_dead_servers_folders_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A live server's folder stays, and so do a folder with no lock file (one starting,
    or an older version's) and a file that only has the name."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    unlocked = tmp_path / f"{loopback.PREFIX}old"
    unlocked.mkdir()
    named = tmp_path / f"{loopback.PREFIX}file"
    named.write_text("x")
    first = LoopbackSockets()
    try:
        second = LoopbackSockets()
        second.close()
        assert first.folder.exists() and unlocked.exists() and named.exists()
        assert not second.folder.exists()
    finally:
        first.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([unlocked.name, named.name])
