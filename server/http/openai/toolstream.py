"""Streamed `"auto"` tool calls, as they grow (toolparse.Stream, once a call has begun).

vLLM 0.34's parsers stream a call in pieces: a first delta with its `index`, `id`, `type`
and `function` `{name, arguments}` once its name is read, then deltas of `function`
`{arguments}` only, the next piece of the arguments' JSON. Here each call object is read
as it comes: its `"name"` member, then its `"arguments"` (or llama3's `"parameters"`)
member's text, rewritten as `json.dumps` writes it (`", "` and `": "` between members,
no other spaces, strings and numbers as dumped, `\\u` escapes as `ensure_ascii` wants),
so that a call's deltas joined are the unstreamed answer's `arguments`, whatever spacing
the model wrote. The first delta, with arguments "" (OpenAI's), goes once the key after
the name is read (or, with the arguments whole, where the object ends); each later text
piece sends only the pieces the reader added since, so a call costs its length, not its
length squared. Where the object ends, the rest of its arguments as dumped is sent
(vLLM's "unstreamed" remainder) where what was sent begins them; where it does not (a
key given twice inside the arguments: the rewrite keeps both, json.loads the last), what
was sent stays, as vLLM's.

A member of the call given twice (a second `"name"`, or a second of `"arguments"` and
`"parameters"`) holds the call's deltas until its object ends: where its first delta was
not sent yet, the whole object decides it (the last of each key, as the unstreamed parse
reads it), sent on one delta; where it was, what was sent stays (vLLM's rule) and only
the remainder above follows.

A call that turns out not to be one (its text stops being JSON, a `\\u` escape without
four hex digits, nesting deeper than `MAX_DEPTH`, no string name, or the answer ends
inside it) stops the streaming there: what was sent stays, as vLLM's; where no call was
sent yet, toolparse.Stream parses the held text whole at the end. (The whole parse reads
a call nested past MAX_DEPTH up to Python's recursion limit; streamed, it stops.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

_WS = " \t\n\r"
_STRUCTURE = '{}[],:"' + _WS
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
# The members read as they come: the call's name and its arguments.
_KEPT = ("name", "arguments", "parameters")
_ARGUMENTS = ("arguments", "parameters")
_HEX = frozenset("0123456789abcdefABCDEF")
# `Calls`' reading of a `tool_choice` "required" answer, beside the parsers' names.
REQUIRED = "required"
# Granite's tags before its array of calls: 3.0's token, 3.1's text; each optional.
GRANITE_TAGS = ("<|tool_call|>", "<tool_call>")
# Phi-4-mini's word and the array of calls it opens (vLLM's `functools\[`: Python's
# `functools.partial` in an answer is no call).
PHI4_TAG = "functools["
# The deepest nesting read (the call object is 1): deeper is no call, before json.loads
# would raise RecursionError (about 1000 deep, less the stack) on the object at its end.
MAX_DEPTH = 512


class CallText:
    """One call object's text, fed in pieces from its `{`: the members `_KEPT` keeps,
    their values rewritten as `json.dumps` writes them."""

    def __init__(self, ascii: bool) -> None:
        self.ascii = ascii
        self.depth = 0
        self.string = False
        self.escape = ""  # a backslash escape read in part
        self.high = ""  # a high surrogate waiting for its low half
        self.bare = ""  # a number or a literal read in part
        self.key: str | None = None  # a depth-1 key being read (its dumped text)
        self.member = ""  # the depth-1 member whose value is being read
        self.values: dict[str, list[str]] = {}
        self.called: str | None = None  # the name, once its member has ended (a string)
        self.named = False  # the name member has ended and a key after it was read
        self.twice = False  # a member of _KEPT given twice (or both arguments keys)
        self.done = False
        self.broken = False

    def feed(self, text: str) -> int:
        """Reads `text` up to the object's end; how many characters were read."""
        at, size = 0, len(text)
        while at < size and not (self.done or self.broken):
            char = text[at]
            if self.string:
                if self.escape:
                    self.escape += char
                    self._escaped()
                elif char == "\\":
                    self.escape = char
                elif char == '"':
                    self._close_string()
                else:
                    end = at
                    while end < size and text[end] not in '\\"':
                        end += 1
                    run = text[at:end]
                    if any(ord(char) < 0x20 for char in run):
                        self.broken = True  # raw control characters are not JSON
                    self._chars(run)
                    at = end
                    continue
            elif char not in _STRUCTURE:
                self.bare += char
            else:
                self._flush_bare()
                self._structure(char)
            at += 1
        return at

    def _structure(self, char: str) -> None:
        if char in _WS or self.broken:
            return
        if self.depth == 0:
            self.depth, self.broken = 1, char != "{"
        elif char == '"':
            self.string = True
            if self.depth == 1 and not self.member:
                self.key = ""
            else:
                self._emit('"')
        elif self.depth == 1 and (char == "]" or (char == ":" and not self.member)):
            self.broken = True  # a "]" closing the object, a colon without a key
        elif self.depth == 1 and char in ",}":
            if self.member == "name":
                self._end_name()
            self.member = ""
            self.done = char == "}"
        elif self.depth == 1 and char == ":":
            pass
        elif char in "{[":
            self.depth += 1
            self.broken = self.depth > MAX_DEPTH
            self._emit(char)
        elif char in "}]":
            self.depth -= 1
            self._emit(char)
        else:
            self._emit(": " if char == ":" else ", ")

    def _close_string(self) -> None:
        self._flush_high()
        self.string = False
        if self.key is None:
            self._emit('"')
            return
        key, self.key = json.loads(f'"{self.key}"'), None
        self.member = key if isinstance(key, str) and key else "-"
        self.named = self.called is not None
        if self.member not in _KEPT:
            return
        given = ("name",) if self.member == "name" else _ARGUMENTS
        if any(member in self.values for member in given):
            self.twice, self.member = True, "-"  # the last wins: the object decides
        else:
            self.values[self.member] = []

    def _escaped(self) -> None:
        kind = self.escape[1]
        if kind != "u":
            self.escape = ""
            if kind not in _ESCAPES:
                self.broken = True
                return
            self._chars(_ESCAPES[kind])
            return
        if len(self.escape) < 6:
            return
        digits, self.escape = self.escape[2:], ""
        if not _HEX.issuperset(digits):
            self.broken = True  # int() would take a sign, spaces, "_" or "0x"
            return
        point = int(digits, 16)
        if 0xD800 <= point < 0xDC00:
            self._flush_high()
            self.high = chr(point)
        elif 0xDC00 <= point < 0xE000 and self.high:
            pair = 0x10000 + ((ord(self.high) - 0xD800) << 10) + (point - 0xDC00)
            self.high = ""
            self._chars(chr(pair))
        else:
            self._chars(chr(point))

    def _flush_high(self) -> None:
        if self.high:
            high, self.high = self.high, ""
            self._chars(high)

    def _chars(self, text: str) -> None:
        self._flush_high()
        self._emit(json.dumps(text, ensure_ascii=self.ascii)[1:-1])

    def _flush_bare(self) -> None:
        if not self.bare:
            return
        bare, self.bare = self.bare, ""
        try:
            self._emit(json.dumps(json.loads(bare), ensure_ascii=self.ascii))
        except ValueError:
            self.broken = True

    def _emit(self, text: str) -> None:
        if self.key is not None:
            self.key += text
        elif self.member in self.values:
            self.values[self.member].append(text)

    def _end_name(self) -> None:
        try:
            found = json.loads("".join(self.values["name"]) or "null")
        except ValueError:
            self.broken = True  # two values ("a" "b"): not JSON
            return
        self.called = found if isinstance(found, str) else None

    def name(self) -> str | None:
        """The call's name, once its member has ended and a key after it was read (a
        string)."""
        return self.called if self.named else None

    def arguments(self) -> list[str]:
        """The pieces of the arguments' text so far, as dumped; it only grows."""
        for key in _ARGUMENTS:
            if key in self.values:
                return self.values[key]
        return []


