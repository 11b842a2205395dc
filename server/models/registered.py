"""Repositories registered while the server runs, Triton's repository registration
(core TRITONSERVER_ServerRegisterModelRepository), used by SageMaker's multi-model
endpoint (server/http/sagemaker_mme.py).

A registered repository is scanned like a `--model-repository` folder, except that its
mapped folders are served under their mapped names (and their configs take that name, as
in Triton); its other folders keep their own names. It is only ever a folder the caller
has checked; the mapped names are checked as model names are.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..errors import ErrorCode, ServerError


class RegisteredRepositories:
    """Registered repository folders, each with its {model name: folder name} mapping.

    Read by the repository's scans off the event loop, so changes hold a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roots: dict[Path, dict[str, str]] = {}

    def items(self) -> list[tuple[Path, dict[str, str]]]:
        """(root, {folder name: model name}) for each registered repository."""
        with self._lock:
            return [
                (root, {folder: name for name, folder in mapping.items()})
                for root, mapping in self._roots.items()
            ]

    def register(self, root: Path, mapping: dict[str, str]) -> None:
        """Register `root` with `mapping` ({model name: folder name}); Triton's errors for
        a folder that is not one, one registered already, or a name mapped already."""
        if not root.is_dir():
            raise ServerError(
                ErrorCode.INVALID_ARG, f"failed to register '{root}', repository not found"
            )
        with self._lock:
            if root in self._roots:
                raise ServerError(
                    ErrorCode.ALREADY_EXISTS,
                    f"model repository '{root}' has already been registered",
                )
            for name in mapping:
                if any(name in known for known in self._roots.values()):
                    raise ServerError(
                        ErrorCode.ALREADY_EXISTS,
                        f"failed to register '{name}', there is a conflicting mapping for '{name}'",
                    )
            self._roots[root] = dict(mapping)

    def unregister(self, root: Path) -> None:
        with self._lock:
            if self._roots.pop(root, None) is None:
                raise ServerError(
                    ErrorCode.INVALID_ARG, f"failed to unregister '{root}', repository not found"
                )
