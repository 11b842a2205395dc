"""The load API's `config` parameter: a JSON ModelConfig, or a clear INVALID_ARG."""

from __future__ import annotations

import pytest

from ge_serve.protos import model_config_pb2
from ge_serve.server.control.model_control import parse_config_json
from ge_serve.server.errors import ErrorCode, ServerError


def test_a_json_model_config_parses() -> None:
    config = parse_config_json("m", '{"name": "m", "max_batch_size": 4}')
    assert (config.name, config.max_batch_size) == ("m", 4)


@pytest.mark.parametrize(
    "text", ["{bad", '{"max_batch_size": "many"}', "null", "3", "[1]", "[]", " [ ] ", '""', ""]
)
def test_anything_else_is_invalid_arg(text: str) -> None:
    with pytest.raises(ServerError) as info:
        parse_config_json("m", text)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert "failed to load 'm': the 'config' parameter is not a valid JSON ModelConfig" in (
        info.value.message
    )


@pytest.mark.parametrize("text", ["[]", '""', "null"])
def test_json_that_is_no_object_says_so(text: str) -> None:
    with pytest.raises(ServerError) as info:
        parse_config_json("m", text)
    assert info.value.message.endswith("not a valid JSON ModelConfig: it must be a JSON object")


def test_leading_whitespace_is_still_an_object() -> None:
    assert parse_config_json("m", ' \n{"max_batch_size": 2}').max_batch_size == 2


def test_a_lone_value_for_a_repeated_field_and_enums_in_any_case_parse_as_in_triton() -> None:
    # Triton's JsonStringToMessage (protobuf's legacy syntax, case-insensitive enums);
    # qa L0_lifecycle test_concurrent_model_instance_load_sanity sends this form.
    config = parse_config_json(
        "m",
        '{"instance_group": {"count": 2, "kind": "kind_cpu"},'
        ' "dynamic_batching": {"preferred_batch_size": 4},'
        ' "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": 3}]}',
    )
    assert [(g.count, g.kind) for g in config.instance_group] == [
        (2, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    ]
    assert list(config.dynamic_batching.preferred_batch_size) == [4]
    assert list(config.input[0].dims) == [3]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"name": "a", "name": "b"}', "duplicate key name"),
        ('{"instance_group": 3}', "instance_group"),
        ('{"instance_group": {"kind": "nope"}}', "Invalid enum value nope"),
    ],
)
def test_what_triton_refuses_is_still_refused(text: str, why: str) -> None:
    with pytest.raises(ServerError) as info:
        parse_config_json("m", text)
    assert info.value.code is ErrorCode.INVALID_ARG
    assert why in info.value.message
