"""A streamed Responses answer: server-sent events, each `event: <type>` and `data:
<JSON>` with its `sequence_number` (0, 1, ...), in the order vLLM 0.34's simple
(non-harmony) stream sends them:

- `response.created`, `response.in_progress` (the response, status "in_progress");
- per output item: `response.output_item.added`, then for the thoughts
  (--reasoning-parser) `response.content_part.added`, `response.reasoning_text.delta`...,
  `response.reasoning_text.done`, `response.content_part.done`; for a message
  `response.content_part.added`, `response.output_text.delta`... (each with the
  tokens' logprobs where asked for), `response.output_text.done`,
  `response.content_part.done`; for a function call
  `response.function_call_arguments.delta`... and `.done`; then
  `response.output_item.done`. A message is opened by its first text: an answer with
  no text has no item.
- `response.completed`, or `response.incomplete` where the limit cut the answer, with
  the whole response (its output the items streamed, its usage).

An error once the stream has begun is OpenAI's `error` event {code, message, param},
and the stream ends there.
"""

from __future__ import annotations

from typing import Any

import orjson

from .answers import Usage
from .errors import OpenAIError
from .logprobs import Entry
from .responses_objects import (
    Identity,
    call_item,
    item_status,
    message_item,
    new_id,
    reasoning_item,
    reasoning_part,
    text_part,
)


class Events:
    """The events of one streamed response, numbered, and the items they close."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.sequence = 0
        self.output_index = 0
        # The item open now: "message", "call" or "" (none).
        self.open = ""
        self.item_id = ""
        self.text = ""
        self.logprobs: list[dict[str, Any]] = []
        self.call: dict[str, str] = {}
        self.items: list[dict[str, Any]] = []

    def event(self, kind: str, **data: Any) -> bytes:
        found = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(found) + b"\n\n"

    def opening(self) -> list[bytes]:
        response = self.identity.response("in_progress", [], None)
        return [
            self.event("response.created", response=response),
            self.event("response.in_progress", response=response),
        ]

    def content(self, text: str, entries: list[Entry] | None) -> list[bytes]:
        """A text delta (with its tokens' logprobs), opening a message first."""
        events = []
        if self.open != "message":
            events += self.close("completed")
            self.open, self.item_id = "message", new_id("msg")
            self.text, self.logprobs = "", []
            events.append(
                self.event(
                    "response.output_item.added",
                    output_index=self.output_index,
                    item=message_item(self.item_id, "in_progress", ""),
                )
            )
            events.append(
                self.event(
                    "response.content_part.added",
                    output_index=self.output_index,
                    item_id=self.item_id,
                    content_index=0,
                    part=text_part("", []),
                )
            )
        self.text += text
        found = self.identity.logprobs(entries) or []
        self.logprobs += found
        events.append(
            self.event(
                "response.output_text.delta",
                output_index=self.output_index,
                item_id=self.item_id,
                content_index=0,
                delta=text,
                # The delta event's logprobs have no bytes (OpenAI's and vLLM's shape).
                logprobs=[_without_bytes(entry) for entry in found],
            )
        )
        return events

    def reasoning(self, text: str) -> list[bytes]:
        """A delta of the thoughts (--reasoning-parser), opening their item first."""
        events = []
        if self.open != "reasoning":
            events += self.close("completed")
            self.open, self.item_id, self.text = "reasoning", new_id("rs"), ""
            item = reasoning_item(self.item_id, "in_progress", None)
            events += [
                self.event("response.output_item.added", output_index=self.output_index, item=item),
                self.event(
                    "response.content_part.added",
                    output_index=self.output_index,
                    item_id=self.item_id,
                    content_index=0,
                    part=reasoning_part(""),
                ),
            ]
        self.text += text
        events.append(
            self.event(
                "response.reasoning_text.delta",
                output_index=self.output_index,
                item_id=self.item_id,
                content_index=0,
                delta=text,
            )
        )
        return events

    def tool_delta(self, delta: dict[str, Any]) -> list[bytes]:
        """A chat delta of tool calls (tools.ToolStream's): a call with an id opens a
        function_call item; one without continues its arguments."""
        events = []
        for found in delta.get("tool_calls", ()):
            function = found.get("function", {})
            if "id" in found:
                events += self.close("completed")
                self.open, self.item_id = "call", new_id("fc")
                self.call = {"call_id": found["id"], "name": function["name"], "arguments": ""}
                item = call_item(self.item_id, found["id"], function["name"], "", "in_progress")
                events.append(
                    self.event(
                        "response.output_item.added", output_index=self.output_index, item=item
                    )
                )
            arguments = function.get("arguments") or ""
            if arguments and self.open == "call":
                self.call["arguments"] += arguments
                events.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        output_index=self.output_index,
                        item_id=self.item_id,
                        delta=arguments,
                    )
                )
        if delta.get("content"):
            events += self.content(delta["content"], None)
        return events

    def close(self, status: str) -> list[bytes]:
        """The open item's closing events, `status` its status."""
        if not self.open:
            return []
        where = {"output_index": self.output_index, "item_id": self.item_id}
        if self.open == "reasoning":
            part = reasoning_part(self.text)
            item = reasoning_item(self.item_id, status, self.text)
            events = [
                self.event(
                    "response.reasoning_text.done", **where, content_index=0, text=self.text
                ),
                self.event("response.content_part.done", **where, content_index=0, part=part),
            ]
        elif self.open == "message":
            part = text_part(self.text, self.logprobs or None)
            item = message_item(self.item_id, status, self.text, self.logprobs or None)
            events = [
                self.event("response.output_text.done", **where, content_index=0, text=self.text,
                           logprobs=[]),
                self.event("response.content_part.done", **where, content_index=0, part=part),
            ]  # fmt: skip
        else:
            call = self.call
            item = call_item(self.item_id, call["call_id"], call["name"], call["arguments"], status)
            events = [
                self.event(
                    "response.function_call_arguments.done",
                    **where,
                    name=call["name"],
                    arguments=call["arguments"],
                )
            ]
        events.append(
            self.event("response.output_item.done", output_index=self.output_index, item=item)
        )
        self.items.append(item)
        self.output_index += 1
        self.open = ""
        return events

    def closing(self, finish_reason: str | None, usage: Usage) -> list[bytes]:
        """The last item's end and the terminal event."""
        events = self.close(item_status(finish_reason))
        status = "incomplete" if finish_reason == "length" else "completed"
        response = self.identity.response(status, self.items, usage)
        return [*events, self.event(f"response.{status}", response=response)]

    def error(self, exc: OpenAIError) -> bytes:
        detail = exc.body()["error"]
        code = detail["code"] or detail["type"]
        return self.event("error", code=code, message=detail["message"], param=detail["param"])


def _without_bytes(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "token": entry["token"],
        "logprob": entry["logprob"],
        "top_logprobs": [
            {"token": top["token"], "logprob": top["logprob"]} for top in entry["top_logprobs"]
        ],
    }
