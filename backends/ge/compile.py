"""ONNX and TensorFlow `.pb` to OM through CANN's `atc` tool, with an on-disk cache.

On an NPU, a model is compiled once per (file content, options, SoC) and the OM is kept in
the cache folder; a later load with the same key skips `atc` entirely.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import external_data_helper

from .option_tables import ATC_FILE_FLAGS

log = logging.getLogger(__name__)

FRAMEWORKS = {".onnx": 5, ".pb": 3}
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "ge-serve" / "om"
ATC_TIMEOUT_S = 3600.0

# (command, timeout, working folder): atc runs in the folder and writes its side files
# (fusion_result.json, kernel_meta/, logs) there rather than into the server's cwd.
Runner = Callable[[Sequence[str], float, Path], "subprocess.CompletedProcess[str]"]


class CompileError(RuntimeError):
    """`atc` could not compile a model; the message carries the tail of its output."""


@dataclass(frozen=True, slots=True)
class AtcJob:
    model: Path
    soc_version: str
    input_shape: str = ""
    dynamic_batch_size: tuple[int, ...] = ()
    # Further `atc` flags (without the leading dashes), in a stable order.
    options: tuple[tuple[str, str], ...] = ()

    @property
    def framework(self) -> int:
        framework = FRAMEWORKS.get(self.model.suffix.lower())
        if framework is None:
            raise CompileError(
                f"'{self.model.name}': atc compiles ONNX (.onnx) and TensorFlow (.pb) models, "
                "not this kind of file"
            )
        return framework


def _run(cmd: Sequence[str], timeout: float, work: Path) -> subprocess.CompletedProcess[str]:
    # CANN writes what atc leaves besides the OM into ASCEND_WORK_PATH when it is set, and
    # into the current folder otherwise: both point at the compile's scratch folder, which
    # goes with the compile.
    env = {**os.environ, "ASCEND_WORK_PATH": str(work)}
    return subprocess.run(
        list(cmd), capture_output=True, text=True, timeout=timeout, check=False, cwd=work, env=env
    )


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _digest_or_missing(path: Path) -> str:
    """A regular file's digest; folders (op_bank_path, debug_dir) and missing paths by
    kind only (atc reports a missing file itself)."""
    if path.is_file():
        return file_digest(path)
    return "folder" if path.is_dir() else "missing"


def external_data(model: Path) -> list[str]:
    """The files (relative to the model's folder) an ONNX model keeps tensors in, from
    the graph alone (the weights are not read). Empty for other models, and for a file
    onnx cannot parse (atc then fails on it with its own message)."""
    if model.suffix.lower() != ".onnx":
        return []
    try:
        proto = onnx.load(str(model), load_external_data=False)
    except Exception:
        return []
    # Subgraphs (If/Loop bodies) and functions hold tensors too.
    graphs: list[onnx.GraphProto | onnx.FunctionProto] = [proto.graph, *proto.functions]
    locations: set[str] = set()
    while graphs:
        graph = graphs.pop()
        tensors: list[onnx.TensorProto] = list(getattr(graph, "initializer", ()))
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.HasField("t"):
                    tensors.append(attribute.t)
                tensors.extend(attribute.tensors)
                if attribute.HasField("g"):
                    graphs.append(attribute.g)
                graphs.extend(attribute.graphs)
        for sparse in getattr(graph, "sparse_initializer", ()):
            tensors.extend((sparse.values, sparse.indices))
        for tensor in tensors:
            if external_data_helper.uses_external_data(tensor):
                locations.add(external_data_helper.ExternalDataInfo(tensor).location)
    return sorted(locations)


class AtcCompiler:
    """Runs `atc` (found on PATH) and keeps its OM files in `cache_dir`."""

    def __init__(
        self, cache_dir: Path | None = None, atc: str = "atc", runner: Runner = _run
    ) -> None:
        self.cache_dir = cache_dir or DEFAULT_CACHE_DIR
        self.atc = atc
        self._runner = runner
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self.hits = 0
        self.misses = 0

    def command(self, job: AtcJob, output_stem: Path) -> list[str]:
        """The atc command line; atc writes `<output_stem>.om`. Paths are absolute: atc
        runs in its scratch folder, and a relative path (a relative repository or cache
        folder, a `--backend-config` file option) means the server's current folder."""
        cmd = [
            self.atc,
            f"--model={os.path.abspath(job.model)}",
            f"--framework={job.framework}",
            f"--output={os.path.abspath(output_stem)}",
            f"--soc_version={job.soc_version}",
        ]
        if job.input_shape:
            cmd.append(f"--input_shape={job.input_shape}")
        if job.dynamic_batch_size:
            cmd.append("--dynamic_batch_size=" + ",".join(str(g) for g in job.dynamic_batch_size))
        for flag, value in job.options:
            if flag in ATC_FILE_FLAGS and value:
                value = os.path.abspath(value)
            cmd.append(f"--{flag}={value}")
        if not any(flag == "log" for flag, _ in job.options):
            cmd.append("--log=error")
        return cmd

    def cache_key(self, job: AtcJob) -> str:
        """What the OM depends on: the model, its external data, the contents of the
        files the options name (an edited AIPP config must not reuse the old OM), the
        options themselves, and which atc compiles it."""
        described = {
            "file": file_digest(job.model),
            "external_data": {
                location: _digest_or_missing(job.model.parent / location)
                for location in external_data(job.model)
            },
            "option_files": {
                flag: _digest_or_missing(Path(value))
                for flag, value in job.options
                if flag in ATC_FILE_FLAGS and value
            },
            "atc": self._atc_identity(),
            "framework": job.framework,
            "soc_version": job.soc_version,
            "input_shape": job.input_shape,
            "dynamic_batch_size": list(job.dynamic_batch_size),
            "options": [list(o) for o in job.options],
        }
        text = json.dumps(described, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def _atc_identity(self) -> str:
        """The atc binary's real path, size and change time: a CANN upgrade (a new
        versioned folder behind `latest`, or a new binary in place) compiles anew."""
        found = self.atc if os.sep in self.atc else shutil.which(self.atc)
        if found is None:
            return ""
        try:
            real = os.path.realpath(found)
            stat = os.stat(real)
        except OSError:
            return ""
        return f"{real}:{stat.st_size}:{stat.st_mtime_ns}"

    def compile(self, job: AtcJob) -> tuple[Path, bool]:
        """Return the OM for `job` and whether it came from the cache."""
        if not job.model.is_file():
            raise CompileError(f"model file '{job.model}' does not exist")
        key = self.cache_key(job)
        target = self.cache_dir / f"{job.model.stem}-{key}.om"
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            if target.is_file():
                self.hits += 1
                log.info("atc cache hit for '%s': %s", job.model, target)
                return target, True
            self.misses += 1
            self._compile_into(job, target)
            return target, False

    def _compile_into(self, job: AtcJob, target: Path) -> None:
        if os.sep not in self.atc and shutil.which(self.atc) is None:
            raise CompileError(
                f"the `{self.atc}` tool is not on PATH; it comes with the CANN toolkit "
                "(source /usr/local/Ascend/ascend-toolkit/set_env.sh), or serve a prebuilt .om"
            )
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="atc-", dir=self.cache_dir) as scratch:
            # Absolute: atc runs inside it, where a relative path would mean another folder.
            work = Path(os.path.abspath(scratch))
            stem = work / "model"
            cmd = self.command(job, stem)
            log.info("compiling '%s' with atc: %s", job.model, " ".join(cmd))
            try:
                done = self._runner(cmd, ATC_TIMEOUT_S, work)
            except subprocess.TimeoutExpired:
                raise CompileError(
                    f"atc did not finish compiling '{job.model}' in {ATC_TIMEOUT_S:.0f}s"
                ) from None
            except OSError as exc:
                raise CompileError(f"could not run atc: {exc}") from None
            produced = stem.with_suffix(".om")
            if done.returncode != 0 or not produced.is_file():
                output = (done.stdout or "") + (done.stderr or "")
                tail = "\n".join(output.strip().splitlines()[-20:])
                raise CompileError(
                    f"atc failed to compile '{job.model}' (exit code {done.returncode}):\n{tail}"
                )
            os.replace(produced, target)
        log.info("atc compiled '%s' into %s", job.model, target)
