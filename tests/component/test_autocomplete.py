"""Config auto-completion from ONNX files, as the lifecycle applies it while loading."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import onnx
import pytest
from modelgen import (
    ONNX_TYPES,
    add_sub_model,
    identity_model,
    make_lifecycle,
    mixed_batch_model,
    write_model,
)
from onnx import TensorProto

from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.protos import model_config_pb2 as mc
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.reports import ModelState
from ge_serve.server.models import autocomplete
from ge_serve.server.models.lifecycle import ModelLifecycle


@pytest.fixture
async def on(tmp_path: Path) -> AsyncIterator[ModelLifecycle]:
    life = make_lifecycle(tmp_path, autocomplete=True)
    try:
        yield life
    finally:
        await life.close()


@pytest.fixture
async def off(tmp_path: Path) -> AsyncIterator[ModelLifecycle]:
    life = make_lifecycle(tmp_path, autocomplete=False)
    try:
        yield life
    finally:
        await life.close()


async def loaded_config(
    life: ModelLifecycle, model: onnx.ModelProto, config: str | None = None, name: str = "m"
) -> mc.ModelConfig:
    repo = life.repository.paths[0]
    write_model(repo, name, model, config)
    await life.load(name)
    return life.get(name).config


def tensors(
    entries: Sequence[mc.ModelInput] | Sequence[mc.ModelOutput],
) -> list[tuple[str, str, list[int]]]:
    return [(e.name, mc.DataType.Name(e.data_type), list(e.dims)) for e in entries]


# --- tensors, dtypes and dims from the ONNX file ------------------------------------------------


async def test_everything_from_the_file_with_dynamic_batch(on: ModelLifecycle) -> None:
    config = await loaded_config(on, add_sub_model(("batch", 4)))
    assert tensors(config.input) == [("A", "TYPE_FP32", [4]), ("B", "TYPE_FP32", [4])]
    assert tensors(config.output) == [("SUM", "TYPE_FP32", [4]), ("DIFF", "TYPE_FP32", [4])]
    assert config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    assert config.backend == "onnxruntime"
    assert config.default_model_filename == "model.onnx"
    assert len(config.instance_group) == 1
    group = config.instance_group[0]
    assert (group.count, group.kind) == (1, mc.ModelInstanceGroup.KIND_CPU)
    assert group.name


async def test_fixed_first_dim_means_no_batching(on: ModelLifecycle) -> None:
    config = await loaded_config(on, add_sub_model((2, 4)))
    assert config.max_batch_size == 0
    assert tensors(config.input) == [("A", "TYPE_FP32", [2, 4]), ("B", "TYPE_FP32", [2, 4])]
    assert not config.HasField("dynamic_batching")


async def test_batching_needs_every_first_dim_dynamic(on: ModelLifecycle) -> None:
    config = await loaded_config(on, mixed_batch_model())
    assert config.max_batch_size == 0
    assert tensors(config.input) == [("X", "TYPE_FP32", [-1, 3])]
    assert tensors(config.output) == [("Y", "TYPE_FP32", [1, 1])]


async def test_a_tensor_of_only_the_batch_dim_gets_dims_1_and_an_empty_reshape(
    on: ModelLifecycle,
) -> None:
    # A sum over each row: [N, 4] in, [N] out. Config dims may not be empty, so Triton's
    # onnxruntime backend writes dims [1] with reshape [] (AutoCompleteIO); the client
    # sees [N, 1].
    config = await loaded_config(on, identity_model(TensorProto.FLOAT, ("batch",)))
    assert config.max_batch_size == 4
    shapes = [(list(e.dims), e.HasField("reshape"), list(e.reshape.shape)) for e in config.input]
    shapes += [(list(e.dims), e.HasField("reshape"), list(e.reshape.shape)) for e in config.output]
    assert shapes == [([1], True, []), ([1], True, [])]


async def test_inner_dynamic_dims_become_minus_one(on: ModelLifecycle) -> None:
    config = await loaded_config(on, identity_model(TensorProto.INT64, ("batch", None, "seq", 7)))
    assert config.max_batch_size == 4
    assert tensors(config.input) == [("INPUT", "TYPE_INT64", [-1, -1, 7])]


@pytest.mark.parametrize("datatype", sorted(ONNX_TYPES))
async def test_every_datatype(on: ModelLifecycle, datatype: str) -> None:
    config = await loaded_config(on, identity_model(ONNX_TYPES[datatype]))
    expected = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    assert tensors(config.input) == [("INPUT", expected, [-1])]
    assert tensors(config.output) == [("OUTPUT", expected, [-1])]


# --- what the config already says is kept --------------------------------------------------------


async def test_configured_max_batch_size_gets_dynamic_batching(on: ModelLifecycle) -> None:
    config = await loaded_config(on, add_sub_model(), 'name: "m"\nmax_batch_size: 8\n')
    assert config.max_batch_size == 8
    assert config.HasField("dynamic_batching")


async def test_a_config_listing_inputs_and_outputs_gets_no_dynamic_batching(
    on: ModelLifecycle,
) -> None:
    # Triton's onnxruntime backend skips its auto-complete for such a config (its own
    # `simple` example): each request runs alone.
    listed = (
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }, '
        '{ name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    config = await loaded_config(on, add_sub_model(), "max_batch_size: 8\n" + listed)
    assert config.max_batch_size == 8
    assert not config.HasField("dynamic_batching")


async def test_max_batch_size_one_gets_no_dynamic_batching(on: ModelLifecycle) -> None:
    config = await loaded_config(on, add_sub_model(), "max_batch_size: 1\n")
    assert config.max_batch_size == 1
    assert not config.HasField("dynamic_batching")


async def test_configured_scheduler_is_kept(on: ModelLifecycle) -> None:
    config = await loaded_config(
        on,
        add_sub_model(),
        "max_batch_size: 2\ndynamic_batching { max_queue_delay_microseconds: 70 }",
    )
    assert config.dynamic_batching.max_queue_delay_microseconds == 70
    config = await loaded_config(
        on, add_sub_model(), "max_batch_size: 2\nsequence_batching {}", name="seq"
    )
    assert config.HasField("sequence_batching") and not config.HasField("dynamic_batching")


async def test_listed_tensors_are_completed_not_overwritten(on: ModelLifecycle) -> None:
    text = """
        max_batch_size: 2
        input [ { name: "B" dims: [ -1 ] }, { name: "A" } ]
        output [ { name: "SUM" data_type: TYPE_FP32 } ]
    """
    config = await loaded_config(on, add_sub_model(), text)
    assert tensors(config.input) == [("B", "TYPE_FP32", [-1]), ("A", "TYPE_FP32", [4])]
    # A listed side is the config's whole list, as Triton reads it: DIFF is not added.
    assert tensors(config.output) == [("SUM", "TYPE_FP32", [4])]


async def test_a_side_left_out_is_filled_in(on: ModelLifecycle) -> None:
    text = 'max_batch_size: 2 input [ { name: "A" }, { name: "B" } ]'
    config = await loaded_config(on, add_sub_model(), text)
    assert tensors(config.output) == [("SUM", "TYPE_FP32", [4]), ("DIFF", "TYPE_FP32", [4])]


async def test_a_model_input_left_out_of_listed_inputs_fails_the_load(on: ModelLifecycle) -> None:
    # Triton's too_few_inputs (qa L0_model_config): the config lists inputs and outputs,
    # so auto-complete adds none, and the load names the count.
    text = """
        max_batch_size: 2
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """
    with pytest.raises(ServerError) as info:
        await loaded_config(on, add_sub_model(), text)
    assert info.value.message == (
        "load failed for model 'm': version 1 is at UNAVAILABLE state: unable to load model "
        "'m', configuration expects 1 inputs, model provides 2;"
    )


async def test_full_rank_dims_in_config_mean_no_batching(on: ModelLifecycle) -> None:
    text = 'input [ { name: "A" dims: [ -1, 4 ] }, { name: "B" dims: [ -1, 4 ] } ]'
    config = await loaded_config(on, add_sub_model(), text)
    assert config.max_batch_size == 0
    assert tensors(config.input)[0] == ("A", "TYPE_FP32", [-1, 4])
    assert tensors(config.output)[0] == ("SUM", "TYPE_FP32", [-1, 4])


async def test_instance_groups_are_filled(on: ModelLifecycle) -> None:
    text = "instance_group [ { kind: KIND_CPU }, { count: 2 kind: KIND_CPU } ]"
    config = await loaded_config(on, add_sub_model(), text)
    groups = [(g.name, g.count) for g in config.instance_group]
    assert groups == [("m_0", 1), ("m_1", 2)]
    assert len(on.get("m").loaded.executors) == 3


async def test_missing_model_file_fails_clearly(on: ModelLifecycle) -> None:
    write_model(on.repository.paths[0], "m", None)
    with pytest.raises(ServerError) as info:
        await on.load("m")
    assert "failed to load 'm'" in info.value.message
    assert "model.onnx' does not exist" in info.value.message


async def test_unknown_backend_fails_clearly(on: ModelLifecycle) -> None:
    with pytest.raises(ServerError) as info:
        await loaded_config(on, add_sub_model(), 'backend: "tensorflow"')
    assert info.value.code is ErrorCode.UNSUPPORTED
    assert "backend 'tensorflow' is not supported" in info.value.message


# --- --disable-auto-complete-config ------------------------------------------------------

FULL = """
max_batch_size: 2
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


