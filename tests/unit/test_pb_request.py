"""`pb_utils.InferenceRequest` as a Python model builds one for a BLS call."""

from __future__ import annotations

import pytest

from ge_serve.backends.python.child.pb_request import InferenceRequest
from ge_serve.backends.python.child.pb_types import TritonModelException


def test_a_negative_timeout_is_refused_where_the_request_is_made() -> None:
    # It used to run as if it had no timeout at all.
    with pytest.raises(TritonModelException, match="timeout must be microseconds >= 0"):
        InferenceRequest("m", [], [], timeout=-5)
    assert InferenceRequest("m", [], [], timeout=0).timeout() == 0
    assert InferenceRequest("m", [], [], timeout=5_000).timeout() == 5_000
