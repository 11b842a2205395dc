"""A JSON schema read as vLLM's default structured-outputs backend reads it: vLLM 0.34's
"auto" gives a JSON schema to xgrammar, whose `strict_mode` (on by default, as vLLM
compiles) allows no property and no array item the schema does not declare. llguidance,
which compiles ge-serve's grammars, reads a schema by the JSON-schema standard (others
allowed), so a small model goes on writing keys it was never asked for until max_tokens
cuts the JSON short. `close` writes xgrammar's default into the schema itself:

- an object schema that declares `properties` or `patternProperties` and says neither
  `additionalProperties` nor `unevaluatedProperties` gets `additionalProperties: false`;
- an array schema with `prefixItems` and none of `items`, `additionalItems`,
  `unevaluatedItems` gets `items: false` (the tuple holds what it lists).

A schema that says `additionalProperties: true` (or gives a schema for the others) keeps
its word. An object with no declared properties (`{"type": "object"}`, json_object mode)
stays any object, as in xgrammar. Parts of one object are not closed against each other:
the branches of an `allOf` (and `if` / `then` / `else`, `not`, `dependentSchemas`), and an
object that declares properties beside an `anyOf` / `oneOf` together with that one's
branches (closing each would allow only `{}`). The per-request option
`disable_additional_properties` changes nothing: vLLM 0.34 reads only its server-wide
one, for its guidance backend, which "auto" does not pick for these schemas.
"""

from __future__ import annotations

from typing import Any

# Where a schema holds schemas of values of their own: by name, one directly, or a list
# of them (vLLM's lists, backend_guidance.py, less those below).
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMAS = (
    "additionalProperties", "unevaluatedProperties", "propertyNames", "contains",
    "additionalItems", "unevaluatedItems", "contentSchema", "items", "prefixItems",
)  # fmt: skip
# Schemas that test or add to the object they stand in (closing one would turn a test of
# one key into a test of all, or forbid the object's own keys): walked for the values
# they describe, never closed themselves.
_SAME_VALUE = ("not", "if", "then", "else")
_SAME_VALUE_MAPS = ("dependentSchemas", "dependencies")
_BRANCHES = ("anyOf", "oneOf")
_COMPOSED = ("allOf", "anyOf", "oneOf")
_OTHER_ITEMS = ("items", "additionalItems", "unevaluatedItems")


def close(schema: Any) -> None:
    """Write xgrammar's strict default into `schema` (a parsed JSON schema, changed in
    place). Walked without recursion: a schema may nest as deep as its JSON parser let
    it."""
    stack: list[tuple[Any, bool]] = [(schema, True)]
    while stack:
        node, closable = stack.pop()
        if not isinstance(node, dict):
            continue
        declares = isinstance(node.get("properties"), dict) or isinstance(
            node.get("patternProperties"), dict
        )
        for key in _SCHEMA_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend((sub, True) for sub in node[key].values())
        for key in _SUBSCHEMAS:
            sub = node.get(key)
            if isinstance(sub, list):
                stack.extend((item, True) for item in sub)
            else:
                stack.append((sub, True))
        for key in _SAME_VALUE:
            stack.append((node.get(key), False))
        for key in _SAME_VALUE_MAPS:
            if isinstance(node.get(key), dict):
                stack.extend((sub, False) for sub in node[key].values())
        if isinstance(node.get("allOf"), list):
            stack.extend((branch, False) for branch in node["allOf"])
        for key in _BRANCHES:
            if isinstance(node.get(key), list):
                stack.extend((branch, not declares) for branch in node[key])
        if not closable or any(key in node for key in _COMPOSED):
            continue
        if declares and "additionalProperties" not in node and "unevaluatedProperties" not in node:
            node["additionalProperties"] = False
        if isinstance(node.get("prefixItems"), list) and not any(k in node for k in _OTHER_ITEMS):
            node["items"] = False
