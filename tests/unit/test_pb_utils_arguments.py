"""What a Python model sees when it builds pb_utils objects with bad arguments: Triton's
errors (pybind11's TypeError where its binding refuses an argument, TritonModelException
with PyParametersToJSON's messages for parameters). qa argument_validation, bls
test_bls_incorrect_args, L0_backend_python/parameters."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from ge_serve.backends.python.child.pb_observe import Logger
from ge_serve.backends.python.child.pb_request import InferenceRequest, InferenceResponse
from ge_serve.backends.python.child.pb_tensor import Tensor
from ge_serve.backends.python.child.pb_types import TritonModelException

_IN = Tensor("IN", np.array([1], np.int32))
_BAD_VALUE = "Expect parameters values to have type bool/int/str, found type "
_NEEDED = {"model_name": "m", "inputs": [_IN], "requested_output_names": ["OUT"]}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"f": 0.5}, _BAD_VALUE + "<class 'float'>"),
        ({"n": None}, _BAD_VALUE + "<class 'NoneType'>"),
        ({1: "int key"}, "Expect parameters keys to have type str, found type <class 'int'>"),
        ([], "Expect dict, got <class 'list'>"),
        ('{"a": 1}', "Expect dict, got <class 'str'>"),
    ],
)  # fmt: skip
def test_bad_parameters_are_refused_with_tritons_messages(parameters: Any, message: str) -> None:
    with pytest.raises(TritonModelException) as response_error:
        InferenceResponse([], parameters=parameters)
    assert str(response_error.value) == message
    with pytest.raises(TritonModelException) as request_error:
        InferenceRequest("m", [_IN], ["OUT"], parameters=parameters)
    assert str(request_error.value) == message


def test_good_parameters_are_kept() -> None:
    parameters = {"a": "1", "c": 3, "d": False, "f": ""}
    assert InferenceResponse([], parameters=parameters).parameters() == (
        '{"a": "1", "c": 3, "d": false, "f": ""}'
    )
    request = InferenceRequest("m", [_IN], ["OUT"], parameters=parameters)
    assert request.parameters() == '{"a": "1", "c": 3, "d": false, "f": ""}'


@pytest.mark.parametrize(
    "arguments",
    [
        {"inputs": [_IN], "requested_output_names": ["OUT"]},
        {"model_name": "m", "requested_output_names": ["OUT"]},
        {"model_name": "m", "inputs": [_IN]},
        {"model_name": None, "inputs": [_IN], "requested_output_names": ["OUT"]},
        {"model_name": "m", "inputs": None, "requested_output_names": ["OUT"]},
        {"model_name": "m", "inputs": [None], "requested_output_names": ["OUT"]},
        {"model_name": "m", "inputs": [_IN], "requested_output_names": None},
        {**_NEEDED, "request_id": None},
        {**_NEEDED, "flags": None},
        {**_NEEDED, "correlation_id": None},
        {**_NEEDED, "model_version": None},
    ],
)  # fmt: skip
def test_a_bls_request_with_a_missing_or_none_argument_is_a_type_error(
    arguments: dict[str, Any],
) -> None:
    with pytest.raises(TypeError):
        InferenceRequest(**arguments)


def test_a_response_or_tensor_with_none_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        InferenceResponse(output_tensors=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        InferenceResponse(output_tensors=[np.array([1])])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        Tensor(None, np.array([1], np.int32))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Logger.log("message", None)  # type: ignore[arg-type]
    # What Triton takes still works.
    assert InferenceResponse().output_tensors() == []
    assert InferenceResponse(output_tensors=[_IN]).output_tensors() == [_IN]
