"""OpenAI's response objects for chat and completions, as its API reference shapes them.

- `chat.completion`: `choices[0].message` {role: assistant, content}, `finish_reason`,
  `usage` {prompt_tokens, completion_tokens, total_tokens}.
- `chat.completion.chunk`: `choices[0].delta` ({role, content} first, then {content},
  then {} with the `finish_reason`); with `stream_options.include_usage`, every chunk has
  `usage: null` (with vLLM's `continuous_usage_stats` too, the usage so far) and one
  more chunk, with empty `choices`, carries the usage.
- `text_completion`: `choices[0].text`, the same object for each streamed chunk.

With `n` > 1, the whole answer has one choice per generation, `index` 0 to n-1, and each
streamed chunk carries one choice's delta, with its `index`; with several prompts (a
completions list), prompt p's choice i is `index` p * n + i, as vLLM's.

`Kind` holds what differs between the two APIs, so one streaming loop serves both.
"""

from __future__ import annotations

import copy
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from ge_serve.server.control.requestlog import Outputs

from .answers import Usage
from .logprobs import Entry, Logprobs, echoed
from .reasoning import Reasoning
from .tokenids import Tags
from .tools import ToolUse


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"


@dataclass(slots=True)
class Answer:
    """One request's identity in every object of its answer."""

    model: str
    chat: bool
    include_usage: bool = False
    # vLLM's `continuous_usage_stats`: every chunk carries the usage so far.
    continuous_usage: bool = False
    # The answer's role (vLLM's: the last message's where no generation prompt opens an
    # assistant turn), and what `echo` puts before its text.
    role: str = "assistant"
    echo: str = ""
    # The echoed prompt's first token id, where `return_tokens_as_token_ids` shows it
    # (its logprobs entry has no other source of it); None: not needed, or not known.
    echo_id: int | None = None
    # ... and its text (vLLM's decode of it), the echo's first entry where the prompt's
    # text has none of it: a BOS the tokenizer adds.
    echo_first: str = ""
    # vLLM's `echo` with `max_tokens: 0`: the text is the echo alone (what the model
    # generated, to count the prompt, is not shown).
    echo_only: bool = False
    # The client's `X-Request-Id` or `request_id` (vLLM's), else a fresh one; prefixed as
    # OpenAI's ids are.
    id: str = ""
    # Where the client asked for log probabilities: how many, and the stream's offsets.
    logprobs: Logprobs | None = None
    # The text the stream's chunks have carried: where a chunk's `text_offset`s begin, as
    # vLLM counts them (a token's own text may not be what it added: a special token).
    streamed_chars: int = 0
    created: int = field(default_factory=lambda: int(time.time()))
    # The choice this answers (`n` > 1: one Answer per choice, `choice`).
    index: int = 0
    # Tool calling (tools.py): how the text becomes `tool_calls`; None: it is the content.
    tools: ToolUse | None = None
    # --reasoning-parser (reasoning.py): the thoughts apart from the content; None: none.
    reasoning: Reasoning | None = None
    # ... and how its thought tokens are counted (tokenids.py); None: not counted.
    tags: Tags | None = None
    # vLLM's `return_token_ids`: the prompt's ids (this choice's prompt's); None: not
    # asked for. A stream sends them once (completions: on each choice's first chunk).
    prompt_ids: list[int] | None = None
    token_ids: bool = False
    # The generated ids a stream's chunks have carried.
    ids_sent: int = 0
    # --enable-log-outputs (control/requestlog.py): what logs the answers; None: nothing.
    log: Outputs | None = None

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + (self.id or uuid.uuid4().hex)

    def choice(
        self,
        index: int,
        echo: str | None = None,
        first: tuple[int | None, str] | None = None,
        prompt_ids: list[int] | None = None,
    ) -> Answer:
        """The answer's choice `index`: its identity, with a stream's offsets of its own
        (and its prompt's `echo`, `echo_id` and ids, where a request has several
        prompts)."""
        other = copy.copy(self)
        other.index = index
        if echo is not None:
            other.echo = echo
            other.echo_id, other.echo_first = first or (None, "")
        if prompt_ids is not None:
            other.prompt_ids = prompt_ids
        other.streamed_chars = 0
        return other

    def _object(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(self, entries: list[Entry] | None, offset: int = 0) -> dict[str, Any] | None:
        if self.logprobs is None or entries is None:
            return None
        return self.logprobs.of(entries, offset)

    def whole(
        self, text: str, finish_reason: str, usage: Usage, entries: list[Entry] | None = None
    ) -> dict[str, Any]:
        """The non-streamed answer."""
        found = usage.prompt_logprobs
        choice = self.whole_choice(
            text, finish_reason, entries, found, usage.stop_reason, usage.token_ids
        )
        return self.whole_of([choice], usage)

    def whole_of(self, choices: list[dict[str, Any]], usage: Usage) -> dict[str, Any]:
        """The non-streamed answer of `choices` (`whole_choice`'s); chat's carries the
        prompt's log probabilities beside them (vLLM's `prompt_logprobs`)."""
        kind = "chat.completion" if self.chat else "text_completion"
        answer = {**self._object(kind, choices), "usage": usage.as_json()}
        if self.chat:  # vLLM's, null where not asked for (it sends every field)
            answer["prompt_logprobs"] = usage.prompt_logprobs
            answer["prompt_token_ids"] = self.prompt_ids
        return answer

    def whole_choice(
        self,
        text: str,
        finish_reason: str,
        entries: list[Entry] | None = None,
        prompt: list[Entry | None] | None = None,
        stop_reason: int | str | None = None,
        ids: list[int] | None = None,
    ) -> dict[str, Any]:
        """One choice of the non-streamed answer; `prompt`, the prompt's log
        probabilities where asked (completions' `echo` begins its logprobs with them).
        vLLM's fields beside OpenAI's are all there, null where they have no value (it
        sends its objects whole: clients read `choice.stop_reason` unguarded);
        `token_ids`, the generated `ids`, and `prompt_token_ids` where asked for."""
        if self.echo_only:
            text = ""
            entries = []
            ids = None if ids is None else []
        if not self.chat and self.echo and prompt is not None and entries is not None:
            entries = [*echoed(self.echo, prompt, self.echo_id, self.echo_first), *entries]
        if self.chat:
            message: dict[str, Any] = {"role": self.role, "content": self.echo + text}
            thoughts: str | None = None
            if self.reasoning is not None:
                # vLLM's: the tool calls are read from the content after the thoughts.
                thoughts, found = self.reasoning.split(text)
                message["content"] = None if found is None else self.echo + found
                text = found or ""
            if self.tools is not None and message["content"] is not None:
                content, calls = self.tools.message(text)
                message = {"role": self.role, "content": content}
                if calls:  # vLLM's and OpenAI's: no calls, no `tool_calls` at all
                    message["tool_calls"] = calls
                finish_reason = self.tools.finish_reason(finish_reason, bool(calls))
            # vLLM's field, null where hidden or without --reasoning-parser.
            shown = self.reasoning is not None and self.reasoning.include
            message["reasoning"] = thoughts if shown else None
            return {
                "index": self.index,
                "message": message,
                "logprobs": self._logprobs(entries),
                "finish_reason": finish_reason,
                "stop_reason": stop_reason,
                "token_ids": ids,
            }
        return {
            "index": self.index,
            "text": self.echo + text,
            "logprobs": self._logprobs(entries),
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "token_ids": ids,
            "prompt_logprobs": prompt,
            "prompt_token_ids": self.prompt_ids,
        }

    def chunk(
        self,
        text: str | None,
        finish_reason: str | None = None,
        first: bool = False,
        usage: Usage | None = None,
        entries: list[Entry] | None = None,
        delta: dict[str, Any] | None = None,
        stop_reason: int | str | None = None,
    ) -> bytes:
        """One streamed chunk: a text delta (None: none), with the finish reason where it
        ends the choice; `usage`, the usage so far, for `continuous_usage`; `entries`, its
        tokens' logprobs; `delta`, chat's delta itself (tool calls). vLLM's fields are
        there as vLLM sets them: completions' on every chunk, chat's `prompt_token_ids`
        on the role's, `token_ids` past it and `stop_reason` on the finishing one. With
        `return_token_ids`, `token_ids` are the generated ids `usage` holds that no chunk
        has carried yet (null where none: a chunk of held text's ids go with the next)."""
        if self.chat:
            delta = dict(delta or {})
            if first:
                delta["role"] = self.role
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": self.index, "delta": delta}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": self.index, "text": text or ""}
            kind = "text_completion"
        # Completions' offsets begin where the text sent before this chunk ends.
        choice["logprobs"] = self._logprobs(entries, self.streamed_chars)
        if not self.chat:
            self.streamed_chars += len(text or "")
        choice["finish_reason"] = finish_reason
        if not self.chat:
            choice["stop_reason"] = stop_reason
            choice["prompt_token_ids"], self.prompt_ids = self.prompt_ids, None
            choice["token_ids"] = self._ids(usage)
        else:
            if finish_reason is not None:
                choice["stop_reason"] = stop_reason
            if not first:
                choice["token_ids"] = self._ids(usage)
        data = self._object(kind, [choice])
        if self.chat and first:
            data["prompt_token_ids"] = self.prompt_ids
        if self.include_usage:
            # vLLM's: the cached tokens on chat's opening chunks alone.
            found = usage.as_json(self.chat, first) if self.continuous_usage and usage else None
            data["usage"] = found
        return sse(data)

    def unsent_ids(self, usage: Usage) -> bool:
        """Whether `return_token_ids` has generated ids no chunk has carried yet."""
        ids = usage.token_ids
        return self.token_ids and ids is not None and len(ids) > self.ids_sent

    def _ids(self, usage: Usage | None) -> list[int] | None:
        """The generated ids of a streamed chunk (`return_token_ids`): those not sent."""
        if not self.token_ids or usage is None or usage.token_ids is None:
            return None
        ids = usage.token_ids[self.ids_sent :]
        self.ids_sent = len(usage.token_ids)
        return [] if self.echo_only else ids or None

    def usage_chunk(self, usage: Usage) -> bytes:
        """The streamed usage: its `completion_tokens_details` only where it has a value
        (vLLM's, which leaves its nulls out there)."""
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        details = usage.thoughts is not None
        return sse({**self._object(kind, []), "usage": usage.as_json(details)})
