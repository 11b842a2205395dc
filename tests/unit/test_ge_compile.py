"""ONNX/.pb to OM through `atc`: the command line, the on-disk cache, and failures.

A fake `atc` on PATH checks its command line like atc does and logs every run.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from fake_acl import FakeAcl, build_module
from ge_helpers import EXAMPLES, FAKE_ATC_BIN, SIMPLE_IO, make_model, params, spec_for
from onnx import helper, numpy_helper

from ge_serve.backends.ge.acl_real import AclReal
from ge_serve.backends.ge.backend import GeBackend
from ge_serve.backends.ge.compile import AtcCompiler, AtcJob, CompileError

CLASSIFIER = EXAMPLES / "image_classifier" / "1" / "model.onnx"
SIMPLE = EXAMPLES / "simple" / "1" / "model.onnx"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def atc_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "atc.log"
    monkeypatch.setenv("PATH", f"{FAKE_ATC_BIN}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ATC_LOG", str(log))
    monkeypatch.setenv("FAKE_ACL_SOC", "Ascend310P3")
    return log


def runs(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


CLASSIFIER_CONFIG = """
backend: "npu_ge"
max_batch_size: 8
input [ { name: "image" data_type: TYPE_FP32 dims: [ 3, 64, 64 ] } ]
output [ { name: "probabilities" data_type: TYPE_FP32 dims: [ 10 ] } ]
instance_group [ { count: 1 } ]
"""


def test_npu_ge_options_become_the_atc_command(tmp_path: Path, atc_log: Path) -> None:
    fake = FakeAcl(devices=1)
    runtime = AclReal(build_module(fake), AtcCompiler(tmp_path / "cache"))
    folder = make_model(
        tmp_path,
        "classifier",
        CLASSIFIER_CONFIG
        + params(
            graph__dot__ge__dot__inputShape="image:-1,3,64,64",
            graph__dot__ge__dot__dynamicDims="1;2;4;8",
            graph__dot__ge__dot__dynamicNodeType="1",
            ge__dot__exec__dot__precision_mode="allow_fp32_to_fp16",
            session__dot__ge__dot__opSelectImplmode="high_precision",
            ge__dot__aicoreNum="12|10",
        ),
        CLASSIFIER,
    )
    loaded = GeBackend(runtime).load(spec_for(folder))
    (args,) = runs(atc_log)
    model_arg, framework, output, soc, *rest = args
    assert model_arg == f"--model={folder / '1' / 'model.onnx'}"
    assert framework == "--framework=5"
    assert output.startswith(f"--output={tmp_path / 'cache'}")
    assert soc == "--soc_version=Ascend310P3"  # asked of the device (acl.get_soc_name)
    assert rest == [
        "--input_shape=image:-1,3,64,64",
        "--dynamic_batch_size=1,2,4,8",
        "--precision_mode=allow_fp32_to_fp16",
        "--op_select_implmode=high_precision",
        "--log=error",
    ]
    assert loaded.gears == (1, 2, 4, 8)
    loaded.close()
    runtime.shutdown()
    assert fake.leaks() == [] and fake.violations == []


def test_input_shape_is_derived_from_the_config(tmp_path: Path, atc_log: Path) -> None:
    runtime = AclReal(build_module(FakeAcl()), AtcCompiler(tmp_path / "cache"))
    folder = make_model(tmp_path, "simple", "max_batch_size: 4\n" + SIMPLE_IO, SIMPLE)
    GeBackend(runtime).load(spec_for(folder)).close()
    (args,) = runs(atc_log)
    assert "--input_shape=INPUT0:-1,16;INPUT1:-1,16" in args
    assert "--dynamic_batch_size=1,2,4" in args  # default gears up to max_batch_size
    runtime.shutdown()


def test_second_load_hits_the_cache(tmp_path: Path, atc_log: Path) -> None:
    cache = tmp_path / "cache"
    folder = make_model(tmp_path, "simple", "max_batch_size: 8\n" + SIMPLE_IO, SIMPLE)
    first = AclReal(build_module(FakeAcl()), AtcCompiler(cache))
    GeBackend(first).load(spec_for(folder)).close()
    first.shutdown()
    assert len(runs(atc_log)) == 1
    # A new process (a new runtime and compiler) over the same cache folder: no atc run.
    second_compiler = AtcCompiler(cache)
    second = AclReal(build_module(FakeAcl()), second_compiler)
    loaded = GeBackend(second).load(spec_for(folder))
    assert len(runs(atc_log)) == 1
    assert (second_compiler.hits, second_compiler.misses) == (1, 0)
    loaded.close()
    second.shutdown()
    assert len(list(cache.glob("*.om"))) == 1


def test_cache_key_covers_content_and_options(tmp_path: Path, atc_log: Path) -> None:
    cache = tmp_path / "cache"
    compiler = AtcCompiler(cache)
    model = tmp_path / "model.onnx"
    shutil.copyfile(SIMPLE, model)
    job = AtcJob(model, "Ascend310P3", "INPUT0:-1,16;INPUT1:-1,16", (1, 2))
    om, hit = compiler.compile(job)
    assert not hit
    assert compiler.compile(job) == (om, True)
    keys = {compiler.cache_key(job)}
    keys.add(compiler.cache_key(AtcJob(model, "Ascend310P3", job.input_shape, (1, 4))))
    keys.add(compiler.cache_key(AtcJob(model, "Ascend910B4", job.input_shape, (1, 2))))
    keys.add(
        compiler.cache_key(
            AtcJob(model, "Ascend310P3", job.input_shape, (1, 2), (("precision_mode", "x"),))
        )
    )
    # Another atc (a CANN upgrade): its path, size or change time differ.
    upgraded = tmp_path / "toolkit-2" / "atc"
    upgraded.parent.mkdir()
    shutil.copy2(FAKE_ATC_BIN / "atc", upgraded)
    keys.add(AtcCompiler(cache, atc=str(upgraded)).cache_key(job))
    model.write_bytes(model.read_bytes() + b"\0")  # different content, same path
    keys.add(compiler.cache_key(job))
    assert len(keys) == 6
    assert len(runs(atc_log)) == 1


def test_atc_leaves_its_side_files_in_its_scratch_folder_not_the_servers_cwd(
    tmp_path: Path, atc_log: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # atc writes fusion_result.json (and more) into the current folder unless
    # ASCEND_WORK_PATH is set: the server's cwd would fill up, one file set per compile.
    served_from = tmp_path / "cwd"
    served_from.mkdir()
    monkeypatch.chdir(served_from)
    shutil.copyfile(SIMPLE, tmp_path / "model.onnx")
    (tmp_path / "fusion.cfg").write_text("{}", encoding="utf-8")
    # Relative paths (a relative repository, cache folder or --backend-config file) still
    # mean the server's current folder, though atc runs elsewhere.
    job = AtcJob(
        Path("../model.onnx"),
        "Ascend310P3",
        "INPUT0:-1,16;INPUT1:-1,16",
        (1, 2),
        (("fusion_switch_file", "../fusion.cfg"),),
    )
    om, _ = AtcCompiler(Path("../cache")).compile(job)
    assert list(served_from.iterdir()) == []
    assert list((tmp_path / "cache").iterdir()) == [om.resolve()]  # no scratch folder left
    (args,) = runs(atc_log)
    assert args[0] == f"--model={tmp_path / 'model.onnx'}"
    assert f"--fusion_switch_file={tmp_path / 'fusion.cfg'}" in args


def external_weight_model(folder: Path, weight: list[float]) -> None:
    """`y = x + W`, W (4 floats) kept in `w.bin` next to the model as ONNX external data."""
    w = numpy_helper.from_array(np.array(weight, np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "W"], ["y"])],
        "ext",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["B", 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["B", 4])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save_model(
        model, str(folder / "model.onnx"), save_as_external_data=True, location="w.bin",
        size_threshold=0,
    )  # fmt: skip


EXTERNAL_CONFIG = """
max_batch_size: 2
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def test_editing_a_file_atc_reads_compiles_anew_on_reload(tmp_path: Path, atc_log: Path) -> None:
    # The OM bakes in the ONNX external data and the files the options name (an AIPP
    # config): after editing one, a reload must not serve the stale OM.
    folder = make_model(
        tmp_path, "ext", EXTERNAL_CONFIG + params(atc__dot__insert_op_conf="aipp.cfg")
    )
    external_weight_model(folder / "1", [1, 2, 3, 4])
    aipp = folder / "aipp.cfg"
    aipp.write_text("aipp_op {\n aipp_mode: static\n}\n", encoding="utf-8")
    runtime = AclReal(build_module(FakeAcl()), AtcCompiler(tmp_path / "cache"))
    x = {"x": np.zeros((1, 4), np.float32)}

    def reload() -> list[float]:
        loaded = GeBackend(runtime, {"accuracy_check": "false"}).load(spec_for(folder))
        try:
            return [float(v) for v in loaded.executors[0].execute(x)["y"][0]]
        finally:
            loaded.close()

    assert reload() == [1, 2, 3, 4]
    assert reload() == [1, 2, 3, 4] and len(runs(atc_log)) == 1  # nothing changed: cached
    np.array([10, 20, 30, 40], np.float32).tofile(folder / "1" / "w.bin")
    assert reload() == [10, 20, 30, 40] and len(runs(atc_log)) == 2
    aipp.write_text("aipp_op {\n aipp_mode: static\n mean_chn_0: 99\n}\n", encoding="utf-8")
    reload()
    assert len(runs(atc_log)) == 3
    runtime.shutdown()


