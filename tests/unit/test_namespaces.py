"""Which model a name means under --model-namespacing: clients' names and ensemble steps."""

from __future__ import annotations

import pytest

from ge_serve.server.errors import ErrorCode, ServerError
from ge_serve.server.models.namespaces import model_key, model_name, resolve, step_key

KEYS = [model_key("/r1", "calc"), model_key("/r2", "calc"), model_key("/r2", "only")]


def test_a_key_is_the_folder_path_and_ends_with_the_name() -> None:
    assert model_key("/r1", "calc") == "/r1/calc"
    assert model_key("", "calc") == "calc"
    assert model_name("/r1/calc") == "calc" and model_name("calc") == "calc"


def test_a_name_in_one_namespace_resolves_to_its_key() -> None:
    assert resolve("only", KEYS) == "/r2/only"


def test_a_name_in_several_namespaces_is_refused_with_tritons_message() -> None:
    with pytest.raises(ServerError) as caught:
        resolve("calc", KEYS)
    assert caught.value.code is ErrorCode.INVALID_ARG
    assert caught.value.message == (
        "There are 2 identifiers of model 'calc' in global map, model namespace must be "
        "provided to resolve ambiguity."
    )


def test_an_unknown_name_is_left_to_the_lookup() -> None:
    assert resolve("nope", KEYS) == "nope"


def test_a_step_prefers_its_ensembles_namespace() -> None:
    assert step_key("/r1/ens", "calc", KEYS) == "/r1/calc"
    assert step_key("/r2/ens", "calc", KEYS) == "/r2/calc"


def test_a_step_elsewhere_resolves_only_when_unique() -> None:
    assert step_key("/r1/ens", "only", KEYS) == "/r2/only"
    assert step_key("/r3/ens", "calc", KEYS) is None
    assert step_key("/r3/ens", "nope", KEYS) is None


def test_without_namespaces_a_step_is_its_name() -> None:
    assert step_key("ens", "calc", ["calc", "ens"]) == "calc"
