#!/usr/bin/env python3
"""Write the `ocr` model repository from the PP-OCR models of the installed
`rapidocr-onnxruntime` wheel (``pip install -e '.[examples]'``).

The repository (default: ``examples/ocr/models``, git-ignored) holds:

* ``ocr_det``: DBNet text detection, FP32 ``x`` [3, -1, -1] -> ``maps`` [1, -1, -1];
* ``ocr_cls``: text direction (0 or 180 degrees), ``x`` [3, 48, 192] -> ``probs`` [2];
* ``ocr_rec``: CRNN/SVTR recognition, ``x`` [3, 48, -1] -> ``probs`` [-1, 6625] (CTC);
* ``ocr``: the Python model that takes image bytes (BYTES ``image`` [1]) and calls the
  three through BLS, giving ``boxes`` FP32 [-1, 4, 2], ``text`` BYTES [-1] and ``scores``
  FP32 [-1]. Its pre- and post-processing is ``model/ocr_steps.py`` beside this script;
  the character dictionary comes out of the recogniser's metadata into ``ppocr_keys.txt``.

The three ONNX models run on the GE backend (``backend: "npu_ge"``): on an Ascend NPU,
or on the simulated one where there is none. Their varying dims are shape ranges
(``graph.ge.inputShape``, atc's ``--input_shape``) taken from what the pre-processing in
``model/ocr_steps.py`` produces, so every request fits them:

* ``ocr_det``: ``x:1~4,3,32~960,32~960``, sides multiples of 32 and the longer at most
  ``DET_LIMIT`` (960);
* ``ocr_rec``: ``x:1~16,3,48,320~2560``, the width bucket a line is padded to
  (``REC_BUCKETS``, 320 to 2560), and at most 16 lines a call;
* ``ocr_cls``: fixed 48 x 192, so only its batch varies (batch gears 1, 2, 4, ... 32).

``--rec-shapes gears`` gives the recogniser ND gears instead (``graph.ge.dynamicDims``,
atc's ``--dynamic_dims``): every width bucket at batch 1, 2, 4, 8 and 16, exact shapes
that an NPU runs faster than a range. ``--backend onnxruntime`` keeps all three on the
host CPU. examples/ocr/README.md gives the atc command lines these configs imply.

The models' tensors are renamed (``maps``, ``probs``) and nothing else in them changes.
The files are found through the wheel's installed-file list (importlib.metadata), without
importing rapidocr, whose own pipeline this example does not use. Nothing is downloaded.

Usage::

    python3 examples/ocr/build.py [--out DIR] [--no-batching] [--instances N] [--no-cls]
                                  [--backend npu_ge|onnxruntime] [--rec-shapes range|gears]
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
DISTRIBUTION = "rapidocr-onnxruntime"
WHEEL_FILES = {
    "det": "ch_PP-OCRv4_det_infer.onnx",
    "cls": "ch_ppocr_mobile_v2.0_cls_infer.onnx",
    "rec": "ch_PP-OCRv4_rec_infer.onnx",
}
REC_CLASSES = 6625  # the blank, 6623 dictionary characters and the space
MAX_REC_BATCH = 16
MAX_DET_BATCH = 4
MAX_CLS_BATCH = 32
BACKENDS = ("npu_ge", "onnxruntime")
REC_SHAPES = ("range", "gears")


class WheelMissing(RuntimeError):
    """The rapidocr-onnxruntime wheel, or one of its model files, is not installed."""


def wheel_models() -> dict[str, Path]:
    """The PP-OCR ONNX files of the installed wheel, by role (det, cls, rec)."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise WheelMissing(
            f"{DISTRIBUTION} is not installed: pip install -e '.[examples]'"
        ) from None
    by_name = {Path(str(f)).name: Path(str(dist.locate_file(f))) for f in dist.files or ()}
    found = {}
    for role, name in WHEEL_FILES.items():
        path = by_name.get(name)
        if path is None or not path.is_file():
            raise WheelMissing(f"{DISTRIBUTION} {dist.version} has no {name}")
        found[role] = path
    return found


def renamed(model: onnx.ModelProto, output: str) -> onnx.ModelProto:
    """The model with its one input called `x` and its one output `output`."""
    graph = model.graph
    names = {graph.input[0].name: "x", graph.output[0].name: output}
    for node in graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
    graph.input[0].name = "x"
    graph.output[0].name = output
    return model


