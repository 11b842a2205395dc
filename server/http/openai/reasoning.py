"""A thinking model's thoughts apart from its answer (`--reasoning-parser`), as vLLM 0.34's
reasoning parsers read them on /v1/chat/completions and /v1/responses.

Two parsers read `<think>`...`</think>` from the model's text:

- `deepseek_r1` (vLLM's DeepSeekR1ReasoningParser): the answer begins in its thoughts,
  whether or not the model writes `<think>` (a template may open it in the prompt). Whole,
  the text after the first `<think>` (before it: dropped) up to the first `</think>` is
  the reasoning, the rest the content (none where empty); without `</think>` all of it is
  reasoning and there is no content.
- `qwen3` (vLLM's Qwen3 parser engine): the same, except that a `<think>` inside the
  thoughts and a `</think>` after them are dropped, a `<tool_call>` ends the thoughts
  (the call is content, for the tool-call parser), and the answer is all content where
  thinking is off: the template's `enable_thinking` false (`chat_template_kwargs`, or
  `reasoning_effort` "none"), or a prompt that closes its thoughts itself (its last of
  `<think>`, `</think>`, `<|im_start|>`, `<|im_end|>` is `</think>`, as Qwen3's template
  writes it with thinking off).

`mistral` (vLLM's MistralReasoningParser; Magistral's and Ministral 3 Reasoning's) reads
`[THINK]`...`[/THINK]`, control tokens, which the answer's text keeps for it
(`kept_special_tokens`: vLLM's decoding of mistral-common's tokenizer keeps them; an
engine that skips special tokens would drop them). The answer is content until the model
writes `[THINK]`. Whole: the text between the first `[THINK]` and the first `[/THINK]`
after it is the reasoning, the text before and after it the content (none where empty);
with `[THINK]` alone, the text after it is the reasoning; without `[THINK]`, all of it is
content, less a first `[/THINK]`. Streamed (vLLM's BaseThinkingReasoningParser, whose
deltas drop a tag that comes as a token of its own): the same, each tag dropped.

`olmo3` (vLLM's Olmo3ReasoningParser; OLMo 3 Think's `<think>`, plain text in its
vocabulary): whole, the text up to the first `</think>` (less a `<think>` that begins
it) is the reasoning, the rest the content, and without `</think>` all of it is
content; streamed as deepseek_r1's (vLLM's buffer gives the same deltas for an answer
that thinks once, the common case). Its structured outputs apply from the first token
where the prompt holds a `</think>` (vLLM's is_reasoning_end reads the text).

`granite` (vLLM's GraniteReasoningParser; Granite 3.2's and 3.3's, with the template's
`thinking` on) reads phrases, not tags: reasoning_granite.py.

Structured outputs with a parser constrain the answer after its thoughts, as vLLM's
structured-output manager does (its reasoning_ended): where the answer begins in its
thoughts, `Reasoning.after` is `</think>`, which the front end gives the model as the
`llm` engine's key `structured_outputs_after`, so that the grammar applies only from the
token after the one that writes it (thoughts that never end are never constrained);
where the prompt has closed them (qwen3 with thinking off, or a prompt whose last of
`<think>` / `</think>` is `</think>`: vLLM's is_reasoning_end on the prompt; mistral's:
a prompt whose last `[THINK]` a `[/THINK]` follows), the grammar applies from the first
token. mistral's answer, which begins as content, is constrained only after its
`[/THINK]`, as vLLM's (whose is_reasoning_end waits for the thoughts to end). qwen3's
`<tool_call>`, which ends the thoughts for the split, does not start the grammar: the
engine waits for `</think>`.

vLLM reads the tags as single tokens; here the text is read, so a stream holds a piece's
end that may begin a tag until the next shows whether it does. Streamed, the deltas are
vLLM's streamed deltas (text before a `<think>` is reasoning there too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from . import reasoning_granite

# The parsers' names, vLLM's.
PARSERS = ("deepseek_r1", "granite", "mistral", "olmo3", "qwen3")
START, END = "<think>", "</think>"
MISTRAL = ("[THINK]", "[/THINK]")
_OLMO3 = re.compile(r"(?:<think>)?(.*?)</think>(.*)", re.DOTALL)
_TOOL_CALL = "<tool_call>"
# Qwen3's ChatML turn markers: a `</think>` before them closed an earlier turn's thoughts.
_TURNS = ("<|im_start|>", "<|im_end|>")

Delta = dict[str, str]


@dataclass(frozen=True, slots=True)
class Reasoning:
    """How one request's answer is split: the parser, whether the thoughts are shown
    (vLLM's `include_reasoning`), and whether the answer begins in its thoughts."""

    parser: str
    include: bool = True
    thinking: bool = True
    # Structured outputs: the text after which the grammar applies (None: from the
    # first token, or unconstrained).
    after: str | None = None

    @property
    def tags(self) -> tuple[str, str] | None:
        """The tokens that open and close the thoughts, for a budget and a count; None for
        a parser that reads text (granite's phrases, olmo3's plain-text tags), whose
        thoughts get neither."""
        return tags_of(self.parser)

    def kept_special_tokens(self) -> tuple[str, ...]:
        """The special tokens the answer's text keeps: mistral's tags."""
        return MISTRAL if self.parser == "mistral" else ()

    def split(self, text: str) -> tuple[str | None, str | None]:
        """A whole answer's reasoning and content (vLLM's extract_reasoning)."""
        if self.parser == "mistral":
            return _mistral_split(text)
        if self.parser == "granite":
            return reasoning_granite.split(text)
        if self.parser == "olmo3":
            found = _OLMO3.match(text)
            return (None, text) if found is None else (found[1] or None, found[2] or None)
        if self.parser == "deepseek_r1":
            before, opened, after = text.partition(START)
            body = after if opened else before
            reasoning, ended, content = body.partition(END)
            return (reasoning, content or None) if ended else (body, None)
        stream = self.stream(include=True)
        parts = [*stream.feed(text), *stream.finish()]
        reasoning = "".join(part.get("reasoning", "") for part in parts)
        content = "".join(part.get("content", "") for part in parts)
        return reasoning or None, content or None

    def stream(self, include: bool | None = None) -> ReasoningStream:
        return ReasoningStream(self, self.include if include is None else include)


def tags_of(parser: str) -> tuple[str, str] | None:
    """The tokens that open and close `parser`'s thoughts (Reasoning.tags)."""
    if parser in ("granite", "olmo3"):
        return None
    return MISTRAL if parser == "mistral" else (START, END)


def _mistral_split(text: str) -> tuple[str | None, str | None]:
    start, end = MISTRAL
    before, opened, rest = text.partition(start)
    if opened:
        thoughts, closed, after = rest.partition(end)
        if closed:
            return thoughts, (before + after) or None
        return rest, before or None
    head, closed, tail = text.partition(end)
    return None, head + tail if closed else text


class ReasoningStream:
    """One streamed choice's text as `{"reasoning": ...}` and `{"content": ...}` deltas."""

    def __init__(self, use: Reasoning, include: bool) -> None:
        self.qwen3 = use.parser == "qwen3"
        self.mistral = use.parser == "mistral"
        self.include = include
        self.thinking = use.thinking
        self.ended = False  # mistral's: the thoughts have closed
        self.pending = ""
        self.granite = reasoning_granite.GraniteStream() if use.parser == "granite" else None

    def _tags(self) -> tuple[str, ...]:
        if self.mistral:
            return MISTRAL  # each dropped wherever it comes
        if self.thinking:
            return (START, END, _TOOL_CALL) if self.qwen3 else (START, END)
        # deepseek_r1's content is the text as written; qwen3 drops a repeated `</think>`.
        return (END,) if self.qwen3 else ()

    def feed(self, text: str) -> list[Delta]:
        """The deltas `text` adds."""
        if self.granite is not None:
            return self._parts(self.granite.feed(text))
        self.pending += text
        deltas: list[Delta] = []
        while tags := self._tags():
            found = [(at, tag) for tag in tags if (at := self.pending.find(tag)) >= 0]
            if not found:
                break
            at, tag = min(found)
            self._emit(deltas, self.pending[:at])
            # A call ends the thoughts and is the content's (its tag kept).
            self.pending = self.pending[at:] if tag == _TOOL_CALL else self.pending[at + len(tag) :]
            if self.mistral:  # thoughts open once, at the first `[THINK]`
                opens = tag == MISTRAL[0] and not self.ended
                self.ended = self.ended or (tag == MISTRAL[1] and self.thinking)
                self.thinking = opens or (self.thinking and not self.ended)
            elif tag != START:
                self.thinking = False
        tags = self._tags()
        keep = max(
            (k for tag in tags for k in range(1, len(tag)) if self.pending.endswith(tag[:k])),
            default=0,
        )
        self._emit(deltas, self.pending[: len(self.pending) - keep])
        self.pending = self.pending[len(self.pending) - keep :]
        return deltas

    def finish(self) -> list[Delta]:
        """The text held back, as it reads once the answer has ended."""
        if self.granite is not None:
            return self._parts(self.granite.finish())
        deltas: list[Delta] = []
        self._emit(deltas, self.pending)
        self.pending = ""
        return deltas

    def _parts(self, parts: list[reasoning_granite.Part]) -> list[Delta]:
        shown = [(thoughts, text) for thoughts, text in parts if self.include or not thoughts]
        return [{"reasoning" if thoughts else "content": text} for thoughts, text in shown]

    def _emit(self, deltas: list[Delta], text: str) -> None:
        if not text:
            return
        if self.thinking:
            if self.include:
                deltas.append({"reasoning": text})
        else:
            deltas.append({"content": text})


def plan(
    parser: str,
    shown: bool,
    template_kwargs: dict[str, Any] | None,
    prompt: str,
    constrained: str | None,
) -> Reasoning | None:
    """The request's Reasoning (None without a parser). `shown`: vLLM's
    `include_reasoning`; `constrained`: the field that constrains the answer (structured
    outputs), if any."""
    if not parser:
        return None
    if parser == "granite":
        # Granite thinks where its template's `thinking` asks it to; structured outputs
        # then wait for the phrase the template tells it to answer after.
        thinking = bool((template_kwargs or {}).get("thinking"))
        after = reasoning_granite.AFTER if constrained and thinking else None
        return Reasoning(parser, shown, thinking, after)
    if parser == "mistral":
        # vLLM's is_reasoning_end on the prompt: its last `[THINK]` closed after it.
        start, end = MISTRAL
        opened = prompt.rfind(start)
        closed = opened >= 0 and prompt.find(end, opened) >= 0
        after = end if constrained is not None and not closed else None
        return Reasoning(parser, shown, False, after)
    thinking = True
    if parser == "qwen3":
        thinking = (template_kwargs or {}).get("enable_thinking", True) is not False
        if thinking:
            last = max((prompt.rfind(tag), tag) for tag in (START, END, *_TURNS))
            thinking = not (last[0] >= 0 and last[1] == END)
    after = None
    if constrained is not None and thinking:
        # vLLM's is_reasoning_end on the prompt: for deepseek_r1, its last of the two
        # tags; for olmo3, any `</think>` (qwen3's rule, with its turns, is `thinking`'s).
        closed = (parser == "deepseek_r1" and prompt.rfind(END) > prompt.rfind(START)) or (
            parser == "olmo3" and END in prompt
        )
        after = None if closed else END
    return Reasoning(parser, shown, thinking, after)
