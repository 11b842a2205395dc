"""Every path a model config names stays inside the model's folder.

For each path field, an absolute path, a '../' path and a symbolic link pointing out fail
the load with a reason that names the field. The reason is the same whether the file
outside exists or not, the file's content shows up nowhere, and nothing outside the folder
is opened, listed or stat'ed: an audit hook and wrappers around os.stat and friends watch
the outside folder while the load runs. The tests that watch run in a pytest process of
their own, which the first test here starts (tests/ownprocess.py says why). The end-to-end
test sends such configs through the HTTP and gRPC load APIs, with and without `file:`
overrides.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from modelgen import identity_model, write_model
from onnx import TensorProto
from ownprocess import WATCH_PROCESS

from ge_serve.backends.ge.option_tables import ATC_FILE_FLAGS, FILE_OPTIONS
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.backends.paths import OutsideFolder, execution_env_path, resolve_inside
from ge_serve.protos import model_config_pb2
from ge_serve.server.control.model_control import parse_config_json
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.http import encode
from ge_serve.server.models.autocomplete import resolve_backend, resolve_model_file
from ge_serve.server.models.lifecycle import LoadOverride, ModelLifecycle
from ge_serve.server.models.repository import fingerprint, write_overrides

INSIDE = "must name a file inside the model folder"
MODEL = identity_model(TensorProto.FLOAT, ("batch", 3))
BASE = 'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 2\n'


# --- watching the file system outside the folder -------------------------------------------


def test_the_watched_tests_pass_in_a_process_of_their_own() -> None:
    """Every test below that takes `watch` runs, and passes, in a pytest process started for
    them; the shared process leaves them out."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", __file__],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, WATCH_PROCESS: "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = result.stdout.strip().splitlines()[-1:] or [result.stderr]
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    passed = re.search(r"(\d+) passed", summary[0])
    assert passed is not None and int(passed.group(1)) >= len(FIELDS) * len(FORMS), summary


@dataclass
class Watch:
    """Records every open, listing, stat and readlink of a path under `roots`."""

    roots: list[str]
    secret: Path
    content: str
    touched: list[str] = field(default_factory=list)

    def see(self, event: str, target: Any) -> None:
        if isinstance(target, int) or not isinstance(target, str | bytes | os.PathLike):
            return
        text = os.path.abspath(os.fsdecode(target))
        if any(text == root or text.startswith(root + os.sep) for root in self.roots):
            self.touched.append(f"{event} {text}")


_ACTIVE: list[Watch] = []
_HOOKED: list[bool] = []
_AUDITED = ("open", "os.listdir", "os.scandir")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _ACTIVE and event in _AUDITED and args:
        for watch in _ACTIVE:
            watch.see(event, args[0])


