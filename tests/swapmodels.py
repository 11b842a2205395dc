"""Models whose versions answer differently, for load/reload/unload tests.

`addk` version k adds k to its input, so a response says which version served it both in
`model_version` and in its data.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from modelgen import add_const_model, slow_model

ADDK = "addk"
WIDTH = 4


def addk_config(policy: str = "", name: str = ADDK, label_file: str = "") -> str:
    label = f' label_filename: "{label_file}"' if label_file else ""
    return (
        f'name: "{name}"\n'
        'backend: "onnxruntime"\n'
        "max_batch_size: 8\n"
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]\n'
        f'output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4]{label} }}]\n'
        "instance_group [{ count: 1 kind: KIND_CPU }]\n"
        'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
        f"{policy}\n"
    )


def write_atomic(path: Path, data: bytes | str) -> None:
    """Replace a file in one rename, as deploy tools do, so a poll never reads half of it."""
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as handle:
        handle.write(raw)
    os.replace(tmp, path)


def write_addk_version(folder: Path, version: int, constant: float | None = None) -> None:
    version_dir = folder / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    model = add_const_model(float(version if constant is None else constant))
    write_atomic(version_dir / "model.onnx", model.SerializeToString())


def write_addk(
    repo: Path, versions: Sequence[int] = (1,), policy: str = "", name: str = ADDK
) -> Path:
    folder = repo / name
    folder.mkdir(parents=True, exist_ok=True)
    for version in versions:
        write_addk_version(folder, version)
    write_atomic(folder / "config.pbtxt", addk_config(policy, name))
    return folder


SLOW = "slow"


def write_slow(repo: Path, name: str = SLOW) -> Path:
    """`slow`: Y = tanh(X @ W) ITERS times, no batching, one slot."""
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "1" / "model.onnx").write_bytes(slow_model().SerializeToString())
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: 0\n'
        "instance_group [{ count: 1 kind: KIND_CPU }]\n"
        'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n',
        encoding="utf-8",
    )
    return folder
