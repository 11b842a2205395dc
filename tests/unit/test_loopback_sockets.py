"""The private folder of the sockets the server's own front ends answer its workers on
(server/workers/loopback.py): made for the owner alone, and a clear error where it
cannot be made."""

from __future__ import annotations

import socket
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
