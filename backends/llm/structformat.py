"""xgrammar's structural tag, `{"type": "structural_tag", "format": {...}}`, the form vLLM
reads through xgrammar (its default backend), compiled to an llguidance grammar, with
xgrammar's meanings: free text stops at the nearest enclosing tag's end, as its
compiler's end detection makes it. llguidance's lexer is greedy where xgrammar's
automaton is not, so free text must end its tag or the output, or come before a token
or a string, which it then takes as its end (one lexeme that stops at the first); other
shapes, and what llguidance cannot express, are refused by name (docs/generation.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from .strictschema import MAX_SCHEMA_DEPTH, deeper_than
from .structparts import (
    EMPTY,
    INSIDE,
    INT32,
    MAX_CHAR_STATES,
    MAX_FORMATS,
    MAX_REPEAT,
    MAX_STOPS,
    MAX_TAGS,
    MAX_TRIGGERS,
    At,
    Vocabulary,
    any_token_but,
    bounded_ends,
    count,
    finder,
    flag,
    formats_in,
    glue,
    grammar_lark,
    is_free,
    join,
    json_text,
    literal,
    regex_lark,
    starts_with_token,
    string,
)

_ALL = "ALL"  # the terminal every free-text terminal is cut from
Key = TypeVar("Key", str, int)  # a trigger: a string, or a token


class _Compiler:
    def __init__(self, defaults: dict[str, Any], vocabulary: Vocabulary | None) -> None:
        self._defaults = defaults
        self._vocabulary = vocabulary  # None: checking only, tokens taken as they are
        self._added = finder(vocabulary.added if vocabulary else {})
        self._specials = finder(vocabulary.specials if vocabulary else {})
        self._lines = ["%llguidance {}", f"{_ALL}: /(?s:.*)/"]
        self._side: list[dict[str, Any]] = []
        self._count = 0

    def grammar(self, fmt: Any) -> str:
        root = self._format(fmt, "format", At(last=True))
        main = "\n".join(["start: " + root, *self._lines]) + "\n"
        if not self._side:
            return main
        return json.dumps(
            {"grammars": [{"name": "structural_tag", "lark_grammar": main}, *self._side]}
        )

    # --- names and texts -----------------------------------------------------------------

    def _rule(self, body: str) -> str:
        self._count += 1
        name = f"r{self._count}"
        self._lines.append(f"{name}: {body}")
        return name

    def _terminal(self, body: str) -> str:
        self._count += 1
        name = f"T{self._count}"
        self._lines.append(f"{name}: {body}")
        return name

    def _special(self, text: str) -> int | None:
        """The special token `text` is, where a region may take it (never the EOS)."""
        vocabulary = self._vocabulary
        token = None if vocabulary is None else vocabulary.specials.get(text)
        return None if token is None or vocabulary is None or token in vocabulary.never else token

    def _text(self, text: str) -> str:
        """A string the grammar writes: its text, where an added token's text in it is
        that token or its text."""
        if self._added is None or self._vocabulary is None or not text:
            return literal(text)
        parts, start = [], 0
        for found in self._added.finditer(text):
            token = self._vocabulary.added[found.group()]
            parts.append(literal(text[start : found.start()]))
            if token in self._vocabulary.never:
                # llguidance would write the EOS for its text, ending the answer there.
                raise ValueError(f"{text!r} holds the EOS token's text, {found.group()!r}")
            else:
                parts.append(f"({literal(found.group())} | <[{token}]>)")
            start = found.end()
        parts.append(literal(text[start:]))
        return join(*parts)

    def _after(self, ends: tuple[str, ...]) -> str:
        if not ends:
            return ""
        return "(" + " | ".join(self._text(e) or EMPTY for e in ends) + ")"

    # --- formats -------------------------------------------------------------------------

    def _format(self, fmt: Any, where: str, at: At) -> str:
        """A rule for `fmt`, standing `at`."""
        if not isinstance(fmt, dict):
            raise ValueError(f"{where} must be an object")
        kind = fmt.get("type")
        after = self._after(at.ends)
        building = self._vocabulary is not None
        if kind == "const_string":
            return self._rule(join(self._text(string(fmt, "value", where)), after))
        if kind == "json_schema":
            return self._rule(join(json_text(fmt, where, self._defaults), after))
        if kind == "grammar":
            return self._rule(join(self._side_grammar(grammar_lark(fmt, where, building)), after))
        if kind == "regex":
            return self._rule(join(self._side_grammar(regex_lark(fmt, where, building)), after))
        if kind == "token":
            return self._rule(join(f"<[{self._token(fmt.get('token'), where + '.token')}]>", after))
        if kind in ("any_tokens", "token_triggered_tags", "token_dispatch") and (
            at.ends or not at.last
        ):
            raise ValueError(
                f"{where}: free tokens ({kind}) must end their tag (a token end) or the "
                "output, or come before a token"
            )
        if kind in ("exclude_token", "any_tokens"):
            key = f"{where}.exclude_tokens"
            excluded = self._tokens(fmt.get("exclude_tokens", []), key)
            region = any_token_but(excluded + at.stop_tokens, self._vocabulary)
            if kind == "any_tokens":
                most = count(fmt, "max_tokens", where, INT32)
                region = f"({region})" + ("*" if most is None else f"{{0,{most}}}")
            return self._rule(join(region, after))
        if kind in ("sequence", "or"):
            return self._group(fmt, where, kind, at)
        if kind in ("optional", "plus", "star", "repeat"):
            return self._repeat(fmt, where, kind, at)
        if kind == "tag":
            opening, body = self._tag(fmt, where, at)
            return self._rule(join(opening, body))
        if kind == "tags_with_separator":
            return self._separated(fmt, where, at)
        if kind in ("any_text", "triggered_tags", "dispatch"):
            return self._free(fmt, where, kind, at)
        if kind in ("token_triggered_tags", "token_dispatch"):
            return self._token_dispatch(fmt, where, kind, at)
        if kind == "qwen_xml_parameter":
            raise ValueError(f"{where}: qwen_xml_parameter (Qwen's XML arguments) is not served")
        raise ValueError(f"{where}: unknown format type {kind!r}")

    def _group(self, fmt: dict[str, Any], where: str, kind: str, at: At) -> str:
        elements = fmt.get("elements")
        if not isinstance(elements, list) or not elements:
            raise ValueError(f"{where}.elements must be a non-empty list of formats")
        if kind == "or":
            parts = [self._format(e, f"{where}.elements[{i}]", at) for i, e in enumerate(elements)]
            return self._rule(" | ".join(parts))

        def place(index: int) -> At:
            if index == len(elements) - 1:
                return at
            following = elements[index + 1]
            stop_tokens = at.stop_tokens
            if isinstance(following, dict) and following.get("type") == "token":
                # Free tokens before a token stop at it, as before a tag's token end.
                next_token = self._token(following.get("token"), f"{where}.elements[{index + 1}]")
                stop_tokens = (*stop_tokens, next_token)
            return At(last=starts_with_token(following), stop=at.stop, stop_tokens=stop_tokens)

        parts, i = [], 0
        while i < len(elements):
            element, named = elements[i], f"{where}.elements[{i}]"
            joint = glue(elements[i + 1]) if i < len(elements) - 1 else None
            if joint is None or not is_free(element):
                parts.append(self._format(element, named, place(i)))
                i += 1
                continue
            # Free text, then a string: the text takes the string as its end (one lexeme
            # that stops at its first), and what follows goes on after that string.
            ended = At(ends=(joint,), last=True, stop=(*at.stop, joint), stop_tokens=at.stop_tokens)
            parts.append(self._format(element, named, ended))
            following, named = elements[i + 1], f"{where}.elements[{i + 1}]"
            if following.get("type") == "tag":
                parts.append(self._tag(following, named, place(i + 1))[1])
            else:
                parts.append(self._rule(self._after(place(i + 1).ends) or EMPTY))
            i += 2
        return self._rule(" ".join(parts))

    def _repeat(self, fmt: dict[str, Any], where: str, kind: str, at: At) -> str:
        if kind == "optional":
            inner = self._format(fmt.get("content"), f"{where}.content", at)
            return self._rule(f"{inner} | {self._after(at.ends) or EMPTY}")
        content = fmt.get("content")
        place = At(stop=at.stop, stop_tokens=at.stop_tokens)
        inner = self._format(content, f"{where}.content", place)
        if kind == "repeat":
            least = count(fmt, "min", where, MAX_REPEAT, required=True) or 0
            most = fmt.get("max")
            if most == -1:
                times = f"{{{least},}}"
            else:
                most = count(fmt, "max", where, MAX_REPEAT, required=True) or 0
                if most < least:
                    raise ValueError(f"{where}: repeat's min must be <= max")
                if most == 0:
                    return self._rule(self._after(at.ends) or EMPTY)
                times = f"{{{least},{most}}}"
        else:
            times = "+" if kind == "plus" else "*"
        return self._rule(join(f"({inner}){times}", self._after(at.ends)))

    def _tag(self, fmt: dict[str, Any], where: str, at: At) -> tuple[str, str]:
        """A tag's begin, and a rule for the rest (its content, its end and what `at`
        adds), so that a trigger can stand for the begin's first characters."""
        begin = fmt.get("begin")
        if isinstance(begin, str):
            opening = self._text(begin)
        elif isinstance(begin, dict) and begin.get("type") == "token":
            opening = f"<[{self._token(begin.get('token'), where + '.begin.token')}]>"
        else:
            raise ValueError(f"{where}.begin must be a string or a token format")
        end, content = fmt.get("end"), fmt.get("content")
        if isinstance(end, dict) and end.get("type") == "token":
            closing = self._token(end.get("token"), f"{where}.end.token")
            inner = self._format(content, f"{where}.content", At(last=True, stop_tokens=(closing,)))
            return opening, self._rule(join(inner, f"<[{closing}]>", self._after(at.ends)))
        own = [end] if isinstance(end, str) else end
        if not isinstance(own, list) or not own or not all(isinstance(e, str) for e in own):
            raise ValueError(f"{where}.end must be a string, a list of strings or a token format")
        if not any(own):  # no end: the content ends where the tag does
            return opening, self._format(content, f"{where}.content", at)
        place = At(ends=tuple(own), last=True, stop=tuple(e for e in own if e))
        inner = self._format(content, f"{where}.content", place)
        return opening, self._rule(join(inner, self._after(at.ends)))

    def _tags(self, fmt: dict[str, Any], where: str) -> list[dict[str, Any]]:
        tags = fmt.get("tags")
        if not isinstance(tags, list) or not tags:
            raise ValueError(f"{where}.tags must be a non-empty list of tag formats")
        if len(tags) > MAX_TAGS:
            raise ValueError(f"{where}.tags: more than {MAX_TAGS} tags")
        for i, tag in enumerate(tags):
            if not isinstance(tag, dict) or tag.get("type", "tag") != "tag":
                raise ValueError(f"{where}.tags[{i}] must be a tag format")
        return tags

    def _separated(self, fmt: dict[str, Any], where: str, at: At) -> str:
        tags = self._tags(fmt, where)
        separator = fmt.get("separator")
        if not isinstance(separator, str):
            raise ValueError(f"{where}.separator must be a string")
        one = self._rule(
            " | ".join(
                join(*self._tag(t, f"{where}.tags[{i}]", INSIDE)) for i, t in enumerate(tags)
            )
        )
        if flag(fmt, "stop_after_first", where):
            body = one
        else:
            body = f"{one} ({join(self._text(separator), one)})*"
        if not flag(fmt, "at_least_one", where):
            body = f"({body}) | {EMPTY}"
        return self._rule(join(f"({body})", self._after(at.ends)))

    def _free(self, fmt: dict[str, Any], where: str, kind: str, at: At) -> str:
        """Free text, which `triggers` (or `rules`' patterns) leave for what they begin:
        any_text, triggered_tags and dispatch."""
        excludes = fmt.get("excludes", [])
        if not isinstance(excludes, list) or not all(isinstance(e, str) and e for e in excludes):
            raise ValueError(f"{where}.excludes must be a list of non-empty strings")
        if not at.last:
            raise ValueError(
                f"{where}: free text ({kind}) must end its tag or the output, or come before "
                "a token, a const_string or a tag with a string begin"
            )
        if "" in at.ends:
            raise ValueError(f"{where}: free text ({kind}) needs its tag's end strings non-empty")
        groups: list[tuple[str, str]] = []  # (trigger, what follows it)
        first: str | None = None
        loop = True
        if kind == "triggered_tags":
            groups, first, loop = self._triggered(fmt, where)
            if first is not None and not loop:  # exactly one tag
                return self._rule(join(first, self._after(at.ends)))
        elif kind == "dispatch":

            def pattern(pair: list[Any], named: str) -> str:
                if not isinstance(pair[0], str) or not pair[0]:
                    raise ValueError(f"{named}'s pattern must be a non-empty string")
                return pair[0]

            groups, loop = self._dispatched(fmt, where, "pattern", pattern)
        elif fmt.get("max_tokens") is not None:
            raise ValueError(f"{where}.max_tokens is not served (max_chars is)")
        # A trigger that begins with where the text stops never fires: the end wins, as in
        # xgrammar.
        groups = [(t, r) for t, r in groups if not any(t.startswith(end) for end in at.stop)]
        barred = [*excludes, *at.stop, *(t for t, _ in groups)]
        if len(barred) > MAX_STOPS:
            raise ValueError(
                f"{where}: free text stops at more than {MAX_STOPS} strings (its excludes, "
                "triggers or patterns, and its tag's ends; tags may share a trigger)"
            )
        most = count(fmt, "max_chars", where, INT32) if kind == "any_text" else None
        if most is not None:
            bounded_ends(list(at.ends), where, self._specials)
            if most * (1 + sum(map(len, barred))) > MAX_CHAR_STATES:
                raise ValueError(
                    f"{where}.max_chars: at most {MAX_CHAR_STATES} for each character of the "
                    "strings the text stops at, plus one"
                )
        text = self._terminal(
            (_ALL if most is None else f"/(?s:.){{0,{most}}}/")
            + (f" & ~({_ALL} ({' | '.join(literal(b) for b in barred)}) {_ALL})" if barred else "")
        )
        tail = self._ended(text, at.ends)
        if groups:
            heads = []
            for trigger, rest in groups:
                head = self._terminal(join(text, literal(trigger)))
                special = self._special(trigger)
                if special is not None:
                    head = self._rule(f"{head} | {text} <[{special}]>")
                heads.append(f"{head} {rest}")
            chosen = self._rule(" | ".join(heads))
            body = f"{chosen}* {tail}" if loop else f"{tail} | {join(chosen, self._after(at.ends))}"
        else:
            body = tail
        return self._rule(body if first is None else f"{first} ({body})")

    def _ended(self, text: str, ends: tuple[str, ...]) -> str:
        """Free text, then one of `ends`: one lexeme that stops at the first end, or the
        text and the added token an end is."""
        if not ends:
            return text
        parts = [self._terminal(join(text, "(" + " | ".join(literal(e) for e in ends) + ")"))]
        parts += [f"{text} <[{s}]>" for s in map(self._special, ends) if s is not None]
        return self._rule(" | ".join(parts))

    def _triggered(
        self, fmt: dict[str, Any], where: str
    ) -> tuple[list[tuple[str, str]], str | None, bool]:
        """triggered_tags' groups, first tag and loop (`_grouped`), by string trigger."""
        triggers = fmt.get("triggers")
        if not isinstance(triggers, list) or not triggers or len(triggers) > MAX_TRIGGERS:
            raise ValueError(f"{where}.triggers must be a list of 1 to {MAX_TRIGGERS} strings")
        if not all(isinstance(t, str) and t for t in triggers):
            raise ValueError(f"{where}.triggers must be non-empty strings")

        def trigger_of(index: int, begin: Any) -> tuple[str, str]:
            if not isinstance(begin, str):
                raise ValueError(
                    "Tags in triggered_tags must have a string begin, not a token format"
                )
            matches = [t for t in triggers if begin.startswith(t)]
            if not matches:
                raise ValueError("One tag does not match any trigger in a triggered tags format")
            if len(matches) > 1:
                raise ValueError("One tag matches multiple triggers in a triggered tags format")
            return matches[0], literal(begin[len(matches[0]) :])

        return self._grouped(fmt, where, trigger_of)

    def _grouped(
        self, fmt: dict[str, Any], where: str, trigger_of: Callable[[int, Any], tuple[Key, str]]
    ) -> tuple[list[tuple[Key, str]], str | None, bool]:
        """A triggered format's groups (a trigger, the rule of the tags it begins, less
        the trigger), the rule of a whole tag where one must come first, and whether it
        loops. `trigger_of(index, begin)`: a tag's trigger, and what of its begin is left."""
        chosen: dict[Key, list[str]] = {}
        whole = []
        for i, tag in enumerate(self._tags(fmt, where)):
            trigger, left = trigger_of(i, tag.get("begin"))
            opening, rest = self._tag(tag, f"{where}.tags[{i}]", INSIDE)
            chosen.setdefault(trigger, []).append(join(left, rest))
            whole.append(join(opening, rest))
        groups = [(t, "(" + " | ".join(rules) + ")") for t, rules in chosen.items()]
        loop = not flag(fmt, "stop_after_first", where)
        first = self._rule(" | ".join(whole)) if flag(fmt, "at_least_one", where) else None
        return groups, first, loop

    def _dispatched(
        self,
        fmt: dict[str, Any],
        where: str,
        what: str,
        trigger_of: Callable[[list[Any], str], Key],
    ) -> tuple[list[tuple[Key, str]], bool]:
        """A dispatch's groups (a rule's trigger, the rule of its format) and whether it
        loops. `what`: the trigger's name; `trigger_of(pair, where)`: a rule's trigger."""
        rules = fmt.get("rules")
        if not isinstance(rules, list) or not rules or len(rules) > MAX_TRIGGERS:
            raise ValueError(
                f"{where}.rules must be a list of 1 to {MAX_TRIGGERS} [{what}, format] pairs"
            )
        groups = []
        for i, pair in enumerate(rules):
            named = f"{where}.rules[{i}]"
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError(f"{named} must be a [{what}, format] pair")
            trigger = trigger_of(pair, named)
            groups.append((trigger, self._format(pair[1], f"{named}[1]", INSIDE)))
        return groups, flag(fmt, "loop", where, default=True)

    def _token_dispatch(self, fmt: dict[str, Any], where: str, kind: str, at: At) -> str:
        excluded = self._tokens(fmt.get("exclude_tokens", []), f"{where}.exclude_tokens")
        groups: list[tuple[int, str]] = []
        first: str | None = None
        if kind == "token_triggered_tags":
            triggers = self._tokens(fmt.get("trigger_tokens"), f"{where}.trigger_tokens")
            if not triggers or len(triggers) > MAX_TRIGGERS:
                raise ValueError(f"{where}.trigger_tokens must hold 1 to {MAX_TRIGGERS} tokens")

            def trigger_of(index: int, begin: Any) -> tuple[int, str]:
                if not (isinstance(begin, dict) and begin.get("type") == "token"):
                    raise ValueError(f"{where}.tags[{index}].begin must be a token format")
                token = self._token(begin.get("token"), f"{where}.tags[{index}].begin.token")
                if token not in triggers:
                    raise ValueError(
                        f"{where}.tags[{index}]'s begin token is not one of trigger_tokens"
                    )
                return token, ""

            groups, first, loop = self._grouped(fmt, where, trigger_of)
            if first is not None and not loop:  # exactly one tag
                return self._rule(join(first, self._after(at.ends)))
        else:
            groups, loop = self._dispatched(
                fmt, where, "token", lambda pair, named: self._token(pair[0], f"{named}[0]")
            )
        barred = excluded + at.stop_tokens + tuple(t for t, _ in groups)
        free = f"({any_token_but(barred, self._vocabulary)})*"
        chosen_rule = self._rule(" | ".join(f"<[{t}]> {after}" for t, after in groups))
        body = f"({free} {chosen_rule})* {free}" if loop else f"{free} {chosen_rule}?"
        if first is not None:
            body = f"{first} {body}"
        return self._rule(join(f"({body})", self._after(at.ends)))

    # --- leaves --------------------------------------------------------------------------

    def _side_grammar(self, lark: str) -> str:
        name = f"g{len(self._side) + 1}"
        self._side.append({"name": name, "lark_grammar": lark})
        return "@" + name

    def _token(self, token: Any, where: str) -> int:
        if isinstance(token, bool) or not isinstance(token, int | str):
            raise ValueError(f"{where} must be a token id or a token string")
        if isinstance(token, int):
            if not 0 <= token <= INT32:
                raise ValueError(f"{where}: Token ID must be non-negative")
            return token
        if not token:
            raise ValueError(f"{where}: Token string must be non-empty")
        if self._vocabulary is None:
            return 0
        found = self._vocabulary.token_id(token)
        if found is None:
            raise ValueError(f'Token string "{token}" not found in vocabulary')
        return found

    def _tokens(self, tokens: Any, where: str) -> tuple[int, ...]:
        if not isinstance(tokens, list):
            raise ValueError(f"{where} must be a list of token ids or strings")
        return tuple(self._token(t, f"{where}[{i}]") for i, t in enumerate(tokens))


def format_grammar(spec: Any, defaults: dict[str, Any], vocabulary: Vocabulary | None) -> str:
    """The llguidance grammar of a structural tag's `format` (the Lark text, or the JSON of
    it with the side grammars its `grammar` and `regex` formats compile to); ValueError
    says what is wrong. `defaults`: the request's JSON whitespace options; `vocabulary`:
    the model's tokenizer (None: checked only)."""
    if not isinstance(spec, dict):
        raise ValueError("structural_tag must be an object")
    if spec.get("type", "structural_tag") != "structural_tag":
        raise ValueError('Structural tag\'s type must be a string "structural_tag"')
    if deeper_than(spec, MAX_SCHEMA_DEPTH):
        raise ValueError(f"structural_tag is nested more than {MAX_SCHEMA_DEPTH} levels deep")
    if formats_in(spec.get("format"), MAX_FORMATS) > MAX_FORMATS:
        raise ValueError(f"structural_tag: more than {MAX_FORMATS} formats")
    return _Compiler(defaults, vocabulary).grammar(spec.get("format"))