async def test_disabled_leaves_the_config_tensors_alone(off: ModelLifecycle) -> None:
    config = await loaded_config(off, add_sub_model(), FULL)
    assert tensors(config.input) == [("A", "TYPE_FP32", [4]), ("B", "TYPE_FP32", [4])]
    # DIFF is in the file but not in the config, and stays out.
    assert tensors(config.output) == [("SUM", "TYPE_FP32", [4])]
    assert not config.HasField("dynamic_batching")
    assert config.max_batch_size == 2
    # The defaults every config ends up with are still there.
    assert config.instance_group[0].count == 1


async def test_disabled_full_rank_config_loads_without_batching(off: ModelLifecycle) -> None:
    text = FULL.replace("max_batch_size: 2", "").replace("dims: [ 4 ]", "dims: [ -1, 4 ]")
    config = await loaded_config(off, add_sub_model(), text)
    assert config.max_batch_size == 0
    assert tensors(config.input)[0] == ("A", "TYPE_FP32", [-1, 4])


async def test_disabled_without_inputs_fails_with_a_reason(off: ModelLifecycle) -> None:
    with pytest.raises(ServerError) as info:
        await loaded_config(off, add_sub_model(), 'name: "m"')
    message = info.value.message
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "failed to load 'm'" in message
    assert "no inputs and no outputs" in message
    assert "--disable-auto-complete-config" in message
    rows = off.index()
    assert rows[0].state is ModelState.UNAVAILABLE and "no inputs" in rows[0].reason


