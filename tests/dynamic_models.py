"""Model folders for the GE dynamic-shape tests: MiniLM-, OCR-recognition- and
OCR-detection-like stand-ins (tests/modelgen.py) with npu_ge shape parameters."""

from __future__ import annotations

from pathlib import Path

from ge_helpers import make_model, params
from modelgen import encoder_model, exported_rec_model, ocr_det_model, ocr_rec_model

ENCODER_IO = """
input [
  { name: "INPUT_IDS" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "ATTENTION_MASK" data_type: TYPE_INT64 dims: [ -1 ] }
]
output [
  { name: "LAST_HIDDEN" data_type: TYPE_FP32 dims: [ -1, 16 ] },
  { name: "EMBEDDING" data_type: TYPE_FP32 dims: [ 16 ] }
]
"""
# ND gears: (batch, seq) per input, both inputs alike.
ENCODER_GEARS = ((1, 16), (4, 16), (8, 8))


def encoder_folder(repo: Path, name: str = "encoder", extra: str = "") -> Path:
    dims = ";".join(f"{b},{s},{b},{s}" for b, s in ENCODER_GEARS)
    body = "max_batch_size: 8\n" + ENCODER_IO + extra
    body += params(
        graph__dot__ge__dot__inputShape="INPUT_IDS:-1,-1;ATTENTION_MASK:-1,-1",
        graph__dot__ge__dot__dynamicDims=dims,
    )
    return make_model(repo, name, body, onnx_model=encoder_model())


REC_IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3, 32, -1 ] } ]
output [ { name: "PROBS" data_type: TYPE_FP32 dims: [ -1, 12 ] } ]
"""
REC_RANGE = "X:1~4,3,32,32~320"


def rec_folder(repo: Path, name: str = "ocr_rec", extra: str = "") -> Path:
    body = "max_batch_size: 4\n" + REC_IO + extra
    body += params(graph__dot__ge__dot__inputShape=REC_RANGE)
    return make_model(repo, name, body, onnx_model=ocr_rec_model())


def exported_rec_folder(repo: Path, name: str = "exported_rec", high: int = 320) -> Path:
    """The recogniser stand-in as paddle2onnx exports it, over widths 32 to `high`."""
    body = "max_batch_size: 4\n" + REC_IO
    body += params(graph__dot__ge__dot__inputShape=f"X:1~4,3,32,32~{high}")
    return make_model(repo, name, body, onnx_model=exported_rec_model())


DET_IO = """
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3, -1, -1 ] } ]
output [ { name: "MAP" data_type: TYPE_FP32 dims: [ 1, -1, -1 ] } ]
"""
DET_SIZES = ((64, 64), (96, 128))


def det_folder(repo: Path, name: str = "ocr_det", extra: str = "") -> Path:
    body = "max_batch_size: 1\n" + DET_IO + extra
    body += params(graph__dot__ge__dot__dynamicImageSize=";".join(f"{h},{w}" for h, w in DET_SIZES))
    return make_model(repo, name, body, onnx_model=ocr_det_model())


def dynamic_encoder_folder(repo: Path, name: str = "bert_dynamic", backend: bool = True) -> Path:
    """The encoder with -1 sequence dims and no gears or ranges: npu_ge's default mode, GE
    dynamic shape (with `backend: "npu_ge"`, or naming no backend)."""
    body = ('backend: "npu_ge"\n' if backend else "") + "max_batch_size: 8\n" + ENCODER_IO
    return make_model(repo, name, body, onnx_model=encoder_model())
