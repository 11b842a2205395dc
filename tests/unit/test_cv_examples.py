"""The CV examples' own pieces, without a server: the restricted reader of torch's pickle
format (examples/efficientnet/torch_pickle.py), TensorFlow SAME padding in the
EfficientNet graph, MTCNN's pyramid and NMS (examples/face_detect/model/face_steps.py),
and how the image examples (efficientnet, face_detect, ocr) decode high-bit-depth images.
"""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path
from types import ModuleType

import cvrepo
import numpy as np
import ocrrepo
import pytest
from PIL import Image


@pytest.fixture(scope="module")
def torch_pickle() -> ModuleType:
    sibling: ModuleType = cvrepo.efficientnet_build().sibling("torch_pickle")
    return sibling


@pytest.fixture(scope="module")
def graph() -> ModuleType:
    sibling: ModuleType = cvrepo.efficientnet_build().sibling("graph")
    return sibling


@pytest.fixture(scope="module")
def face_steps() -> ModuleType:
    steps: ModuleType = cvrepo.face_detect_build().face_steps()
    return steps


def _legacy_file(tmp_path: Path, payload: bytes, keys: list[str], data: bytes = b"") -> Path:
    """A file in torch's old format: headers, the state dict's pickle, keys, storages."""
    buffer = io.BytesIO()
    for header in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}):
        pickle.dump(header, buffer, protocol=2)
    buffer.write(payload)
    pickle.dump(keys, buffer, protocol=2)
    buffer.write(data)
    path = tmp_path / "weights.pth"
    path.write_bytes(buffer.getvalue())
    return path


def _global_pickle(module: str, name: str) -> bytes:
    # protocol 2: GLOBAL 'module name', EMPTY_TUPLE, REDUCE, STOP
    return b"\x80\x02c" + f"{module}\n{name}\n".encode() + b")R."


def test_the_reader_refuses_any_global_a_state_dict_does_not_need(
    torch_pickle: ModuleType, tmp_path: Path
) -> None:
    path = _legacy_file(tmp_path, _global_pickle("os", "system"), [])
    with pytest.raises(torch_pickle.UnsafePickle, match=r"os\.system"):
        torch_pickle.load_state_dict(path)


def test_the_reader_rebuilds_tensors_from_their_storages(
    torch_pickle: ModuleType, tmp_path: Path
) -> None:
    # OrderedDict([("w", _rebuild_tensor_v2(<storage "0">, 1, (2, 2), (2, 1), False, {}))])
    # in pickle opcodes, as torch 1.x writes it (torch itself is not installed here).
    body = b"".join(
        [
            b"\x80\x02ccollections\nOrderedDict\n)R(",  # OrderedDict(), MARK for SETITEMS
            b"X\x01\x00\x00\x00w",  # the key
            b"ctorch._utils\n_rebuild_tensor_v2\n((",  # MARK args, MARK persistent id
            b"X\x07\x00\x00\x00storagectorch\nFloatStorage\n",
            b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x05NtQ",  # ..., key "0": BINPERSID
            b"K\x01K\x02K\x02\x86K\x02K\x01\x86\x89}tR",  # offset, size, stride, False, {}
            b"u.",  # SETITEMS, STOP
        ]
    )
    storage = struct.pack("<q", 5) + np.arange(5, dtype=np.float32).tobytes()
    path = _legacy_file(tmp_path, body, ["0"], storage)
    found = torch_pickle.load_state_dict(path)
    np.testing.assert_array_equal(found["w"], np.array([[1, 2], [3, 4]], np.float32))


def test_same_padding_puts_the_odd_pixel_after(graph: ModuleType) -> None:
    assert graph.same_pads(224, 3, 2) == (0, 1)
    assert graph.same_pads(56, 5, 2) == (1, 2)
    assert graph.same_pads(112, 3, 1) == (1, 1)
    assert graph.same_pads(14, 5, 1) == (2, 2)


def test_efficientnet_lite0_has_sixteen_blocks(graph: ModuleType) -> None:
    assert sum(stage.repeats for stage in graph.STAGES) == 16


def test_the_pyramid_stops_at_twelve_pixels(face_steps: ModuleType) -> None:
    scales = face_steps.pyramid(512, 512)
    assert len(scales) == 10 and scales[0] == pytest.approx(0.6)
    assert min(512, 512) * scales[-1] >= 12 > min(512, 512) * scales[-1] * 0.709
    assert face_steps.pyramid(15, 15) == []


def test_nms_keeps_the_best_of_overlapping_boxes(face_steps: ModuleType) -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], np.float64)
    scores = np.array([0.8, 0.9, 0.5])
    assert face_steps.nms(boxes, scores, 0.5).tolist() == [1, 2]
    inner = np.array([[0, 0, 20, 20], [5, 5, 10, 10]], np.float64)
    assert face_steps.nms(inner, np.array([0.9, 0.8]), 0.7, by_min=True).tolist() == [0]
    assert face_steps.nms(inner, np.array([0.9, 0.8]), 0.7).tolist() == [0, 1]


def test_a_box_is_squared_about_its_centre(face_steps: ModuleType) -> None:
    squared = face_steps.square(np.array([[10.0, 20.0, 30.0, 60.0]]))
    np.testing.assert_allclose(squared, [[0.0, 20.0, 40.0, 60.0]])


def decoders() -> dict[str, ModuleType]:
    return {
        "efficientnet": cvrepo.load_module(
            "classify_steps", cvrepo.EXAMPLES / "efficientnet" / "model" / "classify_steps.py"
        ),
        "face_detect": cvrepo.face_detect_build().face_steps(),
        "ocr": ocrrepo.ocr_steps(),
    }


def encoded(array: np.ndarray, mode: str | None, fmt: str) -> bytes:
    buffer = io.BytesIO()
    (Image.fromarray(array, mode) if mode else Image.fromarray(array)).save(buffer, fmt)
    return buffer.getvalue()


@pytest.mark.parametrize("example", ["efficientnet", "face_detect", "ocr"])
def test_a_16_bit_photo_decodes_as_its_8_bit_self(example: str) -> None:
    # Pillow's convert("RGB") clips 16-bit samples at 255: the photo came out white and
    # was classified, with a 200, as something it is not.
    decode = decoders()[example].decode_image
    camera = np.asarray(Image.open(io.BytesIO(cvrepo.photo("camera.png"))).convert("L"))
    expected = np.asarray(decode(encoded(camera, None, "PNG")), np.int16)
    wide = camera.astype(np.uint16) * 257  # the same photo over 0..65535
    as_16_bit = encoded(wide, None, "PNG")  # Pillow reads it as mode I;16
    as_32_bit = encoded(wide.astype(np.int32), None, "TIFF")  # mode I
    as_float = encoded(camera.astype(np.float32) / 255, "F", "TIFF")  # mode F, 0..1
    for data in (as_16_bit, as_32_bit, as_float):
        got = np.asarray(decode(data), np.int16)
        assert got.shape == expected.shape
        assert np.abs(got - expected).max() <= 1
