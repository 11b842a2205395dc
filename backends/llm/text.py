"""Text in and out: the tokenizer, the incremental detokenizer and stop strings.

Detokenizing one token at a time is wrong for byte-level BPE: a character may span
tokens (the first token alone decodes to U+FFFD), and a tokenizer's decoder may treat a
token differently at the start of a text. `Detokenizer` decodes a short window of recent
tokens (from `prefix` to the end) and emits only what that window adds beyond what it
decoded without the newest tokens, holding text back while it ends in an incomplete
character (vLLM's and TGI's scheme). Its cost per token is constant.

`StopStrings` finds stop strings in the generated text, including ones that span tokens,
and holds back the text that could still turn out to be the start of one, so a streamed
answer never shows part of a stop string it then drops.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

REPLACEMENT = "\ufffd"
# Tokens before the emitted point that the decoding window keeps for context.
_WINDOW_CONTEXT = 5


class Tokenizer:
    """A `tokenizers` tokenizer (tokenizer.json)."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer  # a heavy import, only for LLMs

        self._tokenizer: Any = HfTokenizer.from_file(str(path))
        self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def token_id(self, token: str) -> int | None:
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)


class Detokenizer:
    """The text of one sequence's generated tokens, one delta per token."""

    __slots__ = ("_prefix", "_read", "_skip", "_tokenizer", "ids")

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self.ids: list[int] = []
        # Window start, and where the text already emitted ends (token indexes).
        self._prefix = 0
        self._read = 0

    def add(self, token: int) -> str:
        """The new text the token completes ("" while a character is incomplete)."""
        self.ids.append(token)
        decode = self._tokenizer.decode
        before = decode(self.ids[self._prefix : self._read], self._skip)
        after = decode(self.ids[self._prefix :], self._skip)
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""
        delta = after[len(before) :]
        self._read = len(self.ids)
        self._prefix = max(self._read - _WINDOW_CONTEXT, 0)
        return delta

    def flush(self) -> str:
        """What is left undecoded at the end (an incomplete character, as U+FFFD)."""
        if self._read == len(self.ids):
            return ""
        decode = self._tokenizer.decode
        before = decode(self.ids[self._prefix : self._read], self._skip)
        after = decode(self.ids[self._prefix :], self._skip)
        self._read = len(self.ids)
        return after[len(before) :]


class StopStrings:
    """The generated text, cut at the first stop string, released as it becomes safe."""

    __slots__ = ("_include", "_released", "_stops", "stopped", "text")

    def __init__(self, stops: tuple[str, ...], include_stop: bool = False) -> None:
        self._stops = stops
        self._include = include_stop
        self.text = ""
        self._released = 0
        self.stopped = False

    def add(self, delta: str) -> str:
        """Append generated text; returns the text now safe to show. Once a stop string
        appears, `stopped` is set and the text ends before it (or after, if included)."""
        if self.stopped or not delta:
            return ""
        start = max(len(self.text) - self._longest + 1, 0)
        self.text += delta
        if self._stops:
            cut = self._first_stop(start)
            if cut is not None:
                self.stopped = True
                self.text = self.text[:cut]
                return self._release(len(self.text))
        return self._release(len(self.text) - self._held())

    def finish(self) -> str:
        """Everything not yet released (the sequence ended otherwise)."""
        return self._release(len(self.text))

    @property
    def _longest(self) -> int:
        return max((len(s) for s in self._stops), default=1)

    def _first_stop(self, start: int) -> int | None:
        best: tuple[int, int] | None = None
        for stop in self._stops:
            at = self.text.find(stop, start)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, at + len(stop))
        if best is None:
            return None
        return best[1] if self._include else best[0]

    def _held(self) -> int:
        """The length of the text's longest ending that begins some stop string."""
        held = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self.text)), held, -1):
                if self.text.endswith(stop[:size]):
                    held = size
                    break
        return held

    def _release(self, upto: int) -> str:
        if upto <= self._released:
            return ""
        out = self.text[self._released : upto]
        self._released = upto
        return out