def dictionary(rec: onnx.ModelProto) -> str:
    """The recogniser's character list, kept in its `character` metadata."""
    meta = {p.key: p.value for p in rec.metadata_props}
    if "character" not in meta:
        raise WheelMissing("the recognition model carries no `character` metadata")
    text = meta["character"]
    if len(text.splitlines()) + 2 != REC_CLASSES:
        raise WheelMissing(
            f"the dictionary has {len(text.splitlines())} characters; "
            f"the recogniser has {REC_CLASSES} classes"
        )
    return text if text.endswith("\n") else text + "\n"


def ocr_steps() -> ModuleType:
    """model/ocr_steps.py, whose sizes the ONNX models' shape ranges are made from."""
    name = "ocr_steps"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, MODEL_CODE / "ocr_steps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def rec_batch_gears() -> tuple[int, ...]:
    """The recogniser's batch sizes with width gears: 1, 2, 4, ... up to its maximum (the
    scheduler pads a batch up to the next one)."""
    gears = [1]
    while gears[-1] < MAX_REC_BATCH:
        gears.append(min(gears[-1] * 2, MAX_REC_BATCH))
    return tuple(gears)


def ge_shapes(rec_shapes: str = "range") -> dict[str, dict[str, str]]:
    """The GE shape parameters of the detector and the recogniser, from what the
    pre-processing (model/ocr_steps.py) produces, so no request falls outside them (a
    shape outside is refused): the detector's sides are multiples of 32 up to
    `DET_LIMIT`, a text line is padded to one of `REC_BUCKETS`.

    The detector's sides take a range (30 x 30 sizes are too many to list as gears). The
    recogniser's width takes a range (`rec_shapes` "range") or ND gears, every width
    bucket at every batch gear ("gears"): exact shapes, which an NPU runs faster than a
    range, for a longer compile. Device buffers are sized for the largest shape."""
    steps = ocr_steps()
    det_sides = f"32~{steps.DET_LIMIT}"
    buckets = steps.REC_BUCKETS
    height = steps.REC_HEIGHT
    shapes = {"ocr_det": {"graph.ge.inputShape": f"x:1~{MAX_DET_BATCH},3,{det_sides},{det_sides}"}}
    if rec_shapes == "range":
        widths = f"{min(buckets)}~{max(buckets)}"
        shapes["ocr_rec"] = {"graph.ge.inputShape": f"x:1~{MAX_REC_BATCH},3,{height},{widths}"}
    elif rec_shapes == "gears":
        gears = ";".join(f"{b},{w}" for b in rec_batch_gears() for w in buckets)
        shapes["ocr_rec"] = {
            "graph.ge.inputShape": f"x:-1,3,{height},-1",
            "graph.ge.dynamicDims": gears,
        }
    else:
        raise ValueError(f"rec_shapes '{rec_shapes}' is not one of {', '.join(REC_SHAPES)}")
    return shapes


@dataclass(frozen=True, slots=True)
class Options:
    batching: bool = True
    instances: int = 2  # `ocr` worker processes: requests in flight through the pipeline
    use_cls: bool = True
    delay_us: int = 2000
    # The ONNX models' backend: the GE backend (an NPU, or the simulated one), or
    # "onnxruntime" for the host CPU.
    backend: str = "npu_ge"
    # How the recogniser's width varies on GE: a shape range, or ND gears (`ge_shapes`).
    rec_shapes: str = "range"


def _batching(options: Options) -> str:
    if not options.batching:
        return ""
    return f"dynamic_batching {{ max_queue_delay_microseconds: {options.delay_us} }}\n"


def onnx_config(
    name: str,
    max_batch: int,
    x_dims: str,
    out: str,
    options: Options,
    ge_params: dict[str, str] | None = None,
) -> str:
    """An ONNX model's config; `ge_params` (npu_ge only) are its GE shape parameters."""
    backend = options.backend
    if backend not in BACKENDS:
        raise ValueError(f"backend '{backend}' is not one of {', '.join(BACKENDS)}")
    out_name, out_dims = out.split(":")
    # KIND_CPU would keep a model on the host whatever its backend says.
    group = "instance_group [ { kind: KIND_CPU count: 1 } ]\n" if backend == "onnxruntime" else ""
    params = ""
    if backend == "npu_ge" and ge_params:
        entries = ",\n".join(
            f'  {{ key: "{key}" value: {{ string_value: "{value}" }} }}'
            for key, value in ge_params.items()
        )
        params = f"parameters [\n{entries}\n]\n"
    return (
        f'name: "{name}"\n'
        f'backend: "{backend}"\n'
        f"max_batch_size: {max_batch}\n"
        f'input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {x_dims} ] }} ]\n'
        f'output [ {{ name: "{out_name}" data_type: TYPE_FP32 dims: [ {out_dims} ] }} ]\n'
        + group
        + params
        + _batching(options)
    )


