"""The load API's `config` parameter: a JSON ModelConfig, or a clear INVALID_ARG."""

from __future__ import annotations

import pytest

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
