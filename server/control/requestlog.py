"""vLLM's request log: `--enable-log-requests`, `--max-log-len`, `--enable-log-outputs` and
`--enable-log-deltas` (read by startup/vllmserve.py; http/openai/text.py and textstream.py
call it), in vLLM's words and at its levels:

- each generation request, as it is sent to the model: `Received request <id>: params:
  <its sampling parameters>, lora_request: None.` at INFO, and its prompt (`Request <id>
  details: prompt: ..., prompt_token_ids: ...`) at DEBUG (Triton's `--log-verbose`), cut
  to --max-log-len characters or ids;
- with --enable-log-outputs, each answer: `Generated response <id>: output: ...,
  finish_reason: ...` at INFO; a stream's pieces as they come (`(streaming delta)`, unless
  --enable-log-deltas is false) and its whole text at its end (`(streaming complete)`).

A prompt or an answer is the client's data: none of it is logged unless asked for.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("ge_serve.requests")


@dataclass(frozen=True, slots=True)
class RequestLogging:
    requests: bool = False
    max_len: int | None = None
    outputs: bool = False
    deltas: bool = True

    def received(
        self, request_id: str, prompt: str | list[int], params: dict[str, Any], n: int = 1
    ) -> None:
        """A request sent to the model (`params`: the sampling parameters it carries, for
        `n` choices); nothing is built where the log is off."""
        if not self.requests:
            return
        if log.isEnabledFor(logging.DEBUG):
            text = prompt if isinstance(prompt, str) else None
            ids = prompt if isinstance(prompt, list) else None
            log.debug(
                "Request %s details: prompt: %r, prompt_token_ids: %s, prompt_embeds shape: None.",
                request_id,
                self._cut(text),
                self._cut(ids),
            )
        shown = json.dumps({**params, "n": n}, ensure_ascii=False, default=str)
        log.info("Received request %s: params: %s, lora_request: None.", request_id, shown)

    def outputs_of(self, request_id: str) -> Outputs | None:
        """What logs a request's answers, where --enable-log-outputs asks for them."""
        return Outputs(self, request_id) if self.requests and self.outputs else None

    def generated(self, request_id: str, text: str, reason: str | None, stream: str = "") -> None:
        log.info(
            "Generated response %s%s: output: %r, finish_reason: %s",
            request_id,
            stream,
            self._cut(text),
            reason,
        )

    def _cut(self, value: Any) -> Any:
        if value is None or self.max_len is None:
            return value
        return value[: self.max_len]


@dataclass(slots=True)
class Outputs:
    """One request's answers, logged: its choices' texts, and a stream's pieces, each
    under the request's id (vLLM's, whatever the choice or the prompt)."""

    logging: RequestLogging
    request_id: str
    texts: dict[int, list[str]] = field(default_factory=dict)

    def whole(self, index: int, text: str, reason: str | None) -> None:
        """A choice's whole answer (not streamed)."""
        self.logging.generated(self.request_id, text, reason)

    def piece(self, index: int, text: str, reason: str | None) -> None:
        """A streamed choice's next piece of text."""
        self.texts.setdefault(index, []).append(text)
        if self.logging.deltas and (text or reason):
            self.logging.generated(self.request_id, text, reason, " (streaming delta)")

    def complete(self) -> None:
        """The end of a stream: each choice's whole text."""
        for index in sorted(self.texts):
            text = "".join(self.texts[index])
            complete = " (streaming complete)"
            self.logging.generated(self.request_id, text, "streaming_complete", complete)
