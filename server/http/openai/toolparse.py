"""Tool calls read from a model's text, for `tool_choice` "auto" (`--tool-call-parser`).

The formats of Triton's OpenAI front end's parsers and vLLM's of the same names:

- `llama3` (vLLM's `llama3_json`): the answer begins with `<|python_tag|>` or `{` (its
  very first character, as Triton's parse_tool_calls reads it: text before either is
  content and no call) and then JSON objects `{"name": ..., "arguments" | "parameters":
  {...}}`, separated by "; ";
- `mistral`: `[TOOL_CALLS]` anywhere (or `[` as the first character) and a JSON array of
  `{"name": ..., "arguments": {...}}`, or (where no `[` follows the tag: tokenizer v11+
  models) `[TOOL_CALLS]name[ARGS]{...}` for each call (toolmistral.py); text before
  `[TOOL_CALLS]` is the content; ids are 9 letters and digits, as Mistral's templates
  need them;
- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, repeated; text
  before the first is the content;
- `granite` (vLLM's; Granite 3.0's `<|tool_call|>`, 3.1's and later's `<tool_call>`): an
  answer that begins (after spaces) with either tag or none, then a JSON array of
  `{"name", "arguments"}`; anything else is content, and an answer with calls has none;
- `phi4_mini_json` (vLLM's; Phi-4-mini's): `functools[` anywhere, the JSON array of
  `{"name", "arguments" | "parameters"}` it opens (text after it ignored, as vLLM's);
  text before it is the content (vLLM's drops it, and streams no calls; here they grow
  as the other formats' do).

Text that does not parse as the format's calls is the answer's content, unchanged, as
both parse it; the content before a call is kept as written (vLLM's), not trimmed. A
parse is of whole text: streamed, `Stream` passes text through as content until it sees
a call begin, then sends the calls as they grow (toolstream.py); where no call could be
read so, the held text is parsed whole at the end, its deltas joined the whole answer's
content and calls.
"""

from __future__ import annotations

import json
import logging
import random
import re
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import toolmistral
from .toolmistral import MistralCalls
from .toolstream import GRANITE_TAGS, PHI4_TAG, Calls

log = logging.getLogger(__name__)

# A call as OpenAI's API shapes it: {"id", "type": "function", "function": {"name",
# "arguments": a JSON string}}.
Call = dict[str, Any]
# The parsers' names: Triton's and vLLM's.
PARSERS = ("llama3", "llama3_json", "mistral", "hermes", "granite", "phi4_mini_json")
# Triton's default for --max-tool-call-parse-bytes.
DEFAULT_MAX_PARSE_BYTES = 128 * 1024

