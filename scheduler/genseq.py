"""One generation request inside the engine: its tokens, blocks and text state.

`tokens` is the prompt followed by everything generated; `computed` counts the tokens
whose keys and values are in the sequence's blocks. A decoding sequence has exactly one
token left to compute (the one it sampled last); a prefilling one has more. Preemption
frees the blocks and sets `computed` to 0: the sequence is prefilled again over its
prompt and what it has generated, and its sampler carries on where it was, so the
answer is the same as if it had never been preempted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ge_serve.backends.base import ResponseSink
from ge_serve.backends.llm.sampling import Sampler, SamplingParams
from ge_serve.backends.llm.text import Detokenizer, StopStrings

from .work import Timings


@dataclass(slots=True)
class Sequence:
    serial: int
    tokens: list[int]
    prompt_len: int
    max_tokens: int
    params: SamplingParams
    sampler: Sampler
    detokenizer: Detokenizer
    stops: StopStrings
    sink: ResponseSink
    stream: bool
    # Text put before the answer in the one response of a non-streamed request.
    echo: str
    arrival_s: float
    # Called once, from the engine thread, when the sequence has left the engine.
    on_done: Callable[[], None]
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    first_token_s: float | None = None
    last_token_s: float = 0.0
    scheduled_s: float | None = None
    finish_reason: str | None = None
    # Generated tokens already sent (in `output_ids`), when streaming.
    sent_ids: int = 0
    # Set from the event loop when the client has gone.
    cancelled: bool = False
    answer: list[str] = field(default_factory=list)
    # The client named finish_reason among its outputs: every response carries it (empty
    # until the last); otherwise only the last response does.
    reason_always: bool = False
    # The request's timings, which the core's statistics read once it is answered.
    timings: Timings = field(default_factory=Timings)

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next token can be sampled."""
        return len(self.tokens) - self.computed

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    def response(self, text: str, final: bool, ids: list[int]) -> dict[str, Any]:
        """One response's outputs: the text (a delta when streaming), the token counts so
        far, and the finish reason on the last one (Triton's vLLM backend's outputs), and
        `ids`, the tokens behind the text (TensorRT-LLM's `output_ids`)."""
        outputs = {
            "text_output": np.array([text.encode("utf-8")], dtype=object),
            "output_ids": np.array(ids, dtype=np.int32),
            "num_input_tokens": np.array([self.prompt_len], dtype=np.int32),
            "num_output_tokens": np.array([self.generated], dtype=np.int32),
        }
        if final and self.finish_reason:
            outputs["finish_reason"] = np.array([self.finish_reason.encode()], dtype=object)
        elif self.reason_always:
            outputs["finish_reason"] = np.array([], dtype=object)
        return outputs
