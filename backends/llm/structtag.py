"""vLLM's structural tag (`structured_outputs.structural_tag`, and `response_format`
type `structural_tag`), in the legacy form its guidance backend reads: free text, in
which each of `triggers` begins one of `structures` ({begin, schema, end}: the begin
text, then a JSON value of the schema, then the end text), as often as the model writes
them. A tool-calling model's `<function=name>{...}</function>` is the common use. The
newer {"format": ...} form, xgrammar's, is structformat.py's.
"""

from __future__ import annotations

import json
from typing import Any

from .strictschema import MAX_SCHEMA_DEPTH, deeper_than
from .structformat import format_grammar


def structural_tag(spec: Any) -> str:
    """The tag checked, as the JSON text structured.py compiles ({"triggers",
    "structures"}, or {"type", "format"}); ValueError says what is wrong, in vLLM's or
    xgrammar's words where they have them."""
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except (ValueError, RecursionError):
            raise ValueError("structured_outputs.structural_tag is not valid JSON") from None
    if not isinstance(spec, dict):
        raise ValueError("structured_outputs.structural_tag must be an object")
    if spec.get("format") is not None:
        format_grammar(spec, {}, None)  # its token strings are the model's, read later
        return json.dumps({"type": "structural_tag", "format": spec["format"]})
    triggers, structures = spec.get("triggers"), spec.get("structures")
    if not isinstance(triggers, list) or not all(isinstance(t, str) and t for t in triggers):
        raise ValueError("structural_tag.triggers must be a list of non-empty strings")
    if not isinstance(structures, list) or not structures:
        raise ValueError("No structural tags found in the grammar spec.")
    found = []
    for index, item in enumerate(structures):
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) for k in ("begin", "end")
        ):
            raise ValueError(f"structural_tag.structures[{index}] needs 'begin' and 'end' strings")
        begin, schema = item["begin"], item.get("schema")
        if schema is None or schema is True:
            schema = {}  # any JSON value
        if not isinstance(schema, dict) or deeper_than(schema, MAX_SCHEMA_DEPTH):
            # `false` too: a schema no value meets, so the tag could never end.
            raise ValueError(f"structural_tag.structures[{index}].schema must be a JSON schema")
        if not any(begin.startswith(t) for t in triggers):
            raise ValueError(f"Trigger {begin} not found in triggers {triggers}")
        found.append({"begin": begin, "schema": schema, "end": item["end"]})
    return json.dumps({"triggers": triggers, "structures": found})