# How each format goes from one call object to the next: `gap(text, at, first)` is where
# the next object's `{` is, None where the text does not show it yet, -1 where no more
# calls follow.
Gap = Callable[[str, int, bool], int | None]


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WS:
        at += 1
    return at


def _expect(text: str, at: int, char: str) -> int | None:
    """Past the spaces and `char` at `at`: where the next object's `{` may be."""
    at = _skip(text, at)
    if at == len(text):
        return None
    return _skip(text, at + 1) if text[at] == char else -1


def _opening(text: str, at: int) -> int | None:
    if at == len(text):
        return None
    return at if text[at] == "{" else -1


_TAG = "<tool_call>"


def _hermes(text: str, at: int, first: bool) -> int | None:
    tag = text.find(_TAG, at)
    return None if tag < 0 else _opening(text, _skip(text, tag + len(_TAG)))


def _llama3(text: str, at: int, first: bool) -> int | None:
    if first:
        tag = "<|python_tag|>"
        return _opening(text, _skip(text, len(tag) if text.startswith(tag) else 0))
    found = _expect(text, at, ";")
    return found if found is None or found < 0 else _opening(text, found)


def _mistral(text: str, at: int, first: bool) -> int | None:
    if first:
        tag = "[TOOL_CALLS]"
        if len(text) < len(tag) and tag.startswith(text):
            return None  # "[" opens an answer: it may be the tag's
        found = _expect(text, len(tag) if text.startswith(tag) else 0, "[")
    else:
        found = _expect(text, at, ",")
    return found if found is None or found < 0 else _opening(text, found)


