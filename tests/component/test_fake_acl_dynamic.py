"""The strict fake pyACL's dynamic-shape calls: each call's contract and each refusal, so a
shim that breaks one (wrong argument type, a shape that is no gear, executing before the
gear or the shapes are set) fails here as it would on an NPU."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_acl import FakeAcl, build_module
from fake_acl import om as fake_om
from ge_helpers import FAKE_ATC_BIN
from modelgen import encoder_model, ocr_det_model, ocr_rec_model

pytestmark = pytest.mark.timeout(60)
INVALID_PARAM = 100000


@dataclass
class Loaded:
    acl: Any
    fake: FakeAcl
    model_id: int
    desc: int
    inputs: int
    outputs: int
    handles: list[int]


def build(tmp: Path, name: str, model: Any, flags: dict[str, str]) -> Path:
    source = tmp / f"{name}.onnx"
    source.write_bytes(model.SerializeToString())
    built = fake_om.build_shaped(source, "Ascend310P3", flags, 5)
    target = tmp / f"{name}.om"
    fake_om.write(built, target)
    return target


@pytest.fixture
def open_device() -> Iterator[tuple[Any, FakeAcl]]:
    fake = FakeAcl(soc="Ascend310P3")
    acl = build_module(fake)
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    _context, ret = acl.rt.create_context(0)
    assert ret == 0
    yield acl, fake
    fake.violations.clear()


def load(acl: Any, fake: FakeAcl, path: Path) -> Loaded:
    model_id, ret = acl.mdl.load_from_file(str(path))
    assert ret == 0
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == 0
    datasets = []
    handles = []
    for count, size_of in (
        (acl.mdl.get_num_inputs(desc), acl.mdl.get_input_size_by_index),
        (acl.mdl.get_num_outputs(desc), acl.mdl.get_output_size_by_index),
    ):
        dataset = acl.mdl.create_dataset()
        for index in range(count):
            ptr, ret = acl.rt.malloc(max(size_of(desc, index), 1 << 20), 0)
            assert ret == 0
            data = acl.create_data_buffer(ptr, max(size_of(desc, index), 1 << 20))
            acl.mdl.add_dataset_buffer(dataset, data)
            handles.append(data)
        datasets.append(dataset)
    return Loaded(acl, fake, model_id, desc, datasets[0], datasets[1], handles)


def test_nd_gears_are_read_and_selected_as_pyacl_does(open_device: Any, tmp_path: Path) -> None:
    acl, fake = open_device
    flags = {"input_shape": "INPUT_IDS:-1,-1;ATTENTION_MASK:-1,-1", "input_format": "ND",
             "dynamic_dims": "1,16,1,16;4,8,4,8"}  # fmt: skip
    m = load(acl, fake, build(tmp_path, "enc", encoder_model(), flags))
    count, ret = acl.mdl.get_input_dynamic_gear_count(m.desc, -1)
    assert (count, ret) == (2, 0)
    gears, ret = acl.mdl.get_input_dynamic_dims(m.desc, -1, count)
    assert ret == 0 and [g["dims"] for g in gears] == [[1, 16, 1, 16], [4, 8, 4, 8]]
    index, _ = acl.mdl.get_input_index_by_name(m.desc, "ascend_mbatch_shape_data")
    # Executing before a gear is set breaks the order.
    stream, _ = acl.rt.create_stream()
    assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == INVALID_PARAM
    assert "no gear set" in fake.violations[-1]
    good = {"name": "", "dimCount": 4, "dims": [4, 8, 4, 8]}
    assert acl.mdl.set_input_dynamic_dims(m.model_id, m.inputs, index, good) == 0
    assert acl.mdl.get_cur_output_dims(m.desc, 0)[1] == INVALID_PARAM  # nothing ran yet
    assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    dims, ret = acl.mdl.get_cur_output_dims(m.desc, 0)
    assert ret == 0 and dims["dims"] == [4, 8, 16]
    fake.violations.pop()  # the early get_cur_output_dims
    fake.violations.pop(0)  # the early execution
    assert fake.violations == []


@pytest.mark.parametrize(
    ("index", "dims", "rule"),
    [
        (None, [4, 8, 4, 8], "dims must be"),  # a list, not aclmdlIODims
        (None, {"dimCount": 4, "dims": [4, 8, 4, 9]}, "is not a gear"),
        (None, {"dimCount": 4, "dims": [4.0, 8, 4, 8]}, "dims must be"),
        (0, {"dimCount": 4, "dims": [4, 8, 4, 8]}, "is not the gear input"),
    ],
)
def test_set_input_dynamic_dims_refuses_what_pyacl_refuses(
    open_device: Any, tmp_path: Path, index: int | None, dims: Any, rule: str
) -> None:
    acl, fake = open_device
    flags = {"input_shape": "INPUT_IDS:-1,-1;ATTENTION_MASK:-1,-1", "input_format": "ND",
             "dynamic_dims": "1,16,1,16;4,8,4,8"}  # fmt: skip
    m = load(acl, fake, build(tmp_path, "enc", encoder_model(), flags))
    gear_input, _ = acl.mdl.get_input_index_by_name(m.desc, "ascend_mbatch_shape_data")
    at = gear_input if index is None else index
    assert acl.mdl.set_input_dynamic_dims(m.model_id, m.inputs, at, dims) == INVALID_PARAM
    assert rule in fake.violations[-1]


def test_image_size_gears_are_read_selected_and_refused(open_device: Any, tmp_path: Path) -> None:
    acl, fake = open_device
    flags = {"input_shape": "X:1,3,-1,-1", "dynamic_image_size": "64,64;96,128"}
    m = load(acl, fake, build(tmp_path, "det", ocr_det_model(), flags))
    assert acl.mdl.get_dynamic_hw(m.desc, 0)[1] == INVALID_PARAM  # the index is reserved: -1
    hw, ret = acl.mdl.get_dynamic_hw(m.desc, -1)
    assert ret == 0 and hw == {"hwCount": 2, "hw": [[64, 64], [96, 128]]}
    assert acl.mdl.get_input_dynamic_gear_count(m.desc, -1) == (0, 0)
    index, _ = acl.mdl.get_input_index_by_name(m.desc, "ascend_mbatch_shape_data")
    assert acl.mdl.set_dynamic_hw_size(m.model_id, m.inputs, index, 64, 96) == INVALID_PARAM
    assert "is not a gear" in fake.violations[-1]
    assert acl.mdl.set_dynamic_hw_size(m.model_id, m.inputs, index, 96.0, 128) == INVALID_PARAM
    assert "must be ints" in fake.violations[-1]
    dims = {"dimCount": 4, "dims": [1, 3, 96, 128]}
    assert acl.mdl.set_input_dynamic_dims(m.model_id, m.inputs, index, dims) == INVALID_PARAM
    assert "not dims-shaped" in fake.violations[-1]
    assert acl.mdl.set_dynamic_batch_size(m.model_id, m.inputs, index, 1) == INVALID_PARAM
    assert acl.mdl.set_dynamic_hw_size(m.model_id, m.inputs, index, 96, 128) == 0


def test_shape_ranges_need_tensor_descs_inside_the_range(open_device: Any, tmp_path: Path) -> None:
    acl, fake = open_device
    m = load(
        acl, fake, build(tmp_path, "rec", ocr_rec_model(), {"input_shape": "X:1~4,3,32,32~320"})
    )
    assert acl.mdl.get_input_size_by_index(m.desc, 0) == 0  # a range model reports no size
    found, ret = acl.mdl.get_input_dims_range(m.desc, 0)
    assert ret == 0 and found["range"] == [[1, 4], [3, 3], [32, 32], [32, 320]]
    stream, _ = acl.rt.create_stream()
    assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == INVALID_PARAM
    assert "has no tensor desc" in fake.violations[-1]
    assert acl.create_tensor_desc(0, (2, 3, 32, 100), 2) == 0  # dims must be a list
    assert "list of ints" in fake.violations[-1]
    outside = acl.create_tensor_desc(0, [2, 3, 32, 400], 2)
    assert acl.mdl.set_dataset_tensor_desc(m.inputs, outside, 0)[1] == 0
    assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == INVALID_PARAM
    assert "outside" in fake.violations[-1]
    inside = acl.create_tensor_desc(0, [2, 3, 32, 100], 2)
    assert acl.mdl.set_dataset_tensor_desc(m.inputs, inside, 0)[1] == 0
    assert acl.destroy_tensor_desc(outside) == 0
    assert acl.mdl.get_dataset_tensor_desc(m.outputs, 0) == 0  # before any execution
    assert "before an execution" in fake.violations[-1]
    assert acl.mdl.execute_async(m.model_id, m.inputs, m.outputs, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    out = acl.mdl.get_dataset_tensor_desc(m.outputs, 0)
    count = acl.get_tensor_desc_num_dims(out)
    assert [acl.get_tensor_desc_dim_v2(out, i)[0] for i in range(count)] == [2, 25, 12]
    assert acl.destroy_tensor_desc(inside) == INVALID_PARAM  # the dataset still points at it
    assert "still holds it" in fake.violations[-1]
    assert any("tensor description" in leak for leak in fake.leaks()) is False


def test_a_tensor_desc_never_destroyed_is_a_leak(open_device: Any) -> None:
    acl, fake = open_device
    handle = acl.create_tensor_desc(0, [1, 2], 2)
    assert any(f"tensor description {handle:#x}" in leak for leak in fake.leaks())
    assert acl.destroy_tensor_desc(handle) == 0
    assert not any("tensor description" in leak for leak in fake.leaks())


def test_query_size_reports_work_and_weights(open_device: Any, tmp_path: Path) -> None:
    acl, _ = open_device
    path = build(tmp_path, "rec", ocr_rec_model(), {"input_shape": "X:1~4,3,32,32~320"})
    work, weight, ret = acl.mdl.query_size(str(path))
    assert ret == 0 and work > 0 and weight == (8 * 3 * 32 * 4 + 8 * 12) * 4 + 8
    assert acl.mdl.query_size(str(tmp_path / "missing.om"))[2] != 0


def run_atc(tmp_path: Path, model: Any, *flags: str) -> subprocess.CompletedProcess[str]:
    source = tmp_path / "m.onnx"
    source.write_bytes(model.SerializeToString())
    args = [f"--model={source}", "--framework=5", f"--output={tmp_path / 'm'}",
            "--soc_version=Ascend310P3", *flags]  # fmt: skip
    env = {**os.environ, "FAKE_ACL_SOC": "Ascend310P3"}
    return subprocess.run(
        [sys.executable, str(FAKE_ATC_BIN / "atc"), *args],
        capture_output=True, text=True, env=env, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--input_shape=INPUT_IDS:-1,-1;ATTENTION_MASK:-1,-1", "--dynamic_dims=1,16,1,16"),
         "needs --input_format=ND"),
        (("--input_shape=INPUT_IDS:-1,-1;ATTENTION_MASK:-1,-1", "--input_format=ND",
          "--dynamic_dims=1,16"), "needs 4 values"),
        (("--input_shape=INPUT_IDS:-1,-1;ATTENTION_MASK:-1,-1", "--input_format=ND",
          "--dynamic_dims=1,16,1,16", "--dynamic_batch_size=1,2"), "cannot be used together"),
    ],
)  # fmt: skip
def test_the_fake_atc_checks_the_dynamic_flags(
    tmp_path: Path, flags: tuple[str, ...], message: str
) -> None:
    done = run_atc(tmp_path, encoder_model(), *flags)
    assert done.returncode == 1 and message in done.stderr


def test_the_fake_atc_compiles_nd_gears(tmp_path: Path) -> None:
    done = run_atc(
        tmp_path, encoder_model(), "--input_shape=INPUT_IDS:-1,-1;ATTENTION_MASK:-1,-1",
        "--input_format=ND", "--dynamic_dims=1,16,1,16;4,8,4,8",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    built = fake_om.read(tmp_path / "m.om")
    assert built["shape"]["mode"] == "dims" and built["shape"]["gears"] == [
        [1, 16, 1, 16],
        [4, 8, 4, 8],
    ]
    np.testing.assert_array_equal(built["inputs"][0]["dims"], [-1, -1])
