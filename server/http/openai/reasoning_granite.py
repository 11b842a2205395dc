"""IBM Granite 3.2's and 3.3's thoughts (`--reasoning-parser granite`), as vLLM's
GraniteReasoningParser reads them: no tags, but the phrases its chat template asks for
where the request turns `thinking` on: "Here is my thought process:" ... "Here is my
response:" ("Here's" too, which quantized models were seen to write).

Whole: the text between the first thought phrase and the first response phrase after it
is the reasoning, the text after the response phrase the content (none where empty);
text before the thought phrase is dropped; without both phrases, all of it is content.
Streamed (vLLM's deltas): the thoughts are read only where the answer begins with a
thought phrase, and then run to the response phrase, or to the end; any other answer is
all content. A piece's end that may begin a phrase is held until the next shows whether
it does. Structured outputs wait for `AFTER`, which either response phrase ends with.
"""

from __future__ import annotations

import re

THOUGHTS = ("Here is my thought process:", "Here's my thought process:")
RESPONSE = ("Here is my response:", "Here's my response:")
# What structured outputs wait for: the end both response phrases share.
AFTER = "my response:"
_WHOLE = re.compile(
    r"(?:Here's|Here is) my thought process:(.*?)(?:Here's|Here is) my response:(.*)", re.DOTALL
)

# The parts of an answer, in order: (True, thoughts) or (False, content).
Part = tuple[bool, str]


def split(text: str) -> tuple[str | None, str | None]:
    """A whole answer's reasoning and content (vLLM's extract_reasoning_content)."""
    found = _WHOLE.search(text)
    if found is None:
        return None, text
    return found.group(1), found.group(2) or None


class GraniteStream:
    """One streamed answer's parts as they come."""

    __slots__ = ("held", "phase")

    def __init__(self) -> None:
        self.phase = "start"  # then "thoughts" or "content"
        self.held = ""

    def feed(self, text: str) -> list[Part]:
        self.held += text
        parts: list[Part] = []
        if self.phase == "start":
            opening = next((p for p in THOUGHTS if self.held.startswith(p)), None)
            if opening is not None:
                self.phase, self.held = "thoughts", self.held[len(opening) :]
            elif any(p.startswith(self.held) for p in THOUGHTS):
                return parts  # may still be the phrase
            else:
                self.phase = "content"
        if self.phase == "thoughts":
            ends = [(at, p) for p in RESPONSE if (at := self.held.find(p)) >= 0]
            if not ends:
                keep = max(
                    (k for p in RESPONSE for k in range(1, len(p)) if self.held.endswith(p[:k])),
                    default=0,
                )
                self._part(parts, True, self.held[: len(self.held) - keep])
                self.held = self.held[len(self.held) - keep :]
                return parts
            at, phrase = min(ends)
            self._part(parts, True, self.held[:at])
            self.phase, self.held = "content", self.held[at + len(phrase) :]
        self._part(parts, False, self.held)
        self.held = ""
        return parts

    def finish(self) -> list[Part]:
        """The text held back, as it reads once the answer has ended."""
        parts: list[Part] = []
        self._part(parts, self.phase == "thoughts", self.held)
        self.held = ""
        return parts

    @staticmethod
    def _part(parts: list[Part], thoughts: bool, text: str) -> None:
        if text:
            parts.append((thoughts, text))
