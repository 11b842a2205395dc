"""The Responses API's objects, as vLLM 0.34 (its ResponsesResponse.from_request) and
OpenAI's API reference shape them.

- The response: id `resp_...`, object "response", created_at, status ("completed", or
  "incomplete" with incomplete_details.reason "max_output_tokens" where the limit cut
  it), model, output, usage {input_tokens, input_tokens_details {cached_tokens,
  cache_write_tokens}, output_tokens, output_tokens_details {reasoning_tokens},
  total_tokens}, and the request's fields echoed (temperature and top_p 1.0 where unset,
  OpenAI's and vLLM's defaults; tool_choice "none" without tools, as vLLM resolves it).
- Output items: with --reasoning-parser, first the thoughts {type: reasoning, id:
  rs_..., summary: [], content: [{type: reasoning_text, text}], status: null}; a
  message {type: message, id: msg_..., role: assistant, status, content: [{type:
  output_text, text, annotations: [], logprobs}]} (none without content where thoughts
  are parsed, as vLLM's) and function calls
  {type: function_call, id: fc_..., call_id, name, arguments, status}. The last item is
  "incomplete" where the answer was cut, the others "completed" (vLLM's
  build_response_output_items).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .answers import Usage
from .logprobs import Entry, chat_content
from .reasoning import Reasoning
from .responses import ResponsesRequest
from .toolparse import Call
from .tools import ToolUse


def item_status(finish_reason: str | None) -> str:
    """vLLM's response_item_status: what a cut ended is incomplete."""
    return "incomplete" if finish_reason == "length" else "completed"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage_json(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    thoughts = usage.thoughts
    return {
        "input_tokens": usage.prompt_tokens,
        # The prompt tokens found in the prefix cache (0 where the model reports none).
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens or 0,
            "cache_write_tokens": 0,
        },
        "output_tokens": usage.completion_tokens,
        # vLLM's count of the thought tokens (tokenids.py); 0 where not counted.
        "output_tokens_details": {"reasoning_tokens": thoughts.count if thoughts else 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def message_item(
    id: str, status: str, text: str, logprobs: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    content = [text_part(text, logprobs)] if text else []
    return {"type": "message", "id": id, "role": "assistant", "status": status, "content": content}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(id: str, status: str | None, text: str | None) -> dict[str, Any]:
    """vLLM's reasoning item: its text as one `reasoning_text` part (none while open)."""
    content = None if text is None else [reasoning_part(text)]
    return {
        "type": "reasoning",
        "id": id,
        "summary": [],
        "content": content,
        "encrypted_content": None,
        "status": status,
    }


def call_item(id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


@dataclass(slots=True)
class Identity:
    """One response's identity and the request's fields it echoes."""

    body: ResponsesRequest
    id: str = ""
    created_at: int = field(default_factory=lambda: int(time.time()))
    # How many top log probabilities the output text carries (None: none asked for).
    top_logprobs: int | None = None
    # --return-tokens-as-token-ids: tokens as `token_id:<id>` (vLLM's Responses API has no
    # request field for it).
    as_ids: bool = False

    def __post_init__(self) -> None:
        self.id = "resp_" + (self.id or uuid.uuid4().hex)

    def response(
        self, status: str, output: list[dict[str, Any]], usage: Usage | None
    ) -> dict[str, Any]:
        body = self.body
        tools = [
            {"type": "function", **tool.model_dump(exclude={"type"}, exclude_none=True)}
            for tool in body.tools or ()
        ]
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": body.max_tool_calls,
            "model": body.model,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": body.reasoning.model_dump() if body.reasoning is not None else None,
            "service_tier": body.service_tier or "auto",
            "store": False,
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "text": _text_config(body),
            "tool_choice": body.echoed_tool_choice(),
            "tools": tools,
            "top_logprobs": self.top_logprobs,
            "top_p": 1.0 if body.top_p is None else body.top_p,
            "truncation": body.truncation or "disabled",
            "usage": usage_json(usage),
            "user": body.user,
            "metadata": body.metadata,
        }

    def logprobs(self, entries: list[Entry] | None) -> list[dict[str, Any]] | None:
        """The output text's `logprobs` (None where not asked for)."""
        if self.top_logprobs is None:
            return None
        return chat_content(entries or [], self.top_logprobs, self.as_ids)

    def output(
        self,
        text: str,
        finish_reason: str,
        tools: ToolUse | None,
        entries: list[Entry] | None,
        reasoning: Reasoning | None = None,
    ) -> list[dict[str, Any]]:
        """The output items of a whole answer."""
        last = item_status(finish_reason)
        logprobs = self.logprobs(entries)
        items: list[dict[str, Any]] = []
        if reasoning is not None:
            # vLLM's: the thoughts' item first, then the content's, read for tool calls.
            thoughts, after = reasoning.split(text)
            if thoughts and reasoning.include:
                items.append(reasoning_item(new_id("rs"), None, thoughts))
            if after is None:
                return items
            text = after
        if tools is None:
            if reasoning is not None:
                return [*items, message_item(new_id("msg"), last, text, logprobs)]
            # vLLM's answer without a parser: one message, empty where the text is.
            return [message_item(new_id("msg"), last, text, logprobs)]
        content, calls = tools.message(text)
        if content:
            status = "completed" if calls else last
            items.append(message_item(new_id("msg"), status, content, logprobs))
        for index, found in enumerate(calls):
            status = last if index == len(calls) - 1 else "completed"
            items.append(_call(found, status))
        return items


def _call(found: Call, status: str) -> dict[str, Any]:
    function = found["function"]
    return call_item(new_id("fc"), found["id"], function["name"], function["arguments"], status)


def _text_config(body: ResponsesRequest) -> dict[str, Any]:
    """`text` as echoed: the format sent, else OpenAI's default {type: text}."""
    if body.text is None or body.text.format is None:
        return {"format": {"type": "text"}}
    return body.text.model_dump(exclude_none=True)