_ALPHANUMERIC = string.ascii_letters + string.digits
_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def call(name: str, arguments: str, id: str | None = None) -> Call:
    """One call; `id`: vLLM's `chatcmpl-tool-<hex>` unless given."""
    return {
        "id": id or tool_id(),
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def tool_id() -> str:
    """vLLM's id of a call."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def _mistral_id() -> str:
    return "".join(random.choices(_ALPHANUMERIC, k=9))


def _of(found: Any, ascii: bool = True, id: Callable[[], str] | None = None) -> Call:
    """A parsed `{"name", "arguments"|"parameters"}` object as a call."""
    if not isinstance(found, dict) or not isinstance(found.get("name"), str):
        raise ValueError("not a call")
    arguments = found["arguments"] if "arguments" in found else found.get("parameters", {})
    return call(found["name"], json.dumps(arguments, ensure_ascii=ascii), id() if id else None)


def _llama3(text: str) -> tuple[str | None, list[Call]]:
    body = text
    tag = "<|python_tag|>"
    if not (body.startswith(tag) or body.startswith("{")):
        return text, []
    decoder = json.JSONDecoder()
    at = len(tag) if body.startswith(tag) else 0
    calls = []
    while at < len(body):
        found, end = decoder.raw_decode(body, at)
        calls.append(_of(found))
        at = end
        rest = body[at:].lstrip()
        if not rest:
            break
        if not rest.startswith(";"):
            raise ValueError("text after a call")
        at = len(body) - len(rest) + 1
        while at < len(body) and body[at].isspace():
            at += 1
    return None, calls


def _mistral(text: str) -> tuple[str | None, list[Call]]:
    tag = "[TOOL_CALLS]"
    at = text.find(tag)
    if at >= 0:
        before, rest = text[:at], text[at + len(tag) :]
        if toolmistral.is_named(rest):  # v11+: [TOOL_CALLS]name[ARGS]{...}, repeated
            found = toolmistral.parse(text[at:])
            return before or None, [call(name, args, _mistral_id()) for name, args in found]
    elif text.startswith("["):
        before, rest = "", text
    else:
        return text, []
    try:
        found = json.loads(rest)
    except ValueError:
        # Triton's and vLLM's fallback: the first array of objects in the text.
        matched = re.search(r"\[{.*}\]", rest, re.DOTALL)
        if matched is None:
            raise
        found = json.loads(matched.group(0))
    if not isinstance(found, list):
        raise ValueError("not a list of calls")
    calls = [_of(item, ascii=False, id=_mistral_id) for item in found]
    return before or None, calls


def _hermes(text: str) -> tuple[str | None, list[Call]]:
    at = text.find("<tool_call>")
    if at < 0:
        return text, []
    calls = [_of(json.loads(a or b), ascii=False) for a, b in _HERMES.findall(text)]
    return text[:at] or None, calls


def _granite(text: str) -> tuple[str | None, list[Call]]:
    stripped = granite_start(text.strip())
    if not stripped.startswith("["):
        return text, []
    found = json.loads(stripped)
    if not isinstance(found, list):
        raise ValueError("not a list of calls")
    return None, [_of(item, ascii=False) for item in found]


def _phi4_mini(text: str) -> tuple[str | None, list[Call]]:
    at = text.find(PHI4_TAG)
    if at < 0:
        return text, []
    found, _ = json.JSONDecoder().raw_decode(text, at + len(PHI4_TAG) - 1)  # from its `[`
    if not isinstance(found, list):
        raise ValueError("not a list of calls")
    return text[:at] or None, [_of(item, ascii=False) for item in found]


def granite_start(text: str) -> str:
    """Granite's text past its tags (each optional, spaces after each skipped)."""
    for tag in GRANITE_TAGS:
        text = text.removeprefix(tag).lstrip()
    return text


_PARSE = {
    "llama3": _llama3, "llama3_json": _llama3, "mistral": _mistral, "hermes": _hermes,
    "granite": _granite, "phi4_mini_json": _phi4_mini,
}  # fmt: skip
# Where a call may begin anywhere in the text, and what opens one as its first
# characters only (Triton's: llama3's tag is a call only at the very start).
_TAGS: dict[str, tuple[str, ...]] = {
    "llama3": (),
    "llama3_json": (),
    "mistral": ("[TOOL_CALLS]",),
    "hermes": ("<tool_call>",),
    "granite": (),
    "phi4_mini_json": (PHI4_TAG,),
}
_OPENERS: dict[str, tuple[str, ...]] = {
    "llama3": ("<|python_tag|>", "{"),
    "llama3_json": ("<|python_tag|>", "{"),
    "mistral": ("[",),
    "hermes": (),
    "granite": ("<|tool_call|>", "<tool_call>", "["),
    "phi4_mini_json": (),
}


def parse(parser: str, text: str) -> tuple[str | None, list[Call]]:
    """The content and the calls of a whole answer; no calls: the text is the content."""
    try:
        content, calls = _PARSE[parser](text)
    except (ValueError, KeyError, TypeError, RecursionError):
        return text, []
    return (content, calls) if calls else (text, [])


@dataclass(slots=True)
class Stream:
    """One streamed choice's text, as deltas: content until a call begins (the end of
    the text that may be the start of a tag is held until it is known not to be), then
    the calls as they grow (`streaming`, toolstream.Calls); where none could be read so,
    they are parsed from all of the text held at the end (`finish`).
    `limit`: Triton's --max-tool-call-parse-bytes, the most text (UTF-8 bytes) parsed;
    past it, `truncated` is set and the text is no longer read."""

    parser: str
    limit: int
    pending: str = ""
    calling: bool = False
    started: bool = False
    size: int = 0
    truncated: bool = False
    calls: list[Call] = field(default_factory=list)
    streaming: Calls | MistralCalls | None = None
    held: list[str] = field(default_factory=list)  # the text after `pending`, streaming

    @property
    def called(self) -> bool:
        """The answer's deltas have calls."""
        return bool(self.calls) or (self.streaming is not None and self.streaming.streamed)

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas `text` adds."""
        self.size += len(text.encode("utf-8"))
        if self.size > self.limit:
            self.truncated = True
            return []
        if self.streaming is not None:
            self.held.append(text)  # not `pending +=`: a copy of all of it each piece
            return self._calls(self.streaming, text)
        self.pending += text
        tags = _TAGS[self.parser]
        found = [at for at in (self.pending.find(tag) for tag in tags) if at >= 0]
        if found:
            return self._begin(min(found))
        if not self.started:
            openers = _OPENERS[self.parser]
            # Granite's call may follow spaces (vLLM's consume_space).
            lead = self.pending.lstrip() if self.parser == "granite" else self.pending
            if any(lead.startswith(opener) for opener in openers):
                return self._begin(0)
            if any(opener.startswith(lead) for opener in openers):
                return []  # may still open a call
            self.started = True
        keep = max(
            (k for tag in tags for k in range(1, len(tag)) if self.pending.endswith(tag[:k])),
            default=0,
        )
        return self._content(len(self.pending) - keep)

    def _begin(self, at: int) -> list[dict[str, Any]]:
        deltas = self._content(at) if at > 0 else []
        self.calling = True
        ascii = self.parser.startswith("llama3")  # as parse dumps the arguments
        if self.parser == "mistral":  # which of its two formats: the text after the tag
            self.streaming = MistralCalls(_mistral_id)
        else:
            self.streaming = Calls(self.parser, ascii, tool_id)
        return deltas + self._calls(self.streaming, self.pending)

    def _calls(self, streaming: Calls | MistralCalls, text: str) -> list[dict[str, Any]]:
        """The calls' deltas `text` adds; a defect of the incremental reader stops the
        streaming there, as a broken call does (what was sent stays), never the answer's
        stream with an error."""
        try:
            return streaming.feed(text)
        except Exception:
            log.warning("streamed %s tool calls stop: unreadable", self.parser, exc_info=True)
            streaming.stopped = True
            return []

    def _content(self, end: int) -> list[dict[str, Any]]:
        text, self.pending = self.pending[:end], self.pending[end:]
        if not text:
            return []
        self.started = True
        return [{"content": text}]

    def finish(self) -> list[dict[str, Any]]:
        """The last deltas: each call, whole, or the held text as content."""
        if self.truncated or self.called:
            return []  # what the calls left unsent stays so, as vLLM's
        if self.calling:
            self.pending += "".join(self.held)
            # The text held from where the call began: a parse of it may still find
            # content before the call (a mistral answer opened by "[").
            content, self.calls = parse(self.parser, self.pending)
            if self.calls:
                deltas = [{"content": content}] if content else []
                return deltas + [
                    {"tool_calls": [{"index": index, **found}]}
                    for index, found in enumerate(self.calls)
                ]
        return self._content(len(self.pending))
