"""A JSON schema is read as vLLM's default structured-outputs backend reads it (xgrammar's
strict_mode: backends/llm/strictschema.py): the compiled grammar refuses the properties
and tuple items a schema does not declare, and keeps what a schema says itself. Checked
on the engine's own constraint, byte by byte with the byte-level tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llmrepo
import numpy as np
import pytest

from ge_serve.backends.llm.structured import Grammars, parse_structured
from ge_serve.backends.llm.text import Tokenizer
from ge_serve.server.http.openai.guided import guide
from ge_serve.server.http.openai.tools import Tool, constraint

EOS = 256
INT = {"type": "integer"}
A = {"type": "object", "properties": {"a": INT}}


@pytest.fixture(scope="module")
def grammars(tmp_path_factory: pytest.TempPathFactory) -> Grammars:
    path: Path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    llmrepo.byte_tokenizer().save(str(path))
    return Grammars(Tokenizer(path), llmrepo.VOCAB, frozenset({EOS}))


def accepts(grammars: Grammars, structured: Any, text: str) -> bool:
    """Whether the grammar of `structured` (the sampling key's value) allows `text`, then
    the end."""
    rule = grammars.constraint(parse_structured(structured))
    row = np.zeros(llmrepo.VOCAB, dtype=np.float32)
    for token in [*llmrepo.prompt_ids(text), EOS]:
        allowed = rule.allowed(row)
        if allowed is None or not np.isfinite(allowed[token]):
            return False
        if token != EOS:
            rule.accept(token)
    return True


@pytest.mark.parametrize(
    "structured",
    [
        {"json": A},
        {"json": json.dumps(A), "disable_additional_properties": False},  # Triton's form
        {"json": A, "disable_additional_properties": True},
    ],
)
def test_undeclared_properties_are_refused(grammars: Grammars, structured: Any) -> None:
    assert accepts(grammars, structured, '{"a": 1}')
    assert not accepts(grammars, structured, '{"a": 1, "b": 2}')
    assert not accepts(grammars, structured, '{"b": 2}')


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        # Nested objects, by `$ref` too (Pydantic's models).
        (
            {"type": "object", "properties": {"o": A}},
            '{"o": {"a": 1}}',
            '{"o": {"a": 1, "z": 2}}',
        ),
        (
            {"$defs": {"P": A}, "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}},
            '{"p": {"a": 1}}',
            '{"p": {"z": 1}}',
        ),
        ({"type": "array", "items": A}, '[{"a": 1}]', '[{"a": 1, "z": 2}]'),
        # A tuple holds what it lists.
        ({"type": "array", "prefixItems": [INT]}, "[1]", "[1, 2]"),
        ({"type": "object", "patternProperties": {"^x": INT}}, '{"x1": 1}', '{"y": 1}'),
        # A required name the object does not declare cannot be given (xgrammar's
        # reading: the schema compiles, and the name is refused).
        ({**A, "required": ["a", "unit"]}, '{"a": 1}', '{"a": 1, "unit": 2}'),
        # One `allOf` branch is the object itself, closed as xgrammar closes it.
        ({"allOf": [A]}, '{"a": 1}', '{"a": 1, "z": 2}'),
    ],
)
def test_strictness_reaches_every_object_and_tuple(
    grammars: Grammars, schema: Any, good: str, bad: str
) -> None:
    assert accepts(grammars, {"json": schema}, good)
    assert not accepts(grammars, {"json": schema}, bad)


# What a schema says itself, and what declares no properties, is kept.
KEPT = [
    ({**A, "additionalProperties": True}, '{"a": 1, "b": 2}'),
    ({**A, "additionalProperties": {"type": "string"}}, '{"a": 1, "b": "x"}'),
    ({"type": "array", "prefixItems": [INT], "items": INT}, "[1, 2]"),
    # No declared properties: any object, as json_object mode.
    ({"type": "object"}, '{"z": [1]}'),
    ({}, '{"z": 1}'),
    # The parts of one object are not closed against each other.
    ({"allOf": [A, {"properties": {"b": INT}}]}, '{"a": 1, "b": 2}'),
    (
        {"type": "object", "properties": {"k": INT}, "anyOf": [A, {"required": ["k"]}]},
        '{"k": 1, "a": 2}',
    ),
    # ... nor where a part is a `$ref` to the root's `$defs`, as it would not be inline.
    (
        {"allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"b": INT}}], "$defs": {"Base": A}},
        '{"a": 1, "b": 2}',
    ),
    (
        {"properties": {"k": INT}, "anyOf": [{"$ref": "#/definitions/A"}], "definitions": {"A": A}},
        '{"k": 1, "a": 2}',
    ),
]


def test_only_what_a_schema_leaves_unsaid_is_closed(grammars: Grammars) -> None:
    assert not accepts(grammars, {"json": A}, '{"a": 1, "b": 2}')
    for schema, text in KEPT:
        assert accepts(grammars, {"json": schema}, text), schema
    # json_object mode: any object.
    assert accepts(grammars, {"json_object": True}, '{"a": 1, "b": {"c": []}}')


def test_required_tool_choice_calls_have_the_declared_keys_only(grammars: Grammars) -> None:
    """vLLM's array-of-calls schema, read strictly: a call has `name` and `parameters`,
    the parameters what the function declares."""
    tool = Tool.model_validate({"type": "function", "function": {"name": "f", "parameters": A}})
    structured = constraint([tool], "required")
    assert accepts(grammars, structured, '[{"name": "f", "parameters": {"a": 1}}]')
    assert not accepts(grammars, structured, '[{"name": "f", "parameters": {"a": 1}, "x": 1}]')
    assert not accepts(grammars, structured, '[{"name": "f", "parameters": {"b": 1}}]')


def test_a_trtllm_guide_carries_the_strict_reading() -> None:
    """A TensorRT-LLM-style model compiles its guide itself: the schema it gets says
    what the `llm` engine reads."""
    kind, text = guide(json.dumps({"json": A, "disable_additional_properties": False}), "m")
    assert kind == "json_schema" and text is not None
    assert json.loads(text) == {**A, "additionalProperties": False}
    kept = {**A, "additionalProperties": True}
    assert json.loads(guide(json.dumps({"json": json.dumps(kept)}), "m")[1] or "") == kept


def test_required_names_beside_patterns_are_left_to_the_grammar() -> None:
    """Which names a client's `patternProperties` match is the grammar compiler's to
    judge: matching them here would run the client's regular expressions on the server's
    thread (a nested repetition takes hours)."""
    from ge_serve.backends.llm.strictschema import close

    schema: dict[str, Any] = {"properties": {"a": INT}, "patternProperties": {"^(x+)+$": INT}}
    schema["required"] = ["a", "x" * 40 + "!"]
    close(schema)
    assert schema["required"] == ["a", "x" * 40 + "!"]
    assert schema["additionalProperties"] is False
