"""The header-forward pattern as Triton reads it: `(?i)` before it, searched anywhere in
the name; `(?-i)` makes it case sensitive again; one that does not compile is a usage
error at startup."""

from __future__ import annotations

import pytest

from ge_serve.server.cli import parse_settings
from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.header_forward import HeaderForward
from ge_serve.server.inference.types import InferRequest, Parameters


def forwarded(pattern: str, *names: str) -> Parameters:
    request = InferRequest("m")
    HeaderForward(pattern).apply(request, [(name, "v") for name in names])
    return request.parameters


def test_the_pattern_ignores_case_and_matches_anywhere() -> None:
    assert forwarded("MY_HEADER.*", "my_header_1", "x-my_header", "header_1") == {
        "my_header_1": "v",
        "x-my_header": "v",
    }


def test_a_leading_minus_i_makes_it_case_sensitive() -> None:
    assert forwarded("(?-i)MY_HEADER.*", "my_header_1") == {}
    assert forwarded("(?-i)my_header", "my_header_1") == {"my_header_1": "v"}


def test_binary_metadata_becomes_text() -> None:
    request = InferRequest("m")
    HeaderForward("data").apply(request, [("data-bin", b"\x00ab")])
    assert request.parameters == {"data-bin": "\x00ab"}


@pytest.mark.parametrize("name", ["triton_x", "priority", "headers", "binary_data_output"])
def test_a_reserved_name_is_refused(name: str) -> None:
    with pytest.raises(ServerError) as caught:
        forwarded(".*", name)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == (
        f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
    )


def test_the_flags_are_settings_not_warnings() -> None:
    settings = parse_settings(
        [
            "--model-repository=/m",
            "--http-header-forward-pattern=a.*",
            "--grpc-header-forward-pattern=b",
        ]
    )
    assert (settings.http_header_forward_pattern, settings.grpc_header_forward_pattern) == (
        "a.*",
        "b",
    )
    assert settings.inapplicable == ()


def test_a_pattern_that_does_not_compile_stops_the_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_settings(["--model-repository=/m", "--http-header-forward-pattern=(unclosed"])
    assert "--http-header-forward-pattern" in capsys.readouterr().err