def _wrapped(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def call(path: Any, *args: Any, **kwargs: Any) -> Any:
        for watch in _ACTIVE:
            watch.see(name, path)
        return real(path, *args, **kwargs)

    return call


@pytest.fixture
def watch(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Watch]:
    """A folder outside the repository holding a secret; nothing may look at it."""
    if not _HOOKED:
        # Audit hooks cannot be removed; this one does nothing while no watch is active.
        sys.addaudithook(_audit)
        _HOOKED.append(True)
    outside = tmp_path_factory.mktemp("outside")
    content = f"SECRET-{uuid.uuid4().hex}"
    secret = outside / "secret.txt"
    secret.write_text(content)
    watched = Watch([str(outside)], secret, content)
    for name in ("stat", "lstat", "readlink", "listdir", "scandir"):
        monkeypatch.setattr(os, name, _wrapped(name, getattr(os, name)))
    _ACTIVE.append(watched)
    try:
        yield watched
    finally:
        _ACTIVE.remove(watched)


def test_the_watch_sees_a_read_outside(watch: Watch) -> None:
    assert watch.secret.read_text() == watch.content
    Path(watch.secret).is_file()
    assert [e.split()[0] for e in watch.touched] == ["open", "stat"]


# --- every path field, in every form that leads out ----------------------------------------


def q(value: str) -> str:
    return json.dumps(value)


def param(key: str) -> Callable[[str], str]:
    return lambda v: f'parameters {{ key: "{key}" value: {{ string_value: {q(v)} }} }}'


@dataclass(frozen=True)
class PathField:
    label: str  # how the reason names it
    base: str  # the folder its value starts from, inside the model folder
    config: Callable[[str], str]


WARMUP = (
    'model_warmup [ {{ name: "w" batch_size: 1 inputs {{ key: "INPUT" value: {{ '
    "data_type: TYPE_FP32 dims: [ 3 ] input_data_file: {} }} }} }} ]"
)
FIELDS: dict[str, PathField] = {
    "default_model_filename": PathField(
        "default_model_filename", "1", lambda v: f"default_model_filename: {q(v)}"
    ),
    "label_filename": PathField(
        "label_filename",
        "",
        lambda v: f'output [ {{ name: "OUTPUT" label_filename: {q(v)} }} ]',
    ),
    "input_data_file": PathField("input_data_file", "warmup", lambda v: WARMUP.format(q(v))),
    "cc_model_filenames": PathField(
        "cc_model_filenames", "1", lambda v: f'cc_model_filenames {{ key: "7.5" value: {q(v)} }}'
    ),
    "EXECUTION_ENV_PATH": PathField(
        "parameter EXECUTION_ENV_PATH", "", param("EXECUTION_ENV_PATH")
    ),
    "graph.ge.fusionSwitchFile": PathField(
        "parameter graph.ge.fusionSwitchFile", "", param("graph.ge.fusionSwitchFile")
    ),
    "atc.fusion-switch-file": PathField(
        "parameter atc.fusion-switch-file", "", param("atc.fusion-switch-file")
    ),
}
for _key in sorted(FILE_OPTIONS) + [f"atc.{flag}" for flag in sorted(ATC_FILE_FLAGS)]:
    FIELDS[_key] = PathField(f"parameter {_key}", "", param(_key))

FORMS = ("absolute", "dotdot", "link", "relative-link")


def relative(target: Path, start: Path) -> str:
    """`target` as a '../' path from `start` (lexical: nothing is looked up)."""
    return os.path.relpath(target, start)


def place(form: str, base_dir: Path, target: Path) -> str:
    """The value that reaches `target` from `base_dir` in this form (making any link)."""
    if form == "absolute":
        return str(target)
    if form == "dotdot":
        return relative(target, base_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    pointed = str(target) if form == "link" else relative(target, base_dir)
    os.symlink(pointed, base_dir / "leak")
    return "leak"


async def failed_load(
    lifecycle: ModelLifecycle, name: str, override: LoadOverride | None = None
) -> str:
    with pytest.raises(ServerError) as info:
        await lifecycle.load(name, override)
    assert info.value.code is ErrorCode.INVALID_ARG
    return info.value.message


def assert_kept_secret(watch: Watch, *texts: str) -> None:
    assert watch.touched == []
    for text in texts:
        assert watch.content not in text


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("name", list(FIELDS))
async def test_a_path_field_that_leads_out_fails_the_load(
    tmp_path: Path,
    lifecycle: ModelLifecycle,
    watch: Watch,
    caplog: pytest.LogCaptureFixture,
    name: str,
    form: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    path_field = FIELDS[name]
    folder = write_model(tmp_path, "m", MODEL)
    value = place(form, folder / path_field.base, watch.secret)
    (folder / "config.pbtxt").write_text(BASE + path_field.config(value))

    message = await failed_load(lifecycle, "m")
    assert f"{path_field.label} {value!r}" in message
    assert INSIDE in message
    # Whether the file outside exists changes nothing in what the client sees.
    watch.secret.unlink()
    assert await failed_load(lifecycle, "m") == message
    index = json.dumps(encode.repository_index(lifecycle.index()))
    assert_kept_secret(watch, message, caplog.text, index)


async def test_the_backends_default_model_file_may_not_link_out(
    tmp_path: Path, lifecycle: ModelLifecycle, watch: Watch
) -> None:
    folder = write_model(tmp_path, "m", None, BASE)
    os.symlink(watch.secret, folder / "1" / "model.onnx")
    message = await failed_load(lifecycle, "m")
    assert f"default_model_filename 'model.onnx' {INSIDE}" in message
    # Choosing a backend reads the ONNX file too (for GE, whether an NPU can hold it).
    config = model_config_pb2.ModelConfig(name="m")
    backends = {"ge": OnnxRuntimeBackend(), "onnxruntime": OnnxRuntimeBackend()}
    with pytest.raises(ServerError, match=INSIDE):
        resolve_backend(config, backends, "ge", folder / "1")  # type: ignore[arg-type]
    assert_kept_secret(watch, message)


def test_a_python_backends_model_py_is_held_to_the_same_rule(tmp_path: Path, watch: Watch) -> None:
    (tmp_path / "1").mkdir()
    assert resolve_model_file(tmp_path, "1", "model.py") == tmp_path.resolve() / "1" / "model.py"
    os.symlink(watch.secret, tmp_path / "1" / "model.py")
    with pytest.raises(OutsideFolder, match=f"default_model_filename 'model.py' {INSIDE}"):
        resolve_model_file(tmp_path, "1", "model.py")
    assert_kept_secret(watch)


def test_execution_env_path_may_start_with_the_model_directory(tmp_path: Path) -> None:
    root = tmp_path.resolve()
    assert execution_env_path(tmp_path, "$$TRITON_MODEL_DIRECTORY/env/py.tar.gz") == (
        root / "env" / "py.tar.gz"
    )
    assert execution_env_path(tmp_path, "$$TRITON_MODEL_DIRECTORY") == root
    assert execution_env_path(tmp_path, "env.tar.gz") == root / "env.tar.gz"
    for value in ("$$TRITON_MODEL_DIRECTORY/../x.tar.gz", "$$TRITON_MODEL_DIRECTORY_other/x"):
        with pytest.raises(
            OutsideFolder, match=re.escape(f"EXECUTION_ENV_PATH {value!r} {INSIDE}")
        ):
            execution_env_path(tmp_path, value)


async def test_a_config_pbtxt_linked_out_is_not_read(
    tmp_path: Path, lifecycle: ModelLifecycle, watch: Watch
) -> None:
    folder = write_model(tmp_path, "m", MODEL)
    os.symlink(watch.secret, folder / "config.pbtxt")
    message = await failed_load(lifecycle, "m")
    assert f"config.pbtxt {INSIDE}" in message
    assert_kept_secret(watch, message)


async def test_a_version_folder_linked_out_is_not_served(
    tmp_path: Path, lifecycle: ModelLifecycle, watch: Watch
) -> None:
    elsewhere = write_model(Path(watch.roots[0]), "v", MODEL)
    watch.touched.clear()  # the setup above
    folder = write_model(tmp_path, "m", None, BASE, versions=[])
    os.symlink(elsewhere / "1", folder / "1")
    message = await failed_load(lifecycle, "m")
    assert "no version folder to serve" in message
    assert_kept_secret(watch, message)


async def test_an_api_load_with_files_stays_inside_its_override_folder(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    lifecycle: ModelLifecycle,
    watch: Watch,
) -> None:
    """The repository's own folder is outside a `file:` override load's folder."""
    repo_model = write_model(tmp_path, "m", MODEL, BASE)
    (repo_model / "labels.txt").write_text(watch.content)
    watch.roots.append(str(repo_model))
    override = tmp_path_factory.mktemp("override") / "m"
    for value in (
        str(repo_model / "labels.txt"),
        relative(repo_model / "labels.txt", override),
    ):
        override.mkdir()
        write_overrides(override, {"1/model.onnx": MODEL.SerializeToString()})
        text = json.dumps({"name": "m", "output": [{"name": "OUTPUT", "label_filename": value}]})
        config = parse_config_json("m", text)
        message = await failed_load(lifecycle, "m", LoadOverride(config=config, folder=override))
        assert f"label_filename {value!r} of output 'OUTPUT' {INSIDE}" in message
        assert not override.exists()  # a failed load removes its override folder
        assert_kept_secret(watch, message)


# --- paths that stay inside ----------------------------------------------------------------


async def test_paths_that_stay_inside_load_and_read_the_resolved_files(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    lifecycle: ModelLifecycle,
) -> None:
    # The model folder itself may be a link (the operator's choice); links inside it may
    # name it by its real path or by the repository's path.
    real = tmp_path_factory.mktemp("storage") / "m"
    (real / "data").mkdir(parents=True)
    (real / "shared").mkdir()
    (real / "1").mkdir()
    (real / "shared" / "net.onnx").write_bytes(MODEL.SerializeToString())
    (real / "data" / "labels.txt").write_text("a\nb\nc\n")
    (real / "data" / "in.bin").write_bytes(np.arange(3, dtype=np.float32).tobytes())
    os.symlink(real, tmp_path / "m")
    os.symlink("data/labels.txt", real / "labels.txt")
    (real / "warmup").mkdir()
    os.symlink(tmp_path / "m" / "data" / "in.bin", real / "warmup" / "in")
    os.symlink(real / "data", real / "data-by-real-path")
    config = (
        BASE
        + 'default_model_filename: "../shared/net.onnx"\n'
        + 'output [ { name: "OUTPUT" label_filename: "data-by-real-path/../labels.txt" } ]\n'
        + WARMUP.format(q("in"))
    )
    (real / "config.pbtxt").write_text(config)
    await lifecycle.load("m")
    model = lifecycle.get("m")
    assert model.labels == {"OUTPUT": ["a", "b", "c"]}
    assert model.config.default_model_filename == "../shared/net.onnx"


# --- the resolver --------------------------------------------------------------------------


def test_links_are_followed_inside_and_dotdot_climbs_from_where_they_lead(
    tmp_path: Path,
) -> None:
    root = tmp_path.resolve()
    (root / "deep" / "er").mkdir(parents=True)
    os.symlink("deep/er", root / "short")
    assert resolve_inside(root, "short/../x", "f") == root / "deep" / "x"
    assert resolve_inside(root, "short/..", "f") == root / "deep"
    assert resolve_inside(root, "missing/../x", "f") == root / "x"
    os.symlink("b", root / "a")
    os.symlink("a", root / "b")
    with pytest.raises(OutsideFolder, match="too many symbolic links"):
        resolve_inside(root, "a", "f")
    cases = {
        "": "it is empty",
        "x\x00y": "NUL byte",
        "/etc/passwd": "absolute paths are not allowed",
        "deep/../../x": "'..' leads out of the folder",
    }
    for value, reason in cases.items():
        with pytest.raises(OutsideFolder, match=reason):
            resolve_inside(root, value, "f")


def test_fingerprint_counts_links_without_following_them(tmp_path: Path, watch: Watch) -> None:
    folder = write_model(tmp_path, "m", MODEL, BASE)
    os.symlink(watch.secret, folder / "labels.txt")
    os.symlink(watch.secret.parent, folder / "2")
    first = fingerprint(folder)
    os.remove(folder / "labels.txt")
    os.symlink(watch.secret.parent / "other", folder / "labels.txt")
    assert fingerprint(folder) != first
    assert_kept_secret(watch)
