"""xgrammar's structural tag, `{"type": "structural_tag", "format": {...}}`, the form vLLM
reads through xgrammar (its default backend), compiled to an llguidance grammar: a tree of
formats, each a chunk of the output. Served: `const_string`, `json_schema` (JSON style),
`grammar` (EBNF or Lark), `regex`, `any_text`, `sequence`, `or`, `optional`, `plus`,
`star`, `repeat`, `tag`, `triggered_tags`, `tags_with_separator`, `dispatch`, and the
token-level `token`, `exclude_token`, `any_tokens`, `token_triggered_tags`,
`token_dispatch`, with xgrammar's meanings (its free text stops at the nearest enclosing
tag's end, as its compiler's end detection does).

llguidance's lexer is greedy where xgrammar's automaton is not: free text followed by a
string must know where it stops. Free text therefore ends its tag (the tag's end is then
part of the same lexeme, which stops at the first end) or the whole output, or names the
strings it excludes; elsewhere the format is refused, where xgrammar would serve it.
Refused as well, each by name: JSON styles other than "json" (Qwen's and others' XML),
`any_order`, a JSON format's `excludes`, and `any_text.max_tokens` (llguidance ends a
lexeme at its token budget without its end).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .strictschema import MAX_SCHEMA_DEPTH, deeper_than
from .structparts import (
    EMPTY,
    INT32,
    alternatives,
    count,
    flag,
    grammar_lark,
    join,
    json_text,
    literal,
    not_tokens,
    regex_lark,
    starts_with_token,
    string,
)

# The most formats one tag may hold (each is a rule or two to compile).
MAX_FORMATS = 10_000
# `repeat`'s largest bound: llguidance expands a count into rules.
MAX_REPEAT = 10_000
_ALL = "ALL"  # the terminal every free-text terminal is cut from

TokenId = Callable[[str], int | None]


@dataclass(frozen=True, slots=True)
class _At:
    """Where a format stands. `ends`: the enclosing tag's end strings, which the format is
    the last of and ends with; `last`: no text follows it (free text may run on); `stop`,
    `stop_tokens`: the nearest enclosing tag's end, which its free text never holds."""

    ends: tuple[str, ...] = ()
    last: bool = False
    stop: tuple[str, ...] = ()
    stop_tokens: tuple[int, ...] = ()


_INSIDE = _At()  # what delimits itself: one of a list of tags, a repeated format


