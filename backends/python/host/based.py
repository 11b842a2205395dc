"""Python-based backends: a backend written as a `model.py` (python_backend's "Python-based
Backends"), found as `<backend directory>/<name>/model.py` for a config whose `backend:`
names a backend ge-serve does not have.

The Python backend serves each model of such a backend with the backend's `model.py`, as
Triton's stub does (`runtime_modeldir`): the model's own version folder need not hold
one, and the model finds its own files there (`pb_utils.get_model_dir()`). The backend
directory is the operator's (`--backend-directory`); the name comes from a model config,
which a client may send (the load API), so it must be one folder name of that directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ge_serve.backends.base import LoadedModel, ModelSpec
from ge_serve.backends.paths import OutsideFolder, resolve_inside
from ge_serve.protos import model_config_pb2


class PythonRunner(Protocol):
    """What a Python-based backend asks of the Python backend (host/backend.py)."""

    def autocomplete(
        self,
        config: model_config_pb2.ModelConfig,
        model_path: Path,
        backend_file: Path | None = None,
    ) -> None: ...

    def load(self, spec: ModelSpec, backend_file: Path | None = None) -> LoadedModel: ...


BACKEND_FILE = "model.py"


def find_backend_file(directory: Path | None, name: str) -> Path | None:
    """`<directory>/<name>/model.py` when it is a file inside `directory`, else None.
    ValueError for a name that is not one folder name."""
    if directory is None:
        return None
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise ValueError(
            f"backend '{name}' is not a backend name: it may not hold a path separator or "
            "be '.' or '..'"
        )
    try:
        path = resolve_inside(directory, f"{name}/{BACKEND_FILE}", f"backend '{name}'")
    except OutsideFolder:
        return None  # a link that leads out of the backend directory is no backend of it
    except OSError:
        return None  # no such directory: nothing is found there
    return path if path.is_file() else None


class PythonBasedBackend:
    """One Python-based backend: the Python backend, running `backend_file` for the models
    whose config names it."""

    def __init__(self, python: PythonRunner, name: str, backend_file: Path) -> None:
        self.name = name
        self.backend_file = backend_file
        self._python = python

    def default_model_filename(self) -> str:
        return BACKEND_FILE

    def autocomplete(self, config: model_config_pb2.ModelConfig, model_path: Path) -> None:
        self._python.autocomplete(config, model_path, self.backend_file)

    def load(self, spec: ModelSpec) -> LoadedModel:
        return self._python.load(spec, self.backend_file)
