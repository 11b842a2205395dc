"""How npu_ge configs map onto GE slots, gears and atc options (options.make_plan)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ge_helpers import SIMPLE_IO, params
from google.protobuf import text_format

from ge_serve.backends.ge.backend import backend_config_for
from ge_serve.backends.ge.options import (
    default_gears,
    file_parameters,
    intra_threads,
    make_plan,
    parse_gears,
    with_npu_config,
)
from ge_serve.backends.paths import OutsideFolder
from ge_serve.protos import model_config_pb2


def config(body: str, max_batch_size: int = 8) -> model_config_pb2.ModelConfig:
    parsed = model_config_pb2.ModelConfig()
    text_format.Parse(f'name: "m"\nmax_batch_size: {max_batch_size}\n{SIMPLE_IO}{body}', parsed)
    return parsed


def test_defaults_one_slot_on_npu0_with_power_of_two_gears() -> None:
    plan = make_plan(config(""))
    assert plan.slots == ((0, 1),)
    assert plan.gears == (1, 2, 4, 8)
    assert plan.input_shape == "INPUT0:-1,16;INPUT1:-1,16"
    assert plan.atc_options == ()


@pytest.mark.parametrize(
    ("max_batch_size", "gears"),
    [(1, (1,)), (2, (1, 2)), (6, (1, 2, 4, 6)), (8, (1, 2, 4, 8)), (12, (1, 2, 4, 8, 12))],
)
def test_default_gears(max_batch_size: int, gears: tuple[int, ...]) -> None:
    assert default_gears(max_batch_size) == gears


def test_device_ids_and_device_exec_blocks() -> None:
    plan = make_plan(config(params(device_ids="4,5", device_exec_blocks="2")))
    assert plan.slots == ((4, 2), (5, 2))
    assert plan.slot_count == 4


def test_instance_count_and_instance_exec_blocks_per_device() -> None:
    body = "instance_group [ { count: 2 } ]\n" + params(device_ids="0,1", instance_exec_blocks="3")
    # npu_ge: 2 instances x 3 graphs per device, each slot splitting its batch across 3.
    plan = make_plan(config(body))
    assert plan.slots == ((0, 2), (1, 2)) and plan.exec_blocks == 3
    assert plan.slot_count == 12


def test_instance_group_gpus_are_npu_ids() -> None:
    body = "instance_group [ { count: 2 kind: KIND_GPU gpus: [ 1, 3 ] }, { count: 1 gpus: [ 3 ] } ]"
    assert make_plan(config(body)).slots == ((1, 2), (3, 3))


def test_group_without_gpus_lands_on_every_listed_device() -> None:
    body = "instance_group [ { count: 1 gpus: [ 2 ] }, { count: 1 } ]"
    assert make_plan(config(body)).slots == ((2, 2),)


def test_dynamic_dims_are_the_gears() -> None:
    body = params(
        graph__dot__ge__dot__dynamicDims="8;1;4;2", graph__dot__ge__dot__dynamicNodeType="1"
    )
    plan = make_plan(config(body))
    assert plan.gears == (1, 2, 4, 8)
    assert plan.unused_options == ()


def test_input_shape_option_wins() -> None:
    body = params(ge__dot__inputShape="INPUT0:-1,16;INPUT1:-1,16", ge__dot__dynamicDims="2;8")
    plan = make_plan(config(body))
    assert plan.input_shape == "INPUT0:-1,16;INPUT1:-1,16"
    assert plan.gears == (2, 8)


@pytest.mark.parametrize("value", ["1", "true"])
def test_static_model_compiles_batch_one_and_loops(value: str) -> None:
    plan = make_plan(config(params(static_model=value)))
    assert plan.gears == (1,)
    assert plan.static_model and plan.static_loop
    assert plan.input_shape == "INPUT0:1,16;INPUT1:1,16"


def test_no_batching_means_no_gears() -> None:
    body = SIMPLE_IO.replace("dims: [ 16 ]", "dims: [ 1, 16 ]")
    parsed = model_config_pb2.ModelConfig()
    text_format.Parse(f'name: "m"\n{body}', parsed)
    plan = make_plan(parsed)
    assert plan.gears == ()
    assert plan.input_shape == "INPUT0:1,16;INPUT1:1,16"


def test_ge_options_map_to_atc_flags_and_the_rest_are_reported() -> None:
    body = params(
        ge__dot__exec__dot__precision_mode="force_fp16",
        graph__dot__ge__dot__opSelectImplmode="high_performance",
        ge__dot__aicoreNum="12|10",
        session__dot__ge__dot__keepDtype="keep.cfg",
        atc__dot__input_format="NCHW",
    )
    plan = make_plan(config(body))
    assert plan.atc_options == (
        ("precision_mode", "force_fp16"),
        ("keep_dtype", "keep.cfg"),
        ("op_select_implmode", "high_performance"),
        ("input_format", "NCHW"),
    )
    # A runtime option is accepted (with a warning at load): it changes no result.
    assert plan.unused_options == ("ge.aicoreNum",)


def test_a_ge_option_that_cannot_be_applied_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"ge.exec.unknownKnob has no atc flag and no pyACL"):
        make_plan(config(params(graph__dot__ge__dot__exec__dot__unknownKnob="1")))


def test_ge_npu_config_takes_the_place_of_backend_config_ge_options() -> None:
    given = {"ge.exec.precision_mode": "force_fp16", "device_exec_blocks": "2"}
    environ = {
        "GE_NPU_CONFIG": '{"ge.exec.precision_mode": "allow_mix_precision", "ge.aicoreNum": 4}'
    }
    merged = with_npu_config(given, environ)
    assert merged == {
        "ge.exec.precision_mode": "allow_mix_precision",
        "ge.aicoreNum": "4",
        "device_exec_blocks": "2",
    }
    plan = make_plan(config(""), merged)
    assert plan.atc_options == (("precision_mode", "allow_mix_precision"),)
    assert with_npu_config(given, {}) == given
    for bad, message in (("{", "is not JSON"), ("[1]", "JSON object"), ('{"x": "1"}', "not a GE")):
        with pytest.raises(ValueError, match=message):
            with_npu_config(given, {"GE_NPU_CONFIG": bad})


def test_backend_config_applies_and_the_model_wins() -> None:
    given = backend_config_for(
        (
            ("npu_ge.ge.exec.precision_mode", "force_fp16"),
            ("ge.device_exec_blocks", "3"),
            ("onnxruntime.x", "y"),
        )
    )
    assert given == {"ge.exec.precision_mode": "force_fp16", "device_exec_blocks": "3"}
    plan = make_plan(config(params(device_exec_blocks="2")), given)
    assert plan.slots == ((0, 2),)
    assert plan.atc_options == (("precision_mode", "force_fp16"),)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (params(device_ids="a,b"), "device_ids must list NPU ids"),
        (params(device_exec_blocks="0"), "device_exec_blocks must be at least 1"),
        (params(instance_exec_blocks="two"), "instance_exec_blocks must be a whole number"),
        (
            params(graph__dot__ge__dot__dynamicDims="1,224;2,224"),
            "gives the inputs different batch sizes",
        ),
        (params(graph__dot__ge__dot__dynamicDims="0;2"), "is not a batch size"),
        (
            params(graph__dot__ge__dot__dynamicDims="1;2;4"),
            "max_batch_size 8 exceeds the largest batch gear 4 of graph.ge.dynamicDims",
        ),
    ],
)
def test_bad_parameters_are_clear_errors(body: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_plan(config(body))


def test_string_tensors_are_refused() -> None:
    body = SIMPLE_IO.replace("TYPE_INT32", "TYPE_STRING")
    parsed = model_config_pb2.ModelConfig()
    text_format.Parse(f'name: "m"\nmax_batch_size: 2\n{body}', parsed)
    with pytest.raises(ValueError, match=r"string \(BYTES\) tensors cannot live on an NPU"):
        make_plan(parsed)


def test_dynamic_non_batch_dims_compile_as_ge_dynamic_shape() -> None:
    body = SIMPLE_IO.replace("dims: [ 16 ]", "dims: [ -1 ]")
    parsed = model_config_pb2.ModelConfig()
    text_format.Parse(f'name: "m"\nmax_batch_size: 2\n{body}', parsed)
    plan = make_plan(parsed)
    assert plan.shapes.kind == "dynamic" and plan.gears == ()
    assert plan.input_shape == "INPUT0:1~2,-1;INPUT1:1~2,-1"


def test_parse_gears_accepts_commas_too() -> None:
    assert parse_gears("4,1,2") == (1, 2, 4)


def test_intra_threads_share_the_cores() -> None:
    assert intra_threads({}, streams=4, cores=16) == 4
    assert intra_threads({}, streams=4, cores=2) == 1
    assert intra_threads({"intra_op_thread_count": "3"}, streams=4, cores=2) == 3


def test_the_models_file_options_reach_atc_resolved_inside_its_folder(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "aipp").mkdir(parents=True)
    (folder / "aipp" / "real.cfg").write_text("aipp_op {}\n")
    os.symlink("real.cfg", folder / "aipp" / "insert.cfg")
    body = params(
        graph__dot__ge__dot__fusionSwitchFile="fusion.cfg",
        atc__dot__insert_op_conf="aipp/insert.cfg",
    )
    # --backend-config is the operator's: its paths pass through as given.
    operator = {"ge.compressWeightConf": "/opt/ge/compress.cfg"}
    plan = make_plan(config(body), operator, model_dir=folder)
    assert dict(plan.atc_options) == {
        "compress_weight_conf": "/opt/ge/compress.cfg",
        "fusion_switch_file": str(folder.resolve() / "fusion.cfg"),
        "insert_op_conf": str(folder.resolve() / "aipp" / "real.cfg"),
    }


@pytest.mark.parametrize(
    "body",
    [
        params(ge__dot__fusionSwitchFile="/etc/passwd"),
        params(session__dot__ge__dot__exec__dot__modify_mixlist="../other/ops.json"),
        params(atc__dot__customize_dtypes="/etc/passwd"),
        params(atc__dot__compression_optimize_conf="/etc/passwd"),
        # atc takes '-' for '_' and leading dashes; the spelling does not get past the check.
        params(**{"atc__dot__--fusion-switch-file": "/etc/passwd"}),
    ],
)
def test_a_models_file_option_outside_its_folder_is_refused(tmp_path: Path, body: str) -> None:
    with pytest.raises(OutsideFolder, match="must name a file inside the model folder"):
        make_plan(config(body), model_dir=tmp_path)


def test_atc_flag_names_cannot_smuggle_or_replace_what_ge_serve_sets() -> None:
    with pytest.raises(ValueError, match="is not an atc flag name"):
        make_plan(config(params(atc__dot__insert_op_conf__eq__x="y").replace("__eq__", "=")))
    for flag in ("output", "model", "mode", "framework", "soc_version", "dynamic_batch_size"):
        with pytest.raises(ValueError, match=f"ge-serve sets atc's --{flag} itself"):
            make_plan(config(params(**{f"atc__dot__{flag}": "x"})))
    # The error says what to set instead, and --backend-config cannot set them either.
    with pytest.raises(ValueError, match=r"give the batch gears as graph.ge.dynamicDims"):
        make_plan(config(params(**{"atc__dot__--dynamic-batch-size": "1,2"})))
    with pytest.raises(ValueError, match=r"--soc_version itself \(it is asked of the NPU"):
        make_plan(config(""), {"atc.soc_version": "Ascend910B4"})
    assert file_parameters({"atc.--insert-op-conf": "a", "atc.log": "error"}) == [
        ("atc.--insert-op-conf", "a")
    ]