class _Compiler:
    def __init__(self, defaults: dict[str, Any], token_id: TokenId | None) -> None:
        self._defaults = defaults
        self._token_id = token_id  # None: checking only, token strings taken as they are
        self._building = token_id is not None
        self._lines = ["%llguidance {}", f"{_ALL}: /(?s:.*)/"]
        self._side: list[dict[str, Any]] = []
        self._count = 0

    def grammar(self, fmt: Any) -> str:
        root = self._format(fmt, "format", at=_At(last=True))
        main = "\n".join(["start: " + root, *self._lines]) + "\n"
        if not self._side:
            return main
        return json.dumps(
            {"grammars": [{"name": "structural_tag", "lark_grammar": main}, *self._side]}
        )

    # --- names ---------------------------------------------------------------------------

    def _rule(self, body: str) -> str:
        self._count += 1
        if self._count > MAX_FORMATS:
            raise ValueError(f"structural_tag: more than {MAX_FORMATS} formats")
        name = f"r{self._count}"
        self._lines.append(f"{name}: {body}")
        return name

    def _terminal(self, body: str) -> str:
        self._count += 1
        name = f"T{self._count}"
        self._lines.append(f"{name}: {body}")
        return name

    # --- formats -------------------------------------------------------------------------

    def _format(
        self,
        fmt: Any,
        where: str,
        at: _At,
    ) -> str:
        """A rule for `fmt`, standing `at`."""
        if not isinstance(fmt, dict):
            raise ValueError(f"{where} must be an object")
        kind = fmt.get("type")
        after = alternatives(at.ends)
        if kind == "const_string":
            return self._rule(join(literal(string(fmt, "value", where)), after))
        if kind == "json_schema":
            return self._rule(join(json_text(fmt, where, self._defaults), after))
        if kind == "grammar":
            return self._rule(
                join(self._side_grammar(grammar_lark(fmt, where, self._building)), after)
            )
        if kind == "regex":
            return self._rule(
                join(self._side_grammar(regex_lark(fmt, where, self._building)), after)
            )
        if kind == "token":
            return self._rule(join(self._token(fmt.get("token"), f"{where}.token"), after))
        if kind == "exclude_token":
            excluded = self._tokens(fmt.get("exclude_tokens", []), f"{where}.exclude_tokens")
            return self._rule(join(not_tokens(excluded + at.stop_tokens), after))
        if kind == "any_tokens":
            excluded = self._tokens(fmt.get("exclude_tokens", []), f"{where}.exclude_tokens")
            most = count(fmt, "max_tokens", where, INT32)
            times = "*" if most is None else f"{{0,{most}}}"
            return self._rule(join(f"({not_tokens(excluded + at.stop_tokens)}){times}", after))
        if kind in ("sequence", "or"):
            return self._group(
                fmt,
                where,
                kind,
                at=at,
            )
        if kind in ("optional", "plus", "star", "repeat"):
            return self._repeat(
                fmt,
                where,
                kind,
                at=at,
            )
        if kind == "tag":
            return self._tag(
                fmt,
                where,
                at=at,
            )
        if kind == "tags_with_separator":
            return self._separated(fmt, where, at=at)
        if kind in ("any_text", "triggered_tags", "dispatch"):
            return self._free(fmt, where, kind, at=at)
        if kind in ("token_triggered_tags", "token_dispatch"):
            return self._token_dispatch(fmt, where, kind, at=at)
        if kind == "qwen_xml_parameter":
            raise ValueError(f"{where}: qwen_xml_parameter (Qwen's XML arguments) is not served")
        raise ValueError(f"{where}: unknown format type {kind!r}")

    def _group(self, fmt: dict[str, Any], where: str, kind: str, at: _At) -> str:
        elements = fmt.get("elements")
        if not isinstance(elements, list) or not elements:
            raise ValueError(f"{where}.elements must be a non-empty list of formats")
        if kind == "or":
            parts = [
                self._format(e, f"{where}.elements[{i}]", at=at) for i, e in enumerate(elements)
            ]
            return self._rule(" | ".join(parts))
        parts = []
        for i, element in enumerate(elements):
            if i == len(elements) - 1:
                parts.append(self._format(element, f"{where}.elements[{i}]", at=at))
            else:
                following = starts_with_token(elements[i + 1])
                parts.append(
                    self._format(
                        element,
                        f"{where}.elements[{i}]",
                        at=_At(last=following, stop=at.stop, stop_tokens=at.stop_tokens),
                    )
                )
        return self._rule(" ".join(parts))

    def _repeat(self, fmt: dict[str, Any], where: str, kind: str, at: _At) -> str:
        if kind == "optional":
            inner = self._format(fmt.get("content"), f"{where}.content", at=at)
            return self._rule(f"{inner} | {alternatives(at.ends) or EMPTY}")
        inner = self._format(
            fmt.get("content"),
            f"{where}.content",
            at=_At(stop=at.stop, stop_tokens=at.stop_tokens),
        )
        if kind == "repeat":
            least = count(fmt, "min", where, MAX_REPEAT, required=True)
            most = fmt.get("max")
            if most == -1:
                times = f"{{{least},}}"
            else:
                most = count(fmt, "max", where, MAX_REPEAT, required=True)
                if least is None or most is None or most < least:
                    raise ValueError(f"{where}: repeat's min must be <= max")
                times = f"{{{least},{most}}}"
        else:
            times = "+" if kind == "plus" else "*"
        return self._rule(join(f"({inner}){times}", alternatives(at.ends)))

    def _tag(
        self,
        fmt: dict[str, Any],
        where: str,
        at: _At,
        skip: int = 0,
    ) -> str:
        """begin, content, end; `skip`: the begin's first characters, which a trigger
        before it has written."""
        begin = fmt.get("begin")
        if isinstance(begin, str):
            opening = literal(begin[skip:])
        elif isinstance(begin, dict) and begin.get("type") == "token":
            opening = self._token(begin.get("token"), f"{where}.begin.token")
        else:
            raise ValueError(f"{where}.begin must be a string or a token format")
        end = fmt.get("end")
        content = fmt.get("content")
        if isinstance(end, dict) and end.get("type") == "token":
            closing = self._token(end.get("token"), f"{where}.end.token")
            body = self._format(
                content,
                f"{where}.content",
                at=_At(last=True, stop_tokens=(int(closing[2:-2]),)),
            )
            return self._rule(join(f"{opening} {body} {closing}", alternatives(at.ends)))
        own = (end,) if isinstance(end, str) else end
        if not isinstance(own, list | tuple) or not own or not all(isinstance(e, str) for e in own):
            raise ValueError(f"{where}.end must be a string, a list of strings or a token format")
        if not any(own):  # no end: the content ends where the tag does
            body = self._format(
                content,
                f"{where}.content",
                at=at,
            )
            return self._rule(join(opening, body))
        body = self._format(
            content,
            f"{where}.content",
            at=_At(tuple(own), True, tuple(e for e in own if e)),
        )
        return self._rule(join(join(opening, body), alternatives(at.ends)))

    def _tags(self, fmt: dict[str, Any], where: str) -> list[dict[str, Any]]:
        tags = fmt.get("tags")
        if not isinstance(tags, list) or not tags:
            raise ValueError(f"{where}.tags must be a non-empty list of tag formats")
        for i, tag in enumerate(tags):
            if not isinstance(tag, dict) or tag.get("type", "tag") != "tag":
                raise ValueError(f"{where}.tags[{i}] must be a tag format")
        return tags

    def _separated(self, fmt: dict[str, Any], where: str, at: _At) -> str:
        tags = self._tags(fmt, where)
        separator = fmt.get("separator")
        if not isinstance(separator, str):
            raise ValueError(f"{where}.separator must be a string")
        one = self._rule(
            " | ".join(self._tag(t, f"{where}.tags[{i}]", at=_INSIDE) for i, t in enumerate(tags))
        )
        if flag(fmt, "stop_after_first", where):
            body = one
        else:
            body = f"{one} ({join(literal(separator), one)})*"
        if not flag(fmt, "at_least_one", where):
            body = f"({body}) | {EMPTY}"
        return self._rule(join(f"({body})", alternatives(at.ends)))

    def _free(
        self,
        fmt: dict[str, Any],
        where: str,
        kind: str,
        at: _At,
    ) -> str:
        """Free text, which `triggers` (or `rules`' patterns) leave for what they begin:
        any_text, triggered_tags and dispatch."""
        excludes = fmt.get("excludes", [])
        if not isinstance(excludes, list) or not all(isinstance(e, str) and e for e in excludes):
            raise ValueError(f"{where}.excludes must be a list of non-empty strings")
        if not at.last and not excludes:
            raise ValueError(
                f"{where}: free text ({kind}) must end its tag or the output, or name "
                "`excludes` (where it stops)"
            )
        if "" in at.ends:
            raise ValueError(f"{where}: free text ({kind}) needs its tag's end strings non-empty")
        groups: list[tuple[str, str]] = []  # (trigger, what follows it)
        first: str | None = None
        loop = True
        if kind == "triggered_tags":
            triggers = fmt.get("triggers")
            if (
                not isinstance(triggers, list)
                or not triggers
                or not all(isinstance(t, str) and t for t in triggers)
            ):
                raise ValueError(f"{where}.triggers must be a non-empty list of non-empty strings")
            tags = self._tags(fmt, where)
            chosen: dict[str, list[str]] = {t: [] for t in triggers}
            whole = []
            for i, tag in enumerate(tags):
                begin = tag.get("begin")
                if not isinstance(begin, str):
                    raise ValueError(
                        "Tags in triggered_tags must have a string begin, not a token format"
                    )
                matches = [t for t in triggers if begin.startswith(t)]
                if not matches:
                    raise ValueError(
                        "One tag does not match any trigger in a triggered tags format"
                    )
                if len(matches) > 1:
                    raise ValueError("One tag matches multiple triggers in a triggered tags format")
                chosen[matches[0]].append(
                    self._tag(tag, f"{where}.tags[{i}]", skip=len(matches[0]), at=_INSIDE)
                )
                whole.append(self._tag(tag, f"{where}.tags[{i}]", at=_INSIDE))
            groups = [(t, " | ".join(rules)) for t, rules in chosen.items() if rules]
            loop = not flag(fmt, "stop_after_first", where)
            if flag(fmt, "at_least_one", where):
                first = self._rule(" | ".join(whole))
                if not loop:  # exactly one tag
                    return self._rule(join(first, alternatives(at.ends)))
        elif kind == "dispatch":
            rules = fmt.get("rules")
            if not isinstance(rules, list) or not rules:
                raise ValueError(
                    f"{where}.rules must be a non-empty list of [pattern, format] pairs"
                )
            for i, pair in enumerate(rules):
                if (
                    not isinstance(pair, list | tuple)
                    or len(pair) != 2
                    or not isinstance(pair[0], str)
                    or not pair[0]
                ):
                    raise ValueError(f"{where}.rules[{i}] must be a [pattern, format] pair")
                groups.append(
                    (
                        pair[0],
                        self._format(pair[1], f"{where}.rules[{i}][1]", at=_INSIDE),
                    )
                )
            loop = flag(fmt, "loop", where, default=True)
        elif fmt.get("max_tokens") is not None:
            raise ValueError(f"{where}.max_tokens is not served (max_chars is)")
        most = count(fmt, "max_chars", where, INT32) if kind == "any_text" else None
        barred = [*excludes, *at.stop, *(t for t, _ in groups)]
        text = self._terminal(
            (_ALL if most is None else f"/(?s:.){{0,{most}}}/")
            + (f" & ~({_ALL} ({' | '.join(literal(b) for b in barred)}) {_ALL})" if barred else "")
        )
        tail = self._terminal(join(text, alternatives(at.ends))) if at.ends else text
        if groups:
            chosen_rule = self._rule(
                " | ".join(
                    f"{self._terminal(join(text, literal(t)))} ({after})" for t, after in groups
                )
            )
            if loop:
                body = f"{chosen_rule}* {tail}"
            else:
                body = f"{tail} | {join(chosen_rule, alternatives(at.ends))}"
        else:
            body = tail
        return self._rule(body if first is None else f"{first} ({body})")

    def _token_dispatch(
        self,
        fmt: dict[str, Any],
        where: str,
        kind: str,
        at: _At,
    ) -> str:
        excluded = self._tokens(fmt.get("exclude_tokens", []), f"{where}.exclude_tokens")
        groups: list[tuple[int, str]] = []
        first: str | None = None
        if kind == "token_triggered_tags":
            triggers = self._tokens(fmt.get("trigger_tokens"), f"{where}.trigger_tokens")
            if not triggers:
                raise ValueError(f"{where}.trigger_tokens must be a non-empty list")
            tags = self._tags(fmt, where)
            chosen: dict[int, list[str]] = {t: [] for t in triggers}
            whole = []
            for i, tag in enumerate(tags):
                begin = tag.get("begin")
                if not (isinstance(begin, dict) and begin.get("type") == "token"):
                    raise ValueError(f"{where}.tags[{i}].begin must be a token format")
                token = int(self._token(begin.get("token"), f"{where}.tags[{i}].begin.token")[2:-2])
                if token not in chosen:
                    raise ValueError(
                        f"{where}.tags[{i}]'s begin token is not one of trigger_tokens"
                    )
                whole.append(self._tag(tag, f"{where}.tags[{i}]", at=_INSIDE))
                chosen[token].append(
                    self._tag({**tag, "begin": ""}, f"{where}.tags[{i}]", at=_INSIDE)
                )
            groups = [(t, " | ".join(rules)) for t, rules in chosen.items() if rules]
            loop = not flag(fmt, "stop_after_first", where)
            if flag(fmt, "at_least_one", where):
                first = self._rule(" | ".join(whole))
                if not loop:
                    return self._rule(join(first, alternatives(at.ends)))
        else:
            rules = fmt.get("rules")
            if not isinstance(rules, list) or not rules:
                raise ValueError(f"{where}.rules must be a non-empty list of [token, format] pairs")
            for i, pair in enumerate(rules):
                if not isinstance(pair, list | tuple) or len(pair) != 2:
                    raise ValueError(f"{where}.rules[{i}] must be a [token, format] pair")
                token = int(self._token(pair[0], f"{where}.rules[{i}][0]")[2:-2])
                groups.append(
                    (
                        token,
                        self._format(pair[1], f"{where}.rules[{i}][1]", at=_INSIDE),
                    )
                )
            loop = flag(fmt, "loop", where, default=True)
        free = f"({not_tokens(excluded + at.stop_tokens + tuple(t for t, _ in groups))})*"
        chosen_rule = self._rule(" | ".join(f"<[{t}]> ({after})" for t, after in groups))
        body = f"({free} {chosen_rule})* {free}" if loop else f"{free} {chosen_rule}?"
        if first is not None:
            body = f"{first} {body}"
        return self._rule(join(f"({body})", alternatives(at.ends)))

    # --- leaves --------------------------------------------------------------------------

    def _side_grammar(self, lark: str) -> str:
        name = f"g{len(self._side) + 1}"
        self._side.append({"name": name, "lark_grammar": lark})
        return "@" + name

    def _token(self, token: Any, where: str) -> str:
        if isinstance(token, bool) or not isinstance(token, int | str):
            raise ValueError(f"{where} must be a token id or a token string")
        if isinstance(token, int):
            if not 0 <= token <= INT32:
                raise ValueError(f"{where}: Token ID must be non-negative")
            return f"<[{token}]>"
        if not token:
            raise ValueError(f"{where}: Token string must be non-empty")
        if self._token_id is None:
            return "<[0]>"
        found = self._token_id(token)
        if found is None:
            raise ValueError(f'Token string "{token}" not found in vocabulary')
        return f"<[{found}]>"

    def _tokens(self, tokens: Any, where: str) -> tuple[int, ...]:
        if not isinstance(tokens, list):
            raise ValueError(f"{where} must be a list of token ids or strings")
        return tuple(int(self._token(t, f"{where}[{i}]")[2:-2]) for i, t in enumerate(tokens))


def format_grammar(spec: Any, defaults: dict[str, Any], token_id: TokenId | None) -> str:
    """The llguidance grammar of a structural tag's `format` (the Lark text, or the JSON of
    it with the side grammars its `grammar` and `regex` formats compile to); ValueError
    says what is wrong. `defaults`: the request's JSON whitespace options; `token_id`:
    the model's token of a string (None: checked only)."""
    if not isinstance(spec, dict):
        raise ValueError("structural_tag must be an object")
    if spec.get("type", "structural_tag") != "structural_tag":
        raise ValueError('Structural tag\'s type must be a string "structural_tag"')
    if deeper_than(spec, MAX_SCHEMA_DEPTH):
        raise ValueError(f"structural_tag is nested more than {MAX_SCHEMA_DEPTH} levels deep")
    return _Compiler(defaults, token_id).grammar(spec.get("format"))
