"""Ensembles as Triton's own qa tests use them, over the wire with tritonclient.

- Optional inputs (qa/L0_optional_input): an optional ensemble input the request leaves
  out, and an output a step's model did not produce, reach the next step as a missing
  (optional) input, and an ensemble output left so is missing from the response, even
  when the request names it.
- Batching and non-batching (qa/L0_infer_zero, gen_qa_identity_models.py --ensemble): a
  non-batching ensemble over a batching step sends the step a batch of 1 and answers
  without it, zero-size tensors included; a batching ensemble over a non-batching step
  the converse.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pymodels
import pytest
from protocols import PROTOCOLS, Triton
from serverproc import ServerProcess, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# qa/L0_optional_input's optional_identity: OUTPUTn = INPUTn for each input it was given,
# nothing for one it was not (one response per request here).
OPTIONAL_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for index in ("0", "1"):
                found = pb_utils.get_input_tensor_by_name(request, "INPUT" + index)
                if found is not None:
                    outputs.append(pb_utils.Tensor("OUTPUT" + index, found.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""

_PAIR = """
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] optional: true },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1 ] optional: true }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1 ] }
]
"""


def _step(reads: tuple[str, str], writes: tuple[str, str]) -> str:
    """A step over optional_identity: INPUTn reads reads[n], OUTPUTn writes writes[n]."""
    maps = [f'input_map {{ key: "INPUT{n}" value: "{t}" }}' for n, t in enumerate(reads)]
    maps += [f'output_map {{ key: "OUTPUT{n}" value: "{t}" }}' for n, t in enumerate(writes)]
    return f'{{ model_name: "optional_identity" model_version: -1 {" ".join(maps)} }}'


def write_optional(repo: Path) -> None:
    config = f'name: "optional_identity"\nbackend: "python"\nmax_batch_size: 4\n{_PAIR}'
    pymodels.write_model(repo, "optional_identity", OPTIONAL_IDENTITY, config)
    ensembles = {
        # qa's optional_connecting_tensor: two steps joined by both tensors.
        "optional_connecting_tensor": (
            _step(("INPUT0", "INPUT1"), ("internal_output0", "internal_output1")),
            _step(("internal_output0", "internal_output1"), ("OUTPUT0", "OUTPUT1")),
        ),
        # qa's ensemble_identity_2_float32: one step over the optional inputs.
        "optional_wrapper": (_step(("INPUT0", "INPUT1"), ("OUTPUT0", "OUTPUT1")),),
    }
    for name, steps in ensembles.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 4\n{_PAIR}'
            f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
        )


# Triton's identity backend as gen_qa_identity_models.py's nop models use it: OUTPUTn =
# INPUTn, whatever the shapes.
NOP = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for index in ("0", "1"):
                found = pb_utils.get_input_tensor_by_name(request, "INPUT" + index)
                outputs.append(pb_utils.Tensor("OUTPUT" + index, found.as_numpy()))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
"""


def _nop_config(name: str, max_batch_size: int) -> str:
    tensors = [
        f'{kind} [ {{ name: "{kind.upper()}{n}" data_type: TYPE_FP32 dims: [ -1 ] }} ]'
        for kind in ("input", "output")
        for n in (0, 1)
    ]
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch_size}\n'
        + "\n".join(tensors)
        + "\n"
    )


def write_batching(repo: Path) -> None:
    """gen_qa_identity_models.py's simple_zero_* ensembles: INPUT0 feeds both inputs of
    one nop step, its OUTPUT0 is the ensemble's."""
    for name, limit in (("nop_batch", 1024), ("nop_nobatch", 0)):
        pymodels.write_model(repo, name, NOP, _nop_config(name, limit))
    for name, limit, step in (
        ("nobatch_over_batch", 0, "nop_batch"),
        ("batch_over_nobatch", 8, "nop_nobatch"),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {limit}\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            f'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1 '
            'input_map { key: "INPUT0" value: "INPUT0" } '
            'input_map { key: "INPUT1" value: "INPUT0" } '
            'output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }\n'
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("qa-ensembles")
    write_optional(repo)
    write_batching(repo)
    with running_server([repo]) as proc:
        yield proc


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["optional_connecting_tensor", "optional_wrapper"])
@pytest.mark.parametrize("given", ["INPUT0", "INPUT1"])
def test_an_input_left_out_runs_the_steps_without_it(
    protocol: str, model: str, given: str, server: ServerProcess
) -> None:
    triton = Triton.connect(protocol, server)
    try:
        data = np.array([[7.0]], np.float32)
        produced = given.replace("IN", "OUT")
        other = "OUTPUT1" if given == "INPUT0" else "OUTPUT0"
        # As qa's test asks: the output of the input it gave.
        result = triton.infer(model, {given: data}, outputs=[produced])
        np.testing.assert_array_equal(result.as_numpy(produced), data)
        # Asking for none: the output no step produced is not in the response.
        result = triton.infer(model, {given: data})
        np.testing.assert_array_equal(result.as_numpy(produced), data)
        assert result.as_numpy(other) is None
        # Asking for both: answered with the one produced, as Triton answers.
        result = triton.infer(model, {given: data}, outputs=[produced, other])
        np.testing.assert_array_equal(result.as_numpy(produced), data)
        assert result.as_numpy(other) is None
        # Both given: both through.
        both = triton.infer(model, {"INPUT0": data, "INPUT1": data + 1})
        np.testing.assert_array_equal(both.as_numpy("OUTPUT0"), data)
        np.testing.assert_array_equal(both.as_numpy("OUTPUT1"), data + 1)
    finally:
        triton.close()


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("model", "shape"),
    [
        ("nobatch_over_batch", (3,)),
        ("nobatch_over_batch", (0,)),
        ("batch_over_nobatch", (1, 3)),
        ("batch_over_nobatch", (1, 0)),
    ],
)
def test_a_batch_dimension_is_added_and_removed_between_the_ensemble_and_its_step(
    protocol: str, model: str, shape: tuple[int, ...], server: ServerProcess
) -> None:
    triton = Triton.connect(protocol, server)
    try:
        data = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        result = triton.infer(model, {"INPUT0": data})
        # The shape the client sent, not the step's.
        output = result.as_numpy("OUTPUT0")
        assert output.shape == shape
        np.testing.assert_array_equal(output, data)
    finally:
        triton.close()