def _granite(text: str, at: int, first: bool) -> int | None:
    if first:
        at = _skip(text, 0)
        for tag in GRANITE_TAGS:
            rest = text[at:]
            if len(rest) < len(tag) and tag.startswith(rest):
                return None  # may be the tag's start
            at = _skip(text, at + len(tag)) if rest.startswith(tag) else at
        found = _expect(text, at, "[")
    else:
        found = _expect(text, at, ",")
    return found if found is None or found < 0 else _opening(text, found)


def _phi4_mini(text: str, at: int, first: bool) -> int | None:
    if first:
        tag = text.find(PHI4_TAG)
        found = None if tag < 0 else _skip(text, tag + len(PHI4_TAG))
    else:
        found = _expect(text, at, ",")
    return found if found is None or found < 0 else _opening(text, found)


def _array(text: str, at: int, first: bool) -> int | None:
    """A JSON array of call objects: a `tool_choice` "required" answer (tools.py)."""
    found = _expect(text, 0 if first else at, "[" if first else ",")
    return found if found is None or found < 0 else _opening(text, found)


GAPS: dict[str, Gap] = {"llama3": _llama3, "llama3_json": _llama3, "mistral": _mistral}
GAPS["hermes"] = _hermes
GAPS["granite"] = _granite
GAPS["phi4_mini_json"] = _phi4_mini
GAPS[REQUIRED] = _array


class Calls:
    """The calls of a streamed answer's text from where the first begins, as deltas."""

    def __init__(self, parser: str, ascii: bool, new_id: Callable[[], str]) -> None:
        self.gap = GAPS[parser]
        self.ascii = ascii
        self.new_id = new_id
        self.rest = ""  # the text not read yet
        self.raw: list[str] = []  # the current call object's text
        self.current: CallText | None = None
        self.index = 0  # the current call's
        self.named = False  # the current call's first delta is sent
        self.sent = 0  # how many pieces of the current call's arguments were sent
        self.stopped = False

    @property
    def streamed(self) -> bool:
        """A call has been sent."""
        return self.index > 0 or self.named

    def feed(self, text: str) -> list[dict[str, Any]]:
        if self.stopped:
            return []
        self.rest += text
        deltas: list[dict[str, Any]] = []
        while not self.stopped:
            if self.current is None:
                found = self.gap(self.rest, 0, self.index == 0)
                if found is None:
                    if self.gap is _hermes and _TAG not in self.rest:
                        self.rest = self.rest[-len(_TAG) :]  # text between calls
                    break
                if found < 0:
                    self.stopped = True
                    break
                self.rest, self.raw = self.rest[found:], []
                self.current = CallText(self.ascii)
            current = self.current
            used = current.feed(self.rest)
            self.raw.append(self.rest[:used])
            self.rest = self.rest[used:]
            if current.broken:
                self.stopped = True
            elif current.done:
                deltas += self._ended(current)
            else:
                deltas += self._grown(current)
                break
        return deltas

    def _grown(self, current: CallText) -> list[dict[str, Any]]:
        """The deltas of what the current call's name and arguments add: the pieces
        added since the last, joined."""
        if current.twice:
            return []  # held until the object ends
        deltas = []
        if not self.named:
            name = current.name()
            if name is None:
                return []
            self.named = True  # with arguments "", as OpenAI's first delta of a call
            deltas.append(self._first(name, ""))
        pieces = current.arguments()
        if len(pieces) > self.sent:
            piece, self.sent = "".join(pieces[self.sent :]), len(pieces)
            deltas.append(self._piece(piece))
        return deltas

    def _ended(self, current: CallText) -> list[dict[str, Any]]:
        """The current call's last deltas, its arguments as dumped (vLLM's unstreamed
        remainder); not a call: no more calls are read."""
        try:
            found = json.loads("".join(self.raw))
        except (ValueError, RecursionError):
            found = None
        if not isinstance(found, dict) or not isinstance(found.get("name"), str):
            self.stopped = True
            return []
        value = found["arguments"] if "arguments" in found else found.get("parameters", {})
        whole = json.dumps(value, ensure_ascii=self.ascii)
        if not self.named:
            deltas = [self._first(found["name"], whole)]
        else:
            sent = "".join(current.arguments()[: self.sent])
            grown = len(whole) > len(sent) and whole.startswith(sent)
            deltas = [self._piece(whole[len(sent) :])] if grown else []
        self.current, self.named, self.sent = None, False, 0
        self.index += 1
        return deltas

    def _first(self, name: str, arguments: str) -> dict[str, Any]:
        function = {"name": name, "arguments": arguments}
        first = {"index": self.index, "id": self.new_id(), "type": "function"}
        return {"tool_calls": [{**first, "function": function}]}

    def _piece(self, arguments: str) -> dict[str, Any]:
        return {"tool_calls": [{"index": self.index, "function": {"arguments": arguments}}]}
