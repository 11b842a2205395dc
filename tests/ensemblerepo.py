"""Ensemble repositories for tests and benchmarks: small ONNX step models and the
`config.pbtxt` text of ensembles over them.

Step models (FP32 [batch, 4], max_batch_size 8, one CPU slot):
- `add1`, `add10`: OUTPUT0 = INPUT0 + 1 (+ 10); inputs INPUT0, outputs OUTPUT0.
- `add_sub`: SUM = A + B, DIFF = A - B.
- `ident`: OUTPUT = INPUT (the identity).

Ensembles:
- `chain`: IN -> add1 -> add10 -> OUT (OUT = IN + 11).
- `diamond`: IN -> add1 -> a, IN -> add10 -> b, (a, b) -> add_sub -> SUM, DIFF
  (SUM = 2 IN + 11, DIFF = -9); add1 and add10 can run at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from modelgen import add_const_model, add_sub_model, identity_model, write_model
from onnx import TensorProto

WIDTH = 4
SLOT = (
    "instance_group [{ count: 1 kind: KIND_CPU }]\n"
    'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
)


def tensor(name: str, data_type: str = "TYPE_FP32", dims: Sequence[int] = (WIDTH,)) -> str:
    return f'{{ name: "{name}" data_type: {data_type} dims: [{", ".join(map(str, dims))}] }}'


def model_config(
    name: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    extra: str = "",
    max_batch_size: int = 8,
) -> str:
    return (
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch_size}\n'
        f"input [{', '.join(tensor(n) for n in inputs)}]\n"
        f"output [{', '.join(tensor(n) for n in outputs)}]\n{SLOT}{extra}\n"
    )


def write_addk(repo: Path, name: str, constant: float, extra: str = "") -> Path:
    config = model_config(name, ["INPUT0"], ["OUTPUT0"], extra)
    return write_model(repo, name, add_const_model(constant, WIDTH), config)


def write_add_sub(repo: Path, name: str = "add_sub", extra: str = "") -> Path:
    config = model_config(name, ["A", "B"], ["SUM", "DIFF"], extra)
    return write_model(repo, name, add_sub_model(("batch", WIDTH)), config)


def write_ident(repo: Path, name: str = "ident", extra: str = "") -> Path:
    model = identity_model(TensorProto.FLOAT, ("batch", WIDTH))
    return write_model(repo, name, model, model_config(name, ["INPUT"], ["OUTPUT"], extra))


def step(
    model: str, inputs: Mapping[str, str], outputs: Mapping[str, str], version: int = -1
) -> str:
    """One `step` of `ensemble_scheduling`: the step model's tensor -> the ensemble's."""

    def entries(field: str, mapping: Mapping[str, str]) -> str:
        return " ".join(f'{field} {{ key: "{k}" value: "{v}" }}' for k, v in mapping.items())

    return (
        f'{{ model_name: "{model}" model_version: {version} '
        f"{entries('input_map', inputs)} {entries('output_map', outputs)} }}"
    )


def ensemble_config(
    name: str,
    steps: Sequence[str],
    inputs: Sequence[str] = (tensor("IN"),),
    outputs: Sequence[str] = (tensor("OUT"),),
    max_batch_size: int = 8,
    extra: str = "",
) -> str:
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
        f"input [{', '.join(inputs)}]\noutput [{', '.join(outputs)}]\n"
        f"ensemble_scheduling {{ step [{', '.join(steps)}] }}\n{extra}\n"
    )


def write_ensemble(repo: Path, name: str, config: str) -> Path:
    """An ensemble folder: its config and an empty version folder, as Triton wants."""
    return write_model(repo, name, None, config)


CHAIN_STEPS = (
    step("add1", {"INPUT0": "IN"}, {"OUTPUT0": "mid"}),
    step("add10", {"INPUT0": "mid"}, {"OUTPUT0": "OUT"}),
)

DIAMOND_STEPS = (
    step("add1", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
    step("add10", {"INPUT0": "IN"}, {"OUTPUT0": "b"}),
    step("add_sub", {"A": "a", "B": "b"}, {"SUM": "SUM", "DIFF": "DIFF"}),
)


def write_pipelines(repo: Path, add1_extra: str = "") -> Path:
    """add1, add10, add_sub, and the `chain` and `diamond` ensembles over them."""
    write_addk(repo, "add1", 1.0, add1_extra)
    write_addk(repo, "add10", 10.0)
    write_add_sub(repo)
    write_ensemble(repo, "chain", ensemble_config("chain", CHAIN_STEPS))
    diamond = ensemble_config("diamond", DIAMOND_STEPS, outputs=(tensor("SUM"), tensor("DIFF")))
    write_ensemble(repo, "diamond", diamond)
    return repo
