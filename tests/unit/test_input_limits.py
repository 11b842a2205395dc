"""The bounds on what a client may name: shapes and version strings."""

from __future__ import annotations

import numpy as np
import pytest

from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.inference.types import MAX_DIMS, MAX_ELEMENTS, check_shape
from ge_serve.server.models.repository import parse_version

OVERFLOW = "causes total element count to exceed maximum size of"


def test_parse_version() -> None:
    assert parse_version("1") == 1
    assert parse_version("01") == 1
    assert parse_version(str(2**63 - 1)) == 2**63 - 1
    for text in [
        "",
        "\u00b2",
        "\u0661",
        "1\u0661",
        " 1",
        "+1",
        "-1",
        "1_0",
        str(2**63),
        "1" * 5000,
    ]:
        assert parse_version(text) is None, text


def test_check_shape() -> None:
    assert check_shape((2, 3), "x") == 6
    assert check_shape((0, MAX_ELEMENTS), "x") == 0
    assert check_shape((np.int64(4),), "x") == 4
    assert check_shape((), "x") == 1
    for shape, fragment in [
        ((0, MAX_ELEMENTS + 1), OVERFLOW),
        ((2**40, 2**40), OVERFLOW),
        ((1, -1), "negative dimension"),
        ((True, 2), "must hold integers"),
        ((1.5,), "must hold integers"),
        ((1,) * (MAX_DIMS + 1), "more than the maximum of"),
    ]:
        with pytest.raises(ServerError) as caught:
            check_shape(shape, "x")  # type: ignore[arg-type]
        assert caught.value.code is ErrorCode.INVALID_ARG
        assert fragment in caught.value.message and "'x'" in caught.value.message


def test_limit_is_what_an_eight_byte_element_allows() -> None:
    assert MAX_ELEMENTS * 8 <= 2**63 - 1 < (MAX_ELEMENTS + 1) * 8
    np.empty((0, MAX_ELEMENTS), dtype=np.float64)  # numpy takes the largest shape we do