async def test_disabled_without_a_config_file_the_folder_fails_to_poll(
    off: ModelLifecycle, caplog: pytest.LogCaptureFixture
) -> None:
    # Triton (qa L0_lifecycle test_parse_error_no_model_config): with configs used as
    # written, a folder with no config.pbtxt fails to poll: no model at all, not one that
    # failed to load. The index lists the folder with no state (as Triton lists every
    # folder), and readiness does not wait for it.
    with pytest.raises(ServerError) as info:
        await loaded_config(off, add_sub_model())
    assert info.value.message == "failed to load 'm', failed to poll from model repository"
    assert [(row.name, row.version, row.state, row.reason) for row in off.index()] == [
        ("m", None, None, "")
    ]
    assert off.all_ready()
    assert "failed to open text file for read" in caplog.text
    assert "/m/config.pbtxt: No such file or directory" in caplog.text


async def test_disabled_tensor_without_dims_fails(off: ModelLifecycle) -> None:
    text = FULL.replace(
        '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }', '{ name: "B" data_type: TYPE_FP32 }'
    )
    with pytest.raises(ServerError, match="tensor 'B' has no dims"):
        await loaded_config(off, add_sub_model(), text)


async def test_disabled_tensor_without_data_type_fails(off: ModelLifecycle) -> None:
    text = FULL.replace(
        '{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }', '{ name: "B" dims: [ 4 ] }'
    )
    with pytest.raises(ServerError, match="tensor 'B' has no data_type"):
        await loaded_config(off, add_sub_model(), text)


