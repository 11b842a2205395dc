"""A JSON schema read as vLLM's default structured-outputs backend reads it: vLLM 0.34's
"auto" gives a JSON schema to xgrammar, whose `strict_mode` (on by default, as vLLM
compiles) allows no property and no array item the schema does not declare. llguidance,
which compiles ge-serve's grammars, reads a schema by the JSON-schema standard (others
allowed), so a small model goes on writing keys it was never asked for until max_tokens
cuts the JSON short. `close` writes xgrammar's default into the schema itself:

- an object schema that declares `properties` or `patternProperties` and says neither
  `additionalProperties` nor `unevaluatedProperties` gets `additionalProperties: false`,
  and loses the `required` names it does not declare (never satisfiable then);
- an array schema with `prefixItems` and none of `items`, `additionalItems`,
  `unevaluatedItems` gets `items: false` (the tuple holds what it lists).

A schema that says `additionalProperties: true` (or gives a schema for the others) keeps
its word. An object with no declared properties (`{"type": "object"}`, json_object mode)
stays any object, as in xgrammar. Parts of one object are not closed against each other:
the branches of an `allOf` of several (one alone is the object itself, and is closed),
`if` / `then` / `else`, `not`, `dependentSchemas`, and an object that declares
properties beside an `anyOf` / `oneOf` together with that one's branches (closing each
would allow only `{}`). The per-request option
`disable_additional_properties` changes nothing: vLLM 0.34 reads only its server-wide
one, for its guidance backend, which "auto" does not pick for these schemas.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# The deepest a JSON schema may nest (objects and arrays).
MAX_SCHEMA_DEPTH = 128

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


def deeper_than(value: Any, limit: int) -> bool:
    """Whether a JSON value nests objects and arrays more than `limit` deep (walked level
    by level, without recursion)."""
    level: list[Any] = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
    return False


def close(schema: Any) -> None:
    """Write xgrammar's strict default into `schema` (a parsed JSON schema, changed in
    place). Walked without recursion: a schema may nest as deep as its JSON parser let
    it. A `$defs` / `definitions` entry of the root is closed only where no `$ref` to it
    stands where closing is wrong (a part of one object), as its text written inline
    there would not be."""
    nodes = list(_nodes(schema))
    parts = {node["$ref"] for node, closable in nodes if not closable and _ref(node)}
    kept = {id(found) for found in _root_defs(schema, parts)}
    for node, closable in nodes:
        if not closable or id(node) in kept or any(key in node for key in _COMPOSED):
            continue
        declares = isinstance(node.get("properties"), dict) or isinstance(
            node.get("patternProperties"), dict
        )
        if declares and "additionalProperties" not in node and "unevaluatedProperties" not in node:
            node["additionalProperties"] = False
            _drop_undeclared_required(node)
        if isinstance(node.get("prefixItems"), list) and not any(k in node for k in _OTHER_ITEMS):
            node["items"] = False


def _nodes(schema: Any) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every schema object in `schema`, and whether closing it is right where it stands
    (not a part of one object); none depends on its parent's answer."""
    stack: list[tuple[Any, bool]] = [(schema, True)]
    while stack:
        node, closable = stack.pop()
        if not isinstance(node, dict):
            continue
        yield node, closable
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
            # One branch is the object itself (Pydantic's `allOf: [$ref]` wrapping):
            # closed as xgrammar closes it; several are parts of one object.
            alone = len(node["allOf"]) == 1 and not declares
            stack.extend((branch, alone) for branch in node["allOf"])
        for key in _BRANCHES:
            if isinstance(node.get(key), list):
                stack.extend((branch, not declares) for branch in node[key])


def _ref(node: dict[str, Any]) -> bool:
    return isinstance(node.get("$ref"), str)


def _root_defs(schema: Any, refs: set[str]) -> Iterator[Any]:
    """The root's `$defs` / `definitions` entries that `refs` (local pointers) name."""
    if not isinstance(schema, dict):
        return
    for key in ("$defs", "definitions"):
        found = schema.get(key)
        if isinstance(found, dict):
            yield from (sub for name, sub in found.items() if f"#/{key}/{name}" in refs)


def _drop_undeclared_required(node: dict[str, Any]) -> None:
    """A closed object's `required` names that it does not declare could never be given:
    xgrammar compiles such a schema and answers without them, where llguidance would
    find the schema unsatisfiable and refuse the request. Where the object has
    `patternProperties`, its names are left to the grammar compiler: matching the
    client's patterns here would run its regular expressions (a nested repetition can
    take hours) on the server's thread."""
    required = node.get("required")
    if not isinstance(required, list) or "patternProperties" in node:
        return
    properties = node.get("properties")
    names = properties if isinstance(properties, dict) else {}
    kept = [name for name in required if not isinstance(name, str) or name in names]
    if len(kept) != len(required):
        node["required"] = kept