def test_tensorflow_pb_is_compiled_with_framework_3(tmp_path: Path, atc_log: Path) -> None:
    graph = tmp_path / "frozen_graph.pb"
    graph.write_bytes(b"\x0a\x00")
    compiler = AtcCompiler(tmp_path / "cache")
    om, hit = compiler.compile(AtcJob(graph, "Ascend310P3", "x:-1,4;", (1, 2)))
    assert not hit and om.is_file()
    (args,) = runs(atc_log)
    assert args[:2] == [f"--model={graph}", "--framework=3"]


def test_atc_failure_is_reported_with_its_output(tmp_path: Path, atc_log: Path) -> None:
    compiler = AtcCompiler(tmp_path / "cache")
    model = tmp_path / "model.onnx"
    shutil.copyfile(SIMPLE, model)
    with pytest.raises(CompileError) as raised:
        compiler.compile(AtcJob(model, "Ascend910B4", "INPUT0:-1,16;INPUT1:-1,16", (1, 2)))
    message = str(raised.value)
    assert "atc failed to compile" in message and "exit code 1" in message
    assert "--soc_version=Ascend910B4 does not match this toolkit" in message
    assert not list((tmp_path / "cache").glob("*.om"))  # nothing half-written is cached


def test_missing_atc_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    model = tmp_path / "model.onnx"
    shutil.copyfile(SIMPLE, model)
    with pytest.raises(CompileError, match="the `atc` tool is not on PATH"):
        AtcCompiler(tmp_path / "cache").compile(AtcJob(model, "Ascend310P3"))


def test_unknown_model_kind_is_refused(tmp_path: Path) -> None:
    model = tmp_path / "model.tflite"
    model.write_bytes(b"x")
    with pytest.raises(CompileError, match=r"compiles ONNX \(.onnx\) and TensorFlow \(.pb\)"):
        AtcCompiler(tmp_path / "cache").compile(AtcJob(model, "Ascend310P3"))
