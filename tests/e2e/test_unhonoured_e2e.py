"""Config fields ge-serve does not honour, end to end: a model whose config sets
`passive: true` or an `optimization` block loads and serves, and the server log has a
warning naming the field; one setting a field whose absence would change results
(`is_shape_tensor`) fails to load, and the reason names it (server/models/unhonoured.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from protocols import Triton
from serverproc import EXAMPLE_MODELS, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

EXTRA = {
    "passive": "\ninstance_group [ { count: 2 kind: KIND_CPU passive: true } ]\n",
    "optimized": "\noptimization { graph { level: 1 } input_pinned_memory { enable: true } }\n",
    "shape_tensor": "",
}


def _repo(root: Path) -> Path:
    for name, extra in EXTRA.items():
        folder = root / name
        shutil.copytree(EXAMPLE_MODELS / "simple", folder)
        config = (folder / "config.pbtxt").read_text().replace('"simple"', f'"{name}"')
        if name == "shape_tensor":
            config = config.replace('dims: [ 16 ]\n  },\n  {\n    name: "INPUT1"',
                                    'dims: [ 16 ]\n    is_shape_tensor: true\n  },\n'
                                    '  {\n    name: "INPUT1"', 1)  # fmt: skip
            assert "is_shape_tensor" in config
        (folder / "config.pbtxt").write_text(config + extra)
    return root


def test_ignored_fields_warn_by_name_and_the_models_serve(tmp_path: Path) -> None:
    repo = _repo(tmp_path / "models")
    with running_server([repo], ["--exit-on-error=false", "--strict-readiness=false"]) as server:
        triton = Triton.connect("http", server)
        try:
            x = np.arange(16, dtype=np.int32).reshape(1, 16)
            for model in ("passive", "optimized"):
                result = triton.infer(model, {"INPUT0": x, "INPUT1": x}, ("OUTPUT0",))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x + x)
            assert not triton.client.is_model_ready("shape_tensor")
            index = {m["name"]: m for m in triton.client.get_model_repository_index()}
        finally:
            triton.close()
        log = server.log()
    assert "model 'passive': config field 'instance_group[0].passive' is accepted and " \
        "not honoured" in log, log[-3000:]  # fmt: skip
    assert "model 'optimized': config field 'optimization' is accepted and not honoured" in log
    reason = index["shape_tensor"].get("reason", "")
    assert "'input[0].is_shape_tensor' is not supported" in reason, index["shape_tensor"]
