"""A streamed Messages answer: server-sent events, each `event: <type>` and `data:
<JSON>`, in the order vLLM 0.34's message_stream_converter sends them:

- `message_start` {message: {id, type "message", role "assistant", content [], model,
  stop_reason null, stop_sequence null, usage {input_tokens, output_tokens 0}}};
- per content block, `content_block_start` {index, content_block} ({type: thinking,
  thinking: ""}, {type: text, text: ""} or {type: tool_use, id, name, input: {}}),
  `content_block_delta` {index, delta} (`thinking_delta` {thinking}, `text_delta`
  {text}, `input_json_delta` {partial_json}; a thinking block ends with a
  `signature_delta` {signature}), `content_block_stop` {index}. Text that comes while a
  tool_use block is open is held, and sent as a text block of its own after it.
  Arguments that are no JSON object are held too, and sent whole as the input the
  whole answer gives them (`tool_input`).
- `message_delta` {delta: {stop_reason, stop_sequence}, usage {input_tokens,
  output_tokens}}, then `message_stop` (the usage with `cache_read_input_tokens` where
  --enable-prompt-tokens-details asks for it, message_start's too: `usage_json`).

An error once the stream has begun closes the open block and is Anthropic's `error`
event {type: error, error: {type, message}}; the stream ends there.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson

from .answers import Piece, Usage
from .anthropic import renamed
from .errors import SERVER_ERROR, OpenAIError
from .reasoning import Reasoning
from .tools import ToolStream, ToolUse

log = logging.getLogger(__name__)


def usage_json(prompt_tokens: int, output_tokens: int, cached: int | None) -> dict[str, int]:
    """vLLM's _build_anthropic_usage: with the prompt's cached tokens (`cached`, asked
    for with --enable-prompt-tokens-details), `cache_read_input_tokens`, and
    `input_tokens` the rest of the prompt (Anthropic's total input is their sum)."""
    if cached is None:
        return {"input_tokens": prompt_tokens, "output_tokens": output_tokens}
    return {
        "input_tokens": max(0, prompt_tokens - cached),
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cached,
    }


def stop_reason(
    finish_reason: str | None, stop: int | str | None, used: bool, complete: bool
) -> tuple[str | None, str | None]:
    """vLLM's _to_anthropic_stop_reason: the finish reason and the matched stop string
    (`stop`, vLLM's stop_reason) as Anthropic's (stop_reason, stop_sequence); `used`:
    the answer has a tool_use block, `complete`: its calls' arguments are whole."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if complete:
        return "tool_use", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    if finish_reason == "tool_calls" or used:
        return "tool_use", None
    return "end_turn", None


def event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


class Events:
    """The events of one streamed message, and the block open now."""

    def __init__(
        self, id: str, model: str, tools: ToolUse | None, thinking: Reasoning | None
    ) -> None:
        self.id = id
        self.model = model
        self.parse: ToolStream | None = tools.stream() if tools is not None else None
        self.thoughts = thinking.stream() if thinking is not None else None
        self.index = 0
        # The block open now: "thinking", "text", "tool_use" or "" (none).
        self.open = ""
        self.tool_id = ""
        self.held: list[str] = []
        self.used = False
        # Each call's arguments, as their deltas came.
        self.calls: list[list[str]] = []

    async def run(
        self, first: Piece | None, rest: AsyncGenerator[Piece, None]
    ) -> AsyncIterator[bytes]:
        usage = Usage()
        reason: str | None = None
        if first is not None:
            usage.add(first)
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_json(usage.prompt_tokens, 0, usage.cached_tokens),
        }
        yield event("message_start", {"message": message})
        async with contextlib.aclosing(rest):
            try:
                piece = first
                while piece is not None:
                    if piece is not first:
                        usage.add(piece)
                    reason = piece.finish_reason or reason
                    for found in self._piece(piece.text):
                        yield found
                    if self.parse is not None and self.parse.truncated:
                        reason = "length"  # past --max-tool-call-parse-bytes, as chat
                        break
                    piece = await anext(rest, None)
                for found in self._finish():
                    yield found
            except OpenAIError as exc:
                for found in self._close():
                    yield found
                yield event("error", renamed(exc).anthropic_body())
                return
            except Exception as exc:
                log.exception("the stream of %s failed", self.id)
                for found in self._close():
                    yield found
                failure = OpenAIError(f"internal error: {exc}", status=500, kind=SERVER_ERROR)
                yield event("error", failure.anthropic_body())
                return
        complete = calls_complete(["".join(arguments) for arguments in self.calls])
        stop, sequence = stop_reason(reason or "stop", usage.stop_reason, self.used, complete)
        delta = {"stop_reason": stop, "stop_sequence": sequence}
        counts = usage_json(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        yield event("message_delta", {"delta": delta, "usage": counts})
        yield event("message_stop", {})

    def _piece(self, text: str) -> list[bytes]:
        parts = [{"content": text}] if self.thoughts is None else self.thoughts.feed(text)
        return self._parts(parts)

    def _finish(self) -> list[bytes]:
        found: list[bytes] = []
        if self.thoughts is not None:
            found += self._parts(self.thoughts.finish())
        if self.parse is not None and not self.parse.truncated:
            for delta in self.parse.finish():
                found += self._delta(delta)
        return found + self._flush()

    def _parts(self, parts: list[dict[str, str]]) -> list[bytes]:
        found: list[bytes] = []
        for part in parts:
            if "reasoning" in part:
                found += self._thinking(part["reasoning"])
            elif self.parse is not None:
                for delta in self.parse.feed(part["content"]):
                    found += self._delta(delta)
            else:
                found += self._text(part["content"])
        return found

    def _start(self, kind: str, block: dict[str, Any]) -> bytes:
        self.open = kind
        return event("content_block_start", {"index": self.index, "content_block": block})

    def _block_delta(self, delta: dict[str, Any]) -> bytes:
        return event("content_block_delta", {"index": self.index, "delta": delta})

    def _thinking(self, text: str) -> list[bytes]:
        if not text:
            return []
        found: list[bytes] = []
        if self.open != "thinking":
            found += self._flush()
            found.append(self._start("thinking", {"type": "thinking", "thinking": ""}))
        found.append(self._block_delta({"type": "thinking_delta", "thinking": text}))
        return found

    def _text(self, text: str) -> list[bytes]:
        if not text:
            return []
        if self.open == "tool_use":
            self.held.append(text)  # vLLM's: after the call's block
            return []
        found: list[bytes] = []
        if self.open != "text":
            found += self._flush()
            found.append(self._start("text", {"type": "text", "text": ""}))
        found.append(self._block_delta({"type": "text_delta", "text": text}))
        return found

    def _delta(self, delta: dict[str, Any]) -> list[bytes]:
        """A chat delta of the tool parser's: text, and calls opened or continued."""
        found = self._text(delta.get("content") or "")
        for call in delta.get("tool_calls", ()):
            function = call.get("function", {})
            if "id" in call and call["id"] != self.tool_id and function.get("name"):
                found += self._flush()
                self.used, self.tool_id = True, call["id"]
                self.calls.append([])
                block = {"type": "tool_use", "id": call["id"], "name": function["name"]}
                found.append(self._start("tool_use", {**block, "input": {}}))
            arguments = function.get("arguments") or ""
            if arguments and self.open == "tool_use":
                self.calls[-1].append(arguments)
                if self.calls[-1][0].startswith("{"):  # else held: see _close
                    found.append(self._input(arguments))
        return found

    def _input(self, partial: str) -> bytes:
        return self._block_delta({"type": "input_json_delta", "partial_json": partial})

    def _close(self) -> list[bytes]:
        """The open block's end (a thinking block's signature first)."""
        if not self.open:
            return []
        found = []
        if self.open == "thinking":
            signature = {"type": "signature_delta", "signature": uuid.uuid4().hex}
            found.append(self._block_delta(signature))
        held = "".join(self.calls[-1]) if self.open == "tool_use" else ""
        if held and not held.startswith("{"):
            # Arguments that are no JSON object: the input the whole answer gives them.
            found.append(self._input(json.dumps(tool_input(held), ensure_ascii=False)))
        found.append(event("content_block_stop", {"index": self.index}))
        self.open, self.tool_id = "", ""
        self.index += 1
        return found

    def _flush(self) -> list[bytes]:
        """The open block's end, and the text held while a call's block was open as a
        text block of its own (vLLM's stop_and_flush)."""
        held, self.held = "".join(self.held), []
        found = self._close()
        if held:
            found += self._text(held) + self._close()
        return found


def calls_complete(arguments: list[str]) -> bool:
    """Whether an answer's calls are whole: it has calls, and each one's arguments read
    as JSON (a stop string or the limit may cut the last). The whole answer's test and
    the stream's, for stop_reason's `complete`."""
    return bool(arguments) and all(_is_json(each) for each in arguments)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as its `input` object, whole and streamed alike: a JSON string
    that holds one (OpenAI's form of arguments, which a model may write) is that object;
    what does not read as one (a call the limit cut, an array) is an empty object."""
    try:
        found = json.loads(arguments)
        if isinstance(found, str):
            found = json.loads(found)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
