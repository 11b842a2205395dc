"""Shared pieces of the GE backend tests: model folders, configs and specs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from fake_acl import FakeAcl, build_module
from google.protobuf import text_format

from ge_serve.backends.base import ModelSpec
from ge_serve.backends.ge.acl import AclRuntime
from ge_serve.backends.ge.acl_real import AclReal
from ge_serve.backends.ge.acl_sim import SimRuntime
from ge_serve.backends.ge.compile import AtcCompiler
from ge_serve.protos import model_config_pb2

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "examples" / "models"
FAKE_ACL = Path(__file__).resolve().parent / "fake_acl"
FAKE_ATC_BIN = FAKE_ACL / "bin"
FAKE_ACL_SITE = FAKE_ACL / "site"

SIMPLE_IO = """
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""


def params(**values: str) -> str:
    """A `parameters [...]` block; keys may contain dots, given as k__dot__ in kwargs."""
    entries = []
    for key, text in values.items():
        real = key.replace("__dot__", ".")
        entries.append(f'{{ key: "{real}" value: {{ string_value: "{text}" }} }}')
    return "parameters [\n  " + ",\n  ".join(entries) + "\n]\n"


def make_model(
    repo: Path,
    name: str,
    config_body: str,
    source: Path | None = None,
    filename: str = "model.onnx",
    onnx_model: onnx.ModelProto | None = None,
) -> Path:
    """Write `<repo>/<name>/config.pbtxt` and `1/<filename>` (copied or serialized)."""
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}"\n{config_body}', encoding="utf-8")
    target = folder / "1" / filename
    if onnx_model is not None:
        onnx.save(onnx_model, str(target))
    elif source is not None:
        shutil.copyfile(source, target)
    return folder


def spec_for(folder: Path, filename: str = "model.onnx") -> ModelSpec:
    config = model_config_pb2.ModelConfig()
    text_format.Parse((folder / "config.pbtxt").read_text(encoding="utf-8"), config)
    return ModelSpec(
        name=config.name,
        version=1,
        config=config,
        model_dir=folder,
        model_path=folder / "1" / filename,
    )


def simple_inputs(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "INPUT0": rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32),
        "INPUT1": rng.integers(-1000, 1000, size=(batch, 16), dtype=np.int32),
    }


def ge_runtime(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AclRuntime]:
    """The body of a GE test's `runtime` fixture for `kind` "sim" (the simulated NPU) or
    "fake-acl" (the real pyACL path over the strict fake `acl` and `atc`, its compiles
    logged to tmp_path/atc.log); the fake's leaks and violations are checked at the end."""
    if kind == "sim":
        yield SimRuntime()
        return
    monkeypatch.setenv("PATH", f"{FAKE_ATC_BIN}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ACL_SOC", "Ascend310P3")
    monkeypatch.setenv("FAKE_ATC_LOG", str(tmp_path / "atc.log"))
    fake = FakeAcl(soc="Ascend310P3")
    real = AclReal(build_module(fake), AtcCompiler(tmp_path / "om"))
    yield real
    real.shutdown()
    assert fake.leaks() == []
    assert fake.violations == []
