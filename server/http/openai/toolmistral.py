"""Mistral's newer tool calls (tokenizer v11 and later: Mistral Small 3.2, Magistral,
Devstral), whole and streamed: `[TOOL_CALLS]name[ARGS]{...}`, once for each call.

vLLM 0.34's `mistral` parser reads this format where the model's tokenizer is v11 or
later (an `[ARGS]` token in its vocabulary) and the older `[TOOL_CALLS][{"name",
"arguments"}, ...]` otherwise. ge-serve has no Mistral tokenizer object to ask, so the
text decides: what follows the first `[TOOL_CALLS]` (after spaces) is the old format's
JSON where it is `[` (toolparse.py, toolstream.py), this format otherwise.

As vLLM reads it: the name is the text up to `[ARGS]` (or up to the `{` that opens the
arguments: vLLM's `name{...}`), trimmed; the arguments are the first JSON value after
it, as the model wrote it (vLLM's raw text, not rewritten); text after that value up to
the next `[TOOL_CALLS]` is dropped (vLLM's gh#48975). mistral-common's v11 encoding puts
`[CALL_ID]id` between the name and `[ARGS]`; vLLM does not read it (the id would join
the name); here it is read and dropped: every call gets a new 9-character id, as vLLM's.

ge-serve's rules, as for its other formats: a call is one with a name (not empty, no
spaces or brackets) and arguments that are a JSON object; where one is not, the answer
has no calls (whole: its text is the content; streamed: the calls stop where it stops
being one, what was sent stays). vLLM instead sends such a call with its raw text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from .toolstream import Calls

TAG = "[TOOL_CALLS]"
_ARGS = "[ARGS]"
_CALL_ID = "[CALL_ID]"
# The tags, special tokens of Mistral's tokenizers, which decoding keeps for the parser.
TAGS = (TAG, _ARGS, _CALL_ID)
# What may end a call's name or its id.
_MARKS = re.compile(r"\[ARGS\]|\[CALL_ID\]|\[TOOL_CALLS\]|\{")
_HOLD = len(TAG) - 1  # the longest text that may be the start of a tag
_OUTSIDE = re.compile(r'[{}\[\]"]')
_INSIDE = re.compile(r'["\\]')
_SPACE = " \t\n\r"


def is_named(after_tag: str) -> bool | None:
    """Whether the text after `[TOOL_CALLS]` is this format (not the JSON array); None
    where only spaces were seen."""
    rest = after_tag.lstrip()
    return None if not rest else not rest.startswith("[")


def _name(text: str) -> str | None:
    name = text.strip()
    if not name or any(c in name for c in "[]") or any(c.isspace() for c in name):
        return None
    return name


def _id(text: str) -> bool:
    return text.strip().isalnum()


def parse(text: str) -> list[tuple[str, str]]:
    """The calls (name, arguments) of `text`, which begins with `[TOOL_CALLS]`; raises
    ValueError where it is not this format's calls."""
    calls = []
    at = len(TAG)
    while True:
        found = _MARKS.search(text, at)
        name = _name(text[at : found.start()]) if found else None
        if found is None or name is None or found.group() == TAG:
            raise ValueError("no call name")
        at = found.end()
        if found.group() == _CALL_ID:
            ended = _MARKS.search(text, at)
            if ended is None or ended.group() != _ARGS or not _id(text[at : ended.start()]):
                raise ValueError("no call id")
            at = ended.end()
        if found.group() == "{":
            at -= 1
        else:
            while at < len(text) and text[at] in _SPACE:
                at += 1
        if not text.startswith("{", at):
            raise ValueError("no arguments")
        _, end = json.JSONDecoder().raw_decode(text, at)
        calls.append((name, text[at:end]))
        at = text.find(TAG, end)
        if at < 0:
            return calls
        at += len(TAG)


class _Object:
    """A JSON object's text fed in pieces from its `{`: where it ends (strings and
    escapes read, brackets counted); whether it is JSON is json.loads' at its end."""

    def __init__(self) -> None:
        self.depth = 0
        self.string = False
        self.escape = False

    def feed(self, text: str) -> int | None:
        """Where in `text` the object ends (past its `}`), None where not yet."""
        at = 0
        while at < len(text):
            if self.escape:
                self.escape, at = False, at + 1
                continue
            found = (_INSIDE if self.string else _OUTSIDE).search(text, at)
            if found is None:
                return None
            char, at = found.group(), found.end()
            if self.string:
                self.escape = char == "\\"
                self.string = char != '"'
            elif char == '"':
                self.string = True
            elif char in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth == 0:
                    return at
        return None


