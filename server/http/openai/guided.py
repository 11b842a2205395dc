"""Structured outputs for a TensorRT-LLM-style model: its `guided_decoding_guide_type` and
`guided_decoding_guide` inputs (TensorRT-LLM's GuidedDecodingParams, as Triton's OpenAI
front end fills them for a named or "required" tool_choice), from the one constraint of
vLLM's StructuredOutputsParams that structured.py and tools.py build:

- `json` (a schema): "json_schema", the schema's JSON text;
- `json_object`: "json", no guide;
- `regex`: "regex", the pattern;
- `grammar`: "ebnf_grammar", the grammar;
- `choice`: "ebnf_grammar", vLLM's choice_as_grammar (`root ::= "a" | "b"`).

A JSON schema goes with xgrammar's strict default written into it (properties and
tuple items it does not declare are refused, backends/llm/strictschema.py), as vLLM's
default backend and the `llm` engine read it, whichever grammar backend the model uses.
A constraint these cannot carry (a structural tag, the JSON grammar's whitespace
options) is a 400 naming the field, never dropped; `disable_additional_properties` is
that default, nothing to carry."""

from __future__ import annotations

import json
from typing import Any

from ge_serve.backends.llm.strictschema import close

from .errors import OpenAIError, unsupported
from .structured import KEY

GUIDE_TYPE = "guided_decoding_guide_type"
GUIDE = "guided_decoding_guide"
_EBNF_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def guide(structured: str, model: str) -> tuple[str, str | None]:
    """The guide type and guide (None: none) of `structured`, the JSON text of vLLM's
    StructuredOutputsParams."""
    params: dict[str, Any] = json.loads(structured)
    for option in ("whitespace_pattern", "disable_any_whitespace"):
        if params.get(option):
            raise unsupported(
                KEY, f"'{option}' cannot reach the model '{model}' (TensorRT-LLM's guided decoding)"
            )
    given = [k for k, v in params.items() if v is not None and v is not False]
    kinds = [k for k in given if k in ("json", "json_object", "regex", "grammar", "choice")]
    if "structural_tag" in given:
        raise unsupported(
            KEY,
            f"A structural tag cannot reach the model '{model}' (TensorRT-LLM's guided decoding)",
        )
    if len(kinds) != 1:
        raise OpenAIError(
            "You can only use one kind of constraints for structured outputs "
            "('json', 'json_object', 'regex', 'grammar' or 'choice').",
            param=KEY,
        )
    kind = kinds[0]
    value = params[kind]
    if kind == "json":
        return "json_schema", _strict(value)
    if kind == "json_object":
        return "json", None
    if kind == "choice":
        if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
            raise OpenAIError("'choice' must be a list of strings", param=KEY)
        return "ebnf_grammar", "root ::= " + " | ".join(f'"{_escaped(c)}"' for c in value)
    if not isinstance(value, str):
        raise OpenAIError(f"'{kind}' must be a string", param=KEY)
    return ("regex" if kind == "regex" else "ebnf_grammar"), value


def _strict(schema: Any) -> str:
    """The schema's JSON text, closed (strictschema.py); a text that is no JSON goes as
    it is, for the model to refuse."""
    if isinstance(schema, str):
        text = schema
        try:
            schema = json.loads(text)
        except (ValueError, RecursionError):
            return text
    close(schema)
    try:
        return json.dumps(schema)
    except RecursionError:  # nested past Python's limit: json.dumps read it once already
        raise OpenAIError("the schema is nested too deeply", param=KEY) from None


def _escaped(text: str) -> str:
    """vLLM's EBNF string escapes (choice_as_grammar)."""
    return "".join(
        _EBNF_ESCAPES.get(ch) or (f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch)
        for ch in text
    )
