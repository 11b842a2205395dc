"""Where the server's own front ends answer what the front-end workers pass on: Unix
sockets in a directory of the server's own.

A loopback TCP port would let any process on the host reach those front ends, past what
guards the public port (mutual TLS asks a client there for a certificate; the loopback
listener could not, as the workers hold none). A Unix socket in a directory only the
server's user may enter (mode 0700, the socket 0600) is reached by that user's
processes alone, whatever the host's network namespace holds; and the workers, started
by the server, are such processes. The directory goes when the server stops; a server
killed before it could remove its own leaves it, and the next one to start removes it:
each server holds a lock on a file in its folder while it lives, which the kernel lets go
of however the process ends. (A TMPDIR on NFS shared between hosts would not show one
host's locks to another: point TMPDIR at a local folder there.)
"""

from __future__ import annotations

import fcntl
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
LOCK = "owner.lock"


class LoopbackSockets:
    """A private directory of Unix sockets, made when built and removed by `close`."""

    def __init__(self) -> None:
        self.folder = _private_folder(None)
        if len(os.fsencode(self.path(GRPC_SOCKET))) > MAX_SOCKET_PATH:
            # A long TMPDIR: /tmp is short wherever there is one.
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = _private_folder("/tmp")
        self._lock = _hold(self.folder)

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
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1


def _private_folder(parent: str | None) -> Path:
    """A new folder only this user may enter (mkdtemp makes it 0700), or a ServerError;
    first, the folders killed servers left there go."""
    _sweep(parent or tempfile.gettempdir())
    try:
        return Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    except OSError as exc:
        where = parent or tempfile.gettempdir()
        raise ServerError(
            ErrorCode.UNAVAILABLE,
            f"cannot make a folder for the workers' sockets in {where}: {exc.strerror or exc} "
            "(set TMPDIR to a writable folder)",
        ) from None


def _hold(folder: Path) -> int:
    """A descriptor holding the lock on the folder's LOCK file. The file is locked before
    it takes its name, so no other server finds it there unlocked. A folder this cannot
    lock is still the server's (its sockets work); a later server then leaves it."""
    fd, temporary = tempfile.mkstemp(dir=folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(temporary, folder / LOCK)
    except OSError:
        pass
    return fd


def _sweep(parent: str) -> None:
    """Remove the socket folders in `parent` that are this user's and whose lock no live
    process holds: their servers were killed. A folder with no lock file (one starting,
    or an older version's) is left."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(entry.path, LOCK), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # held: its server lives
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            os.close(fd)
