"""Structured outputs on /v1: `response_format` (json_object, json_schema), vLLM's
`structured_outputs`, and the legacy `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar`, all given to the model as the one sampling key `structured_outputs`
(the JSON text of vLLM's StructuredOutputsParams, as Triton's OpenAI frontend sends it
to its vLLM backend; the `llm` engine reads it, backends/llm/structured.py).

vLLM 0.34 ignores the guided_* fields since their removal (with a warning): an old client
gets unconstrained text and no error. Here they are mapped as vLLM did before 0.11, so
that such a client gets what it asks for. The checks and words are vLLM's
(structured_outputs_from_response_format, check_structured_outputs_count); the engine
checks the rest (exactly one constraint, the grammar itself)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ge_serve.backends.llm.structtag import structural_tag

from .errors import OpenAIError

# The legacy fields, by the StructuredOutputsParams field each stood for.
GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
KEY = "structured_outputs"
# The `llm` engine's key (ge-serve's, not vLLM's): the text after which the grammar
# applies, `</think>` with --reasoning-parser (reasoning.py). A /v1 client cannot set it:
# as any field vLLM does not know, it is ignored.
AFTER = "structured_outputs_after"


def constrained(given: Mapping[str, Any], chosen: Any, output_field: str) -> str | None:
    """The field whose structured outputs constrain the answer, if one does: `given`, the
    request's sampling keys, `chosen` its tool choice; `output_field` the API's field of
    an output format (chat's `response_format`...) where no tool is forced."""
    if KEY not in given:
        return None
    if chosen == "required" or isinstance(chosen, dict):
        return "tool_choice"
    return output_field


def structured_outputs(body: Any) -> str | None:
    """The JSON text of the request's constraint; None where it sets none. `body` is a
    chat or completions request (schemas.Sampling)."""
    params = _with_response_format(given(body), body.response_format)
    if params is None:
        return None
    try:
        return json.dumps(params)
    except RecursionError:  # a schema nested past Python's limit (orjson read it)
        raise OpenAIError("the schema is nested too deeply", param=KEY) from None


def given(body: Any) -> dict[str, Any] | None:
    """The request's own `structured_outputs` (or the legacy guided_* fields), without
    `response_format`: what vLLM's check_structured_outputs_count counts."""
    params = _given(body.structured_outputs)
    guided = {field: getattr(body, name) for name, field in GUIDED.items()}
    guided = {k: v for k, v in guided.items() if v is not None}
    if guided:
        if params is not None:
            raise OpenAIError(f"Give '{KEY}' or the legacy 'guided_*' fields, not both", param=KEY)
        if sum(k in guided for k in ("json", "regex", "choice")) > 1:
            # vLLM's words, from before the fields' removal.
            raise OpenAIError(
                "You can only use one kind of guided decoding "
                "('guided_json', 'guided_regex' or 'guided_choice').",
                param="guided_json",
            )
        pattern = body.guided_whitespace_pattern
        if pattern is not None:
            # vLLM before 0.11 passed it on to the JSON grammar's whitespace.
            guided["whitespace_pattern"] = pattern
        params = guided
    return params


def _given(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise OpenAIError(f"'{KEY}' must be an object", param=KEY)
    if sum(value.get(k) is not None for k in ("json", "regex", "choice")) > 1:
        raise OpenAIError(
            "You can only use one kind of constraints for structured "
            "outputs ('json', 'regex' or 'choice').",
            param=KEY,
        )
    return dict(value)


def _with_response_format(params: dict[str, Any] | None, fmt: Any) -> dict[str, Any] | None:
    """vLLM's structured_outputs_from_response_format: the format overrides its field of
    `structured_outputs` (so a `regex` there and a json_object format are two
    constraints, which the engine refuses in vLLM's words)."""
    if fmt is None or fmt.type == "text":
        return params
    if fmt.type == "json_object":
        overrides: dict[str, Any] = {"json_object": True}
    elif fmt.type == "json_schema":
        spec = fmt.json_schema
        if spec is None:
            raise OpenAIError(
                "When response_format type is 'json_schema', the 'json_schema' field "
                "must be provided.",
                param="response_format",
            )
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise OpenAIError(
                "response_format.json_schema must be an object with a 'name' string",
                param="response_format",
            )
        schema = spec.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise OpenAIError(
                "response_format.json_schema.schema must be an object", param="response_format"
            )
        overrides = {"json": schema}
    elif fmt.type == "structural_tag":
        # vLLM's: the format as JSON text, checked here, as vLLM's request parsing does.
        given = {"structures": fmt.structures, "triggers": fmt.triggers, "format": fmt.format}
        try:
            overrides = {"structural_tag": structural_tag(given)}
        except ValueError as exc:
            raise OpenAIError(
                f"Invalid response_format structural_tag specification: {exc}",
                param="response_format",
            ) from None
    else:
        raise OpenAIError(
            "response_format type must be 'text', 'json_object' or 'json_schema', "
            f"got {fmt.type!r}",
            param="response_format",
        )
    return {**(params or {}), **overrides}
