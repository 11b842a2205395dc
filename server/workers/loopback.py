"""Where the server's own front ends answer what the front-end workers pass on: Unix
sockets in a directory of the server's own.

A loopback TCP port would let any process on the host reach those front ends, past what
guards the public port (mutual TLS asks a client there for a certificate; the loopback
listener could not, as the workers hold none). A Unix socket in a directory only the
server's user may enter (mode 0700, the socket 0600) is reached by that user's
processes alone, whatever the host's network namespace holds; and the workers, started
by the server, are such processes. The directory goes when the server stops.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

from ..errors import ErrorCode, ServerError

# sockaddr_un's sun_path holds 108 bytes with its terminating NUL (Linux).
MAX_SOCKET_PATH = 107
HTTP_SOCKET = "http.sock"
PREFIX = "ge-serve-sock-"
GRPC_SOCKET = "grpc.sock"


class LoopbackSockets:
    """A private directory of Unix sockets, made when built and removed by `close`."""

    def __init__(self) -> None:
        self.folder = _private_folder(None)
        if len(os.fsencode(self.path(GRPC_SOCKET))) > MAX_SOCKET_PATH:
            # A long TMPDIR: /tmp is short wherever there is one.
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = _private_folder("/tmp")

    def path(self, name: str) -> str:
        return str(self.folder / name)

    def restrict(self, name: str) -> None:
        """The socket at `name` for its owner alone (grpc makes its own under the umask;
        the folder's mode keeps others out either way)."""
        os.chmod(self.path(name), 0o600)

    def listen(self, name: str, what: str) -> socket.socket:
        """A Unix stream socket bound at `name` in the directory (0600), or a ServerError."""
        path = self.path(name)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o600)
        except OSError as exc:
            sock.close()
            raise ServerError(
                ErrorCode.UNAVAILABLE, f"cannot listen for {what} at {path}: {exc.strerror or exc}"
            ) from None
        return sock

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def _private_folder(parent: str | None) -> Path:
    """A new folder only this user may enter (mkdtemp makes it 0700), or a ServerError."""
    try:
        return Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    except OSError as exc:
        where = parent or tempfile.gettempdir()
        raise ServerError(
            ErrorCode.UNAVAILABLE,
            f"cannot make a folder for the workers' sockets in {where}: {exc.strerror or exc} "
            "(set TMPDIR to a writable folder)",
        ) from None
