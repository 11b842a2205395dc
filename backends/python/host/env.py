"""`EXECUTION_ENV_PATH`: a model's own Python environment (a conda-pack archive, or one
already unpacked).

Workers always run the server's interpreter, as Triton's stub is built for one Python:
the environment's `lib/pythonX.Y/site-packages` goes first on the worker's import path,
its `bin` first on PATH and its `lib` on LD_LIBRARY_PATH. An environment for another
Python version cannot be used, and the load is refused saying so. An archive is unpacked
once (into a private folder, removed when the server stops), with tarfile's `data` filter:
nothing in it may land outside that folder or be a device or a link that leads out.
The path itself must stay inside the model folder (ge_serve.backends.paths).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

from ge_serve.backends.paths import execution_env_path
from ge_serve.protos import model_config_pb2

from .worker import Launch

PARAMETER = "EXECUTION_ENV_PATH"


def _python() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


class ExecutionEnvs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root: Path | None = None
        self._unpacked: dict[str, Path] = {}

    def launch(self, config: model_config_pb2.ModelConfig, model_dir: Path) -> Launch:
        """How this model's workers start; ValueError saying why its environment cannot
        be used."""
        entry = config.parameters.get(PARAMETER)
        value = str(entry.string_value) if entry is not None else ""
        if not value:
            return Launch()
        path = execution_env_path(model_dir, value)
        if path.is_dir():
            root = path
        elif path.is_file():
            root = self._unpack(path, value)
        else:
            raise ValueError(f"{PARAMETER} {value!r}: '{path}' does not exist")
        site = root / "lib" / _python() / "site-packages"
        if not site.is_dir():
            found = sorted(p.parent.name for p in (root / "lib").glob("python3*/site-packages"))
            has = f"is for {', '.join(found)}" if found else "holds no lib/python3.*/site-packages"
            raise ValueError(
                f"{PARAMETER} {value!r} {has}, but the server runs {_python()}: the "
                "environment must be built for the server's Python version"
            )
        env = {
            "PATH": os.pathsep.join([str(root / "bin"), os.environ.get("PATH", "")]),
            "LD_LIBRARY_PATH": os.pathsep.join(
                p for p in (str(root / "lib"), os.environ.get("LD_LIBRARY_PATH", "")) if p
            ),
            "CONDA_PREFIX": str(root),
            "PYTHONNOUSERSITE": "1",
        }
        return Launch(path=(str(site),), env=env)

    def _unpack(self, archive: Path, value: str) -> Path:
        stat = archive.stat()
        key = hashlib.sha256(f"{archive}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
        with self._lock:
            found = self._unpacked.get(key)
            if found is not None:
                return found
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="ge-serve-pyenv-"))
            target = self._root / key[:16]
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            try:
                with tarfile.open(archive) as tar:
                    tar.extractall(target, filter="data")
            except (tarfile.TarError, OSError) as exc:
                shutil.rmtree(target, ignore_errors=True)
                raise ValueError(f"{PARAMETER} {value!r} cannot be unpacked: {exc}") from None
            self._unpacked[key] = target
            return target

    def close(self) -> None:
        with self._lock:
            root, self._root = self._root, None
            self._unpacked.clear()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)
