"""The parts of a structural tag's grammar (structformat.py): the text of its literals,
the `json_schema`, `grammar` and `regex` formats as llguidance reads them, what a format
begins with and where it stands, the checks of a format's fields (in xgrammar's words
where it has them) and their limits, and the vocabulary a tag is read against."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .strictschema import close

INT32 = 2_147_483_647
EMPTY = '""'

# The most formats one tag may hold.
MAX_FORMATS = 10_000
# `repeat`'s largest bound: llguidance expands a count into rules.
MAX_REPEAT = 10_000
# The most strings one free text stops at (excludes, triggers, patterns, ends), and tags
# of one list: llguidance's lexer gives out mid-answer past a few hundred short strings,
# its parser's rows past 2,000 tags.
MAX_STOPS = 16
MAX_TRIGGERS = MAX_STOPS
MAX_TAGS = 1_000
# A free text's `max_chars` times the characters it must avoid (plus one): llguidance
# builds the bounded lexeme state by state, and stops at its limit past about 1,000.
MAX_CHAR_STATES = 900


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """The model's tokenizer, as a structural tag reads it. `token_id`: a token by the
    text it stands for, as xgrammar finds one; `added`: the added tokens by their text
    (a string the grammar forces is tokenized without them, so they are offered beside
    it); `specials`: those llguidance keeps apart from text; `never`: tokens no free
    region takes (the EOS, ids that name none); ids from `named` to `size` name none
    either."""

    token_id: Callable[[str], int | None]
    added: Mapping[str, int]
    specials: Mapping[str, int]
    never: tuple[int, ...]
    named: int
    size: int


def json_text(fmt: dict[str, Any], where: str, defaults: dict[str, Any]) -> str:
    """A `json_schema` format's `%json` text, with the request's whitespace options."""
    schema = fmt.get("json_schema")
    style = fmt.get("style", "json")
    if style != "json":
        raise ValueError(f'{where}.style {style!r} is not served (only "json")')
    if fmt.get("any_order"):
        raise ValueError(f"{where}.any_order is not served")
    if fmt.get("excludes"):
        raise ValueError(f"{where}.excludes is not served")
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise ValueError(f"{where}.json_schema must be a JSON schema")
    options = dict(defaults)
    spaces = count(fmt, "max_whitespace_cnt", where, INT32)
    if spaces is not None and options.get("whitespace_flexible", True):
        options["whitespace_pattern"] = f"[\\x20\\x0A\\x0D\\x09]{{0,{spaces}}}"
    schema = json.loads(json.dumps(schema))  # a copy: `close` changes it in place
    close(schema)  # read strictly, as xgrammar's structural tags read it
    return "%json " + json.dumps({**schema, "x-guidance": options})


def grammar_lark(fmt: dict[str, Any], where: str, convert: bool = True) -> str:
    """A `grammar` format's EBNF (xgrammar's GBNF: `root ::= ...`) as Lark text; without
    `convert`, checked only (the conversion is Python, and a large grammar's is slow: the
    engine's, off the event loop). Lark is refused, as xgrammar refuses it: llguidance's
    Lark could name the grammars around it."""
    from llguidance.gbnf_to_lark import gbnf_to_lark, is_lark_syntax

    text = string(fmt, "grammar", where)
    if not text.strip():
        raise ValueError(f"{where}.grammar must be a non-empty string")
    if is_lark_syntax(text) or "::=" not in text:
        raise ValueError(f"{where}.grammar must be an EBNF grammar (root ::= ...)")
    if not convert:
        return ""
    try:
        lark = gbnf_to_lark(text)
    except Exception as exc:  # the converter's own errors, of many kinds
        raise ValueError(f"{where}.grammar: {exc}") from None
    return lark


def regex_lark(fmt: dict[str, Any], where: str, convert: bool = True) -> str:
    """A `regex` format's pattern as Lark text (without `convert`, checked only)."""
    import llguidance

    pattern = string(fmt, "pattern", where)
    if not pattern or "\x00" in pattern:
        raise ValueError(f"{where}.pattern must be a non-empty string without NUL")
    if not convert:
        return ""
    # llguidance's own regex grammar: its Lark text escapes the pattern as Lark reads it.
    (grammar,) = json.loads(llguidance.LLMatcher.grammar_from_regex(pattern))["grammars"]
    return str(grammar["lark_grammar"])


def literal(text: str) -> str:
    return json.dumps(text) if text else ""


def join(*parts: str) -> str:
    return " ".join(p for p in parts if p) or EMPTY


def string(fmt: dict[str, Any], key: str, where: str) -> str:
    value = fmt.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}.{key} must be a string")
    return value


