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
GRPC_SOCKET = "grpc.sock"


class LoopbackSockets:
    """A private directory of Unix sockets, made when built and removed by `close`."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="ge-serve-"))
        if len(os.fsencode(self.path(GRPC_SOCKET))) > MAX_SOCKET_PATH:
            # A long TMPDIR: /tmp is short wherever there is one.
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = Path(tempfile.mkdtemp(prefix="ge-serve-", dir="/tmp"))
        os.chmod(self.folder, 0o700)

    def path(self, name: str) -> str:
        return str(self.folder / name)

    def grpc_target(self) -> str:
        """The gRPC front end's address for grpc's `unix:` scheme."""
        return f"unix:{self.path(GRPC_SOCKET)}"

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