# --- a config that does not fit the model fails at load, not at the first request -----------


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (("A\" data_type: TYPE_FP32", "A\" data_type: TYPE_INT32"),
         "unable to load model 'm', configuration expects datatype TYPE_INT32 for input 'A', "
         "model provides TYPE_FP32"),
        (('name: "SUM"', 'name: "TOTAL"'),
         "unexpected inference output 'TOTAL', allowed outputs are: DIFF, SUM"),
        (('"A" data_type: TYPE_FP32 dims: [ 4 ]', '"A" data_type: TYPE_FP32 dims: [ 5 ]'),
         "model 'm', tensor 'A': the model expects 2 dimensions (shape [-1,4]) but the model "
         "configuration specifies 2 dimensions (an initial batch dimension because "
         "max_batch_size > 0 followed by the explicit tensor shape, making complete shape "
         "[-1,5])"),
        (("max_batch_size: 2", "max_batch_size: 0"),
         "model 'm', tensor 'A': the model expects 2 dimensions (shape [-1,4]) but the model "
         "configuration specifies 1 dimensions (shape [4])"),
        (('{ name: "B" data_type: TYPE_FP32 dims: [ 4 ] }', ""),
         "unable to load model 'm', configuration expects 1 inputs, model provides 2"),
    ],
)  # fmt: skip
async def test_config_must_fit_the_model(
    off: ModelLifecycle, change: tuple[str, str], reason: str
) -> None:
    text = FULL.replace(*change).replace("},\n  \n]", "}\n]")
    assert text != FULL
    with pytest.raises(ServerError) as info:
        await loaded_config(off, add_sub_model(), text)
    assert reason in info.value.message
    assert info.value.message.startswith(
        "load failed for model 'm': version 1 is at UNAVAILABLE state: "
    )


# --- shapes Triton refuses (ValidateIOShape) fail the load, not every request --------------

SUM = '{ name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }'
A = '{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] }'
FOR_M = " for m"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ((SUM, '{ name: "SUM" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape: { shape: [ 4 ] } }'),
         "model output 'SUM' has different size for dims and reshape"),
        ((A, '{ name: "A" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape: { shape: [ 4 ] } }'),
         "model input 'A' has different size for dims and reshape"),
        ((A, '{ name: "A" data_type: TYPE_FP32 dims: [ 0 ] }'),
         "model input 'A' dimension must be integer >= 1, or -1 to indicate a variable-size "
         "dimension"),
        ((A, '{ name: "A" data_type: TYPE_FP32 dims: [ -2 ] }'),
         "model input 'A' dimension must be integer >= 1, or -1 to indicate a variable-size "
         "dimension"),
        ((A, '{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 4, 0 ] } }'),
         "model input 'A' reshape dimensions must be integer >= 1, or -1 to indicate a "
         "variable-size dimension"),
        ((A, '{ name: "A" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape: { shape: [ -1, 2 ] } }'),
         "model input 'A' has different size for dims and reshape"),
        ((A, '{ name: "A" data_type: TYPE_FP32 dims: [ -1 ] reshape: { shape: [ -1, -1 ] } }'),
         "model input 'A' has different number of variable-size dimensions for dims and "
         "reshape"),
        ((A, '{ name: "A" data_type: TYPE_FP32 dims: [ -1 ] reshape: { shape: [ 4 ] } }'),
         "model input 'A' has different size for dims and reshape"),
        ((A, '{ name: "A" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ ] } }'),
         "model input 'A' has different size for dims and reshape"),
        ((A, '{ name: "A" data_type: TYPE_FP32 reshape: { shape: [ 4 ] } }'),
         "tensor 'A' has no dims"),
        ((A, '{ name: "A" data_type: TYPE_FP32 dims: [ 4611686018427387904, 2 ] '
             'reshape: { shape: [ 4611686018427387904, 2 ] } }'),
         "element count for tensor 'A dims' exceeds maximum size of 9223372036854775807"),
        ((A, '{ name: "A" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } }'),
         "model input 'A' cannot have empty reshape for non-batching model as scalar tensors "
         "are not supported"),
    ],
)  # fmt: skip
async def test_shapes_triton_refuses_fail_the_load(
    off: ModelLifecycle, change: tuple[str, str], reason: str
) -> None:
    text = FULL.replace(*change)
    if "empty reshape" in reason:
        text = text.replace("max_batch_size: 2", "max_batch_size: 0")
    assert text != FULL
    with pytest.raises(ServerError) as info:
        await loaded_config(off, add_sub_model(), text)
    assert info.value.code is ErrorCode.INVALID_ARG
    message = info.value.message
    assert message.startswith("failed to load 'm': ") and reason in message
    assert "has no dims" in reason or message.endswith(reason + FOR_M)
    rows = off.index()
    assert rows[0].state is ModelState.UNAVAILABLE and reason in rows[0].reason


