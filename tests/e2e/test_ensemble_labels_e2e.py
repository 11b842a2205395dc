"""An ensemble's classification labels, over the wire with tritonclient.

Triton's core completes an ensemble's labels when it loads (model_lifecycle.cc): an output
with no `label_filename` of its own takes the labels of the step output that writes it,
those of a nested ensemble included; one with its own keeps them. qa's L0_infer
(infer_util.py) checks `value:index:label` from `simple_*` ensembles over labelled models.
When a step's model reloads, the ensemble reloads with it and takes its new labels.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from modelgen import identity_model, write_model
from onnx import TensorProto
from protocols import PROTOCOLS, Triton
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

_IO = """
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ]{labels} }} ]
"""
SCORES = np.array([0.1, 0.7, 0.15, 0.05], np.float32)


def _io(labels: str = "") -> str:
    return _IO.format(labels=f' label_filename: "{labels}"' if labels else "")


def write_scores(repo: Path, name: str, labels: list[str]) -> None:
    """OUTPUT = INPUT, OUTPUT labelled."""
    config = f'name: "{name}"\nbackend: "onnxruntime"\n{_io("labels.txt")}'
    folder = write_model(repo, name, identity_model(TensorProto.FLOAT, [4]), config)
    (folder / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")


def write_ensemble(repo: Path, name: str, step: str, labels: list[str] | None = None) -> None:
    """One step over `step`, its OUTPUT the ensemble's; `labels`: the ensemble's own."""
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    if labels is not None:
        (folder / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    (folder / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\n{_io("labels.txt" if labels else "")}'
        f'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1 '
        'input_map { key: "INPUT" value: "INPUT" } '
        'output_map { key: "OUTPUT" value: "OUTPUT" } } ] }\n',
        encoding="utf-8",
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("labels")
    write_scores(repo, "scores", ["cat", "dog", "bird", "fish"])
    write_ensemble(repo, "inherits", "scores")
    write_ensemble(repo, "own_labels", "scores", ["A", "B", "C", "D"])
    write_ensemble(repo, "nested", "inherits")
    # For the reload test alone, so the others see "scores" unchanged.
    write_scores(repo, "reloaded", ["cat", "dog", "bird", "fish"])
    write_ensemble(repo, "follows", "reloaded")
    extra = ["--model-control-mode=explicit", "--load-model=*"]
    with running_server([repo], extra) as proc:
        yield proc


@pytest.fixture(params=PROTOCOLS)
def triton(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Triton]:
    connected = Triton.connect(request.param, server)
    yield connected
    connected.close()


def top2(triton: Triton, model: str) -> list[bytes]:
    result = triton.infer(model, {"INPUT": SCORES}, ["OUTPUT"], class_count=2)
    return list(result.as_numpy("OUTPUT"))


def test_an_ensemble_output_takes_its_steps_labels_unless_it_has_its_own(
    triton: Triton,
) -> None:
    assert top2(triton, "scores") == [b"0.700000:1:dog", b"0.150000:2:bird"]
    assert top2(triton, "inherits") == [b"0.700000:1:dog", b"0.150000:2:bird"]
    assert top2(triton, "own_labels") == [b"0.700000:1:B", b"0.150000:2:C"]


def test_a_nested_ensemble_takes_the_labels_its_step_took(triton: Triton) -> None:
    assert top2(triton, "nested") == [b"0.700000:1:dog", b"0.150000:2:bird"]


def test_a_reloaded_step_gives_the_ensemble_its_new_labels(
    server: ServerProcess, triton: Triton
) -> None:
    folder = Path(server.args[server.args.index("--model-repository") + 1]) / "reloaded"
    names = ["north", "east", "south", "west"] if triton.protocol == "http" else list("wxyz")
    (folder / "labels.txt").write_text("\n".join(names) + "\n", encoding="utf-8")
    triton.client.load_model("reloaded")
    want = [f"0.700000:1:{names[1]}".encode(), f"0.150000:2:{names[2]}".encode()]
    assert top2(triton, "reloaded") == want
    assert top2(triton, "follows") == want