def ocr_config(options: Options) -> str:
    use_cls = "true" if options.use_cls else "false"
    return f"""\
name: "ocr"
backend: "python"
max_batch_size: 0
input [ {{ name: "image" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [
  {{ name: "boxes" data_type: TYPE_FP32 dims: [ -1, 4, 2 ] }},
  {{ name: "text" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "scores" data_type: TYPE_FP32 dims: [ -1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: {options.instances} }} ]
parameters [
  {{ key: "det_model" value: {{ string_value: "ocr_det" }} }},
  {{ key: "cls_model" value: {{ string_value: "ocr_cls" }} }},
  {{ key: "rec_model" value: {{ string_value: "ocr_rec" }} }},
  {{ key: "use_cls" value: {{ string_value: "{use_cls}" }} }},
  {{ key: "max_rec_batch" value: {{ string_value: "{MAX_REC_BATCH}" }} }},
  {{ key: "max_cls_batch" value: {{ string_value: "{MAX_CLS_BATCH}" }} }}
]
"""


def _write(out: Path, name: str, config: str, files: dict[str, bytes]) -> list[Path]:
    version = out / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    written = [out / name / "config.pbtxt"]
    written[0].write_text(config, encoding="utf-8")
    for filename, data in files.items():
        (version / filename).write_bytes(data)
        written.append(version / filename)
    return written


def build(out: Path, options: Options = Options()) -> list[Path]:
    """Write the repository under `out`; return the files written."""
    sources = wheel_models()
    det = renamed(onnx.load(str(sources["det"])), "maps")
    cls = renamed(onnx.load(str(sources["cls"])), "probs")
    rec = renamed(onnx.load(str(sources["rec"])), "probs")
    keys = dictionary(rec)
    shapes = ge_shapes(options.rec_shapes)
    cls_h, cls_w = ocr_steps().CLS_SHAPE
    rec_h = ocr_steps().REC_HEIGHT
    models = {
        "ocr_det": (
            onnx_config(
                "ocr_det", MAX_DET_BATCH, "3, -1, -1", "maps:1, -1, -1", options, shapes["ocr_det"]
            ),
            det,
        ),
        "ocr_cls": (
            onnx_config("ocr_cls", MAX_CLS_BATCH, f"3, {cls_h}, {cls_w}", "probs:2", options),
            cls,
        ),
        "ocr_rec": (
            onnx_config(
                "ocr_rec",
                MAX_REC_BATCH,
                f"3, {rec_h}, -1",
                f"probs:-1, {REC_CLASSES}",
                options,
                shapes["ocr_rec"],
            ),
            rec,
        ),
    }
    written: list[Path] = []
    for name, (config, model) in models.items():
        written += _write(out, name, config, {"model.onnx": model.SerializeToString()})
    code = {p.name: p.read_bytes() for p in sorted(MODEL_CODE.glob("*.py"))}
    code["ppocr_keys.txt"] = keys.encode("utf-8")
    stale = out / "ocr" / "1"
    if stale.is_dir():
        shutil.rmtree(stale)  # no model code left over from an older build
    written += _write(out, "ocr", ocr_config(options), code)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"(default: {DEFAULT_OUT})")
    parser.add_argument(
        "--no-batching", action="store_true", help="no dynamic_batching on the ONNX models"
    )
    parser.add_argument("--instances", type=int, default=2, help="`ocr` instances (default: 2)")
    parser.add_argument("--no-cls", action="store_true", help="skip the direction classifier")
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="npu_ge",
        help="the ONNX models' backend: npu_ge (an Ascend NPU, or the simulated one; the "
        "default) or onnxruntime (the host CPU)",
    )
    parser.add_argument(
        "--rec-shapes",
        choices=REC_SHAPES,
        default="range",
        help="npu_ge: the recogniser's width as a shape range (the default) or as ND gears, "
        "one per width bucket and batch gear",
    )
    args = parser.parse_args(argv)
    options = Options(
        batching=not args.no_batching,
        instances=args.instances,
        use_cls=not args.no_cls,
        backend=args.backend,
        rec_shapes=args.rec_shapes,
    )
    try:
        written = build(args.out, options)
    except WheelMissing as exc:
        parser.exit(1, f"build.py: {exc}\n")
    for path in written:
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