@pytest.mark.parametrize(
    ("dims", "reshape"),
    [([2, 4, -1, 6], [8, -1, 1, 6]), ([1], []), ([-1, 4], [-1, 2, 2]), ([4], [2, 2])],
)
def test_reshapes_triton_accepts_pass_the_check(dims: list[int], reshape: list[int]) -> None:
    config = mc.ModelConfig(name="m", max_batch_size=2)
    entry = config.input.add(name="A", data_type=mc.TYPE_FP32, dims=dims)
    entry.reshape.SetInParent()
    entry.reshape.shape.extend(reshape)
    config.output.add(name="B", data_type=mc.TYPE_FP32, dims=[4])
    autocomplete.check(config)


# --- default-max-batch-size (--backend-config) ------------------------------------------


@pytest.mark.parametrize(
    ("default", "dims"),
    [(0, [-1, 4]), (16, [4])],
    ids=["0 leaves batching off", "16 is the auto-completed max_batch_size"],
)
async def test_a_default_max_batch_size(tmp_path: Path, default: int, dims: list[int]) -> None:
    life = make_lifecycle(tmp_path, autocomplete=True)
    life.backends["onnxruntime"] = OnnxRuntimeBackend(default_max_batch_size=default)
    try:
        config = await loaded_config(life, add_sub_model(("batch", 4)))
    finally:
        await life.close()
    assert config.max_batch_size == default
    assert config.HasField("dynamic_batching") is (default > 1)
    assert tensors(config.input) == [("A", "TYPE_FP32", dims), ("B", "TYPE_FP32", dims)]


# --- instance groups Triton refuses (ValidateInstanceGroup) -----------------------------


@pytest.mark.parametrize(
    ("group", "says"),
    [
        ("{ count: 1 kind: KIND_CPU gpus: [ 0 ] }",
         "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"),
        ('{ name: "g" kind: KIND_MODEL gpus: [ 0, 1 ] }',
         "instance group g of model m has kind KIND_MODEL but specifies one or more GPUs"),
    ],
)  # fmt: skip
async def test_groups_of_a_kind_without_devices_may_not_list_gpus(
    off: ModelLifecycle, group: str, says: str
) -> None:
    text = FULL + f"instance_group [ {group} ]\n"
    with pytest.raises(ServerError) as info:
        await loaded_config(off, add_sub_model(), text)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert info.value.message == f"failed to load 'm': {says}"


async def test_a_cpu_group_without_gpus_loads(off: ModelLifecycle) -> None:
    text = FULL + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
    config = await loaded_config(off, add_sub_model(), text)
    assert [(g.name, g.count) for g in config.instance_group] == [("m_0", 2)]


@pytest.mark.parametrize("fill", [True, False], ids=["autocomplete", "disabled"])
@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ('platform: "onnxruntime_onnx"', ("onnxruntime", "onnxruntime_onnx")),
        ('backend: "onnxruntime"', ("onnxruntime", "onnxruntime_onnx")),
    ],
    ids=["platform", "backend"],
)
async def test_backend_and_platform_fill_each_other_as_triton(
    tmp_path: Path, fill: bool, given: str, shown: tuple[str, str]
) -> None:
    """Triton's AutoCompleteBackendFields runs with auto-complete off too: the config API
    shows an onnxruntime model's backend and platform whichever the config names."""
    life = make_lifecycle(tmp_path, autocomplete=fill)
    try:
        config = await loaded_config(life, add_sub_model(), f"{given}\n{FULL}")
        assert (config.backend, config.platform) == shown
    finally:
        await life.close()