def flag(fmt: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = fmt.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{where}.{key} must be true or false")
    return value


def count(
    fmt: dict[str, Any], key: str, where: str, most: int, required: bool = False
) -> int | None:
    value = fmt.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise ValueError(f"{where}.{key} must be an integer from 0 to {most}")
    return value


def starts_with_token(fmt: Any) -> bool:
    """Whether `fmt` begins with a token of its own (free text before it stops there)."""
    if not isinstance(fmt, dict):
        return False
    kind = fmt.get("type")
    if kind == "token":  # (exclude_token's token may be text)
        return True
    if kind == "tag":
        begin = fmt.get("begin")
        return isinstance(begin, dict) and begin.get("type") == "token"
    if kind == "sequence":
        elements = fmt.get("elements")
        return isinstance(elements, list) and bool(elements) and starts_with_token(elements[0])
    if kind == "or":
        elements = fmt.get("elements")
        return (
            isinstance(elements, list) and bool(elements) and all(map(starts_with_token, elements))
        )
    return False


def glue(fmt: Any) -> str | None:
    """The string `fmt` surely begins with, where free text before it may take that string
    as its end: a constant's, or a tag's string begin."""
    if not isinstance(fmt, dict):
        return None
    value = fmt.get("value") if fmt.get("type") == "const_string" else None
    if fmt.get("type") == "tag":
        value = fmt.get("begin")
    return value if isinstance(value, str) and value else None


def formats_in(fmt: Any, most: int) -> int:
    """How many formats `fmt` holds, counted up to one past `most`."""
    total, pending = 0, [fmt]
    while pending and total <= most:
        node = pending.pop()
        if not isinstance(node, dict):
            continue
        total += 1
        for key in ("elements", "tags"):
            if isinstance(node.get(key), list):
                pending.extend(node[key])
        pending.append(node.get("content"))
        rules = node.get("rules")
        if isinstance(rules, list):
            pending.extend(pair[1] for pair in rules if isinstance(pair, list) and len(pair) == 2)
    return total


def finder(texts: Mapping[str, int]) -> re.Pattern[str] | None:
    """A pattern that finds any of `texts` (the longest first), or None."""
    ordered = sorted(texts, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, ordered))) if ordered else None


@dataclass(frozen=True, slots=True)
class At:
    """Where a format stands. `ends`: the enclosing tag's end strings, which the format is
    the last of and ends with; `last`: no text follows it (free text may run on); `stop`,
    `stop_tokens`: the nearest enclosing tag's end, which its free text never holds."""

    ends: tuple[str, ...] = ()
    last: bool = False
    stop: tuple[str, ...] = ()
    stop_tokens: tuple[int, ...] = ()


INSIDE = At()  # what delimits itself: one of a list of tags, a repeated format


def is_free(fmt: Any) -> bool:
    return isinstance(fmt, dict) and fmt.get("type") in ("any_text", "triggered_tags", "dispatch")


def any_token_but(tokens: tuple[int, ...], vocabulary: Vocabulary | None) -> str:
    """Any token but `tokens`, the EOS and the ids that name none."""
    barred = sorted({*tokens, *(vocabulary.never if vocabulary else ())})
    ranges = [str(t) for t in barred]
    if vocabulary is not None and vocabulary.named < vocabulary.size:
        ranges.append(f"{vocabulary.named}-{vocabulary.size - 1}")
    return f"<[^{','.join(ranges)}]>" if ranges else "<[*]>"


def bounded_ends(ends: list[str], where: str, specials: re.Pattern[str] | None) -> None:
    """A bounded free text's end is forced once its characters run out, and a forced
    string holding a special token within other text is a dead end: refused."""
    for end in ends:
        found = specials.search(end) if specials else None
        if found is not None and found.group() != end:
            raise ValueError(
                f"{where}.max_chars: the end {end!r} holds the special token "
                f"{found.group()!r} within other text, which a bounded text cannot end with"
            )
