"""Streamed `"auto"` tool calls, as they grow (toolparse.Stream, once a call has begun).

vLLM 0.34's parsers stream a call in pieces: a first delta with its `index`, `id`, `type`
and `function` `{name, arguments}` once its name is read, then deltas of `function`
`{arguments}` only, the next piece of the arguments' JSON. Here each call object is read
as it comes: its `"name"` member, then its `"arguments"` (or llama3's `"parameters"`)
member's text, rewritten as `json.dumps` writes it (`", "` and `": "` between members,
no other spaces, strings and numbers as dumped, `\\u` escapes as `ensure_ascii` wants),
so that a call's deltas joined are the unstreamed answer's `arguments`, whatever spacing
the model wrote. Where the object ends, what the rewrite could not follow (a key given
twice) is sent as vLLM sends its "unstreamed" remainder: the rest of the dumped
arguments, where what was sent begins them.

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
_HEX = frozenset("0123456789abcdefABCDEF")
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
        self.ended: set[str] = set()
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
            self.ended.add(self.member)
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
        if self.member in _KEPT and self.member not in self.values:
            self.values[self.member] = []
        elif self.member in _KEPT:
            self.member = "-"  # a key given twice: the last wins, checked at the end

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

    def name(self) -> str | None:
        """The call's name, once its member has ended (a string)."""
        if "name" not in self.ended:
            return None
        try:
            found = json.loads("".join(self.values["name"]) or "null")
        except ValueError:
            self.broken = True  # two values ("a" "b"): not JSON
            return None
        return found if isinstance(found, str) else None

    def arguments(self) -> str:
        """The arguments' text so far, as dumped."""
        for key in ("arguments", "parameters"):
            if key in self.values:
                return "".join(self.values[key])
        return ""


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


GAPS: dict[str, Gap] = {"llama3": _llama3, "llama3_json": _llama3, "mistral": _mistral}
GAPS["hermes"] = _hermes


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
        self.sent = ""  # the current call's arguments sent
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

    def _grown(self, current: CallText, arguments: str | None = None) -> list[dict[str, Any]]:
        """The deltas of what the current call's name and arguments add."""
        if arguments is None:
            arguments = current.arguments()
        if not self.named:
            name = current.name()
            if name is None:
                self.stopped = current.broken
                return []
            self.named, self.sent = True, arguments
            function = {"name": name, "arguments": arguments}
            first = {"index": self.index, "id": self.new_id(), "type": "function"}
            return [{"tool_calls": [{**first, "function": function}]}]
        if len(arguments) <= len(self.sent) or not arguments.startswith(self.sent):
            return []
        piece, self.sent = arguments[len(self.sent) :], arguments
        return [{"tool_calls": [{"index": self.index, "function": {"arguments": piece}}]}]

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
        deltas = self._grown(current, json.dumps(value, ensure_ascii=self.ascii))
        self.current, self.named, self.sent = None, False, ""
        self.index += 1
        return deltas