class NamedCalls:
    """The calls of a streamed answer in this format, from its first `[TOOL_CALLS]`, as
    deltas: a call's first delta (index, id, name, arguments "") with the first piece of
    its arguments (where the piece ends them: once they are read as JSON), then each
    text piece's part of its arguments, as written."""

    def __init__(self, new_id: Callable[[], str]) -> None:
        self.new_id = new_id
        self.rest = ""  # the text not read yet
        self.phase = "tag"  # tag, name, id, gap, arguments
        self.searched = 0  # how much of `rest` was searched for the end of a name or id
        self.name = ""
        self.object: _Object | None = None
        self.raw: list[str] = []  # the current call's arguments' text
        self.index = 0  # the current call's
        self.named = False  # the current call's first delta is sent
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
        while not self.stopped and self._step(deltas):
            pass
        return deltas

    def _step(self, deltas: list[dict[str, Any]]) -> bool:
        """Reads what `rest` holds of the current phase; whether to read on."""
        if self.phase == "tag":
            at = self.rest.find(TAG)
            if at < 0:
                self.rest = self.rest[-_HOLD:]  # text after a call: dropped, as vLLM's
                return False
            self.rest, self.phase, self.searched = self.rest[at + len(TAG) :], "name", 0
            return True
        if self.phase in ("name", "id"):
            return self._until_arguments()
        if self.phase == "gap":
            self.rest = self.rest.lstrip(_SPACE)
            if not self.rest:
                return False
            if self.rest[0] != "{":
                self.stopped = True
                return False
            self.phase, self.object, self.raw = "arguments", _Object(), []
            return True
        return self._arguments(deltas)

    def _until_arguments(self) -> bool:
        found = _MARKS.search(self.rest, max(0, self.searched - _HOLD))
        if found is None:
            self.searched = len(self.rest)
            return False
        before, mark = self.rest[: found.start()], found.group()
        if self.phase == "name":
            name = _name(before)
            if name is None or mark == TAG:
                self.stopped = True
                return False
            self.name = name
            self.phase = "id" if mark == _CALL_ID else "gap"
        elif mark != _ARGS or not _id(before):
            self.stopped = True
            return False
        else:
            self.phase = "gap"
        self.rest = self.rest[found.start() if mark == "{" else found.end() :]
        self.searched = 0
        return True

    def _arguments(self, deltas: list[dict[str, Any]]) -> bool:
        assert self.object is not None
        end = self.object.feed(self.rest)
        piece = self.rest if end is None else self.rest[:end]
        self.raw.append(piece)
        self.rest = "" if end is None else self.rest[end:]
        if end is not None:
            try:
                whole = json.loads("".join(self.raw))
            except (ValueError, RecursionError):
                whole = None
            if not isinstance(whole, dict):
                self.stopped = True  # not JSON: what was sent stays
                return False
        if not self.named:  # after the check above: an answer in one piece is parsed whole
            self.named = True
            function = {"name": self.name, "arguments": ""}
            first = {"index": self.index, "id": self.new_id(), "type": "function"}
            deltas.append({"tool_calls": [{**first, "function": function}]})
        if piece:
            deltas.append({"tool_calls": [{"index": self.index, "function": {"arguments": piece}}]})
        if end is None:
            return False
        self.index, self.named, self.phase, self.object = self.index + 1, False, "tag", None
        return True


class MistralCalls:
    """A streamed `mistral` answer's calls, from where the first begins: the old
    format's (toolstream.Calls) or this one's, as the text after `[TOOL_CALLS]` shows."""

    def __init__(self, new_id: Callable[[], str]) -> None:
        self.new_id = new_id
        self.held = ""
        # Spaces after `[TOOL_CALLS]` while nothing else has come: kept apart, so that a
        # run of them costs its length, not a re-read of all held so far per piece.
        self.spaces: list[str] | None = None
        self.reader: Calls | NamedCalls | None = None
        self._stopped = False

    @property
    def streamed(self) -> bool:
        return self.reader is not None and self.reader.streamed

    @property
    def stopped(self) -> bool:
        return self._stopped if self.reader is None else self.reader.stopped

    @stopped.setter
    def stopped(self, value: bool) -> None:
        self._stopped = value
        if self.reader is not None:
            self.reader.stopped = value

    def feed(self, text: str) -> list[dict[str, Any]]:
        if self.stopped:
            return []
        if self.reader is None:
            if self.spaces is not None:
                if not text or text.isspace():
                    self.spaces.append(text)
                    return []
                self.held += "".join(self.spaces)
                self.spaces = None
            self.held += text
            if self.held.startswith(TAG):
                named = is_named(self.held[len(TAG) :])
                if named is None:
                    self.spaces = []  # only spaces after the tag so far
            elif TAG.startswith(self.held):
                named = None  # "[" opens an answer: it may be the tag's
            else:
                named = False  # an answer opened by "[": the old format's array
            if named is None:
                return []
            self.reader = NamedCalls(self.new_id) if named else Calls("mistral", False, self.new_id)
            text, self.held = self.held, ""
        return self.reader.feed(text)
