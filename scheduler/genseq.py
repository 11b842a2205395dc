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
from ge_serve.backends.llm.logits import LogitsProcessor
from ge_serve.backends.llm.logprobs import TokenLogprobs
from ge_serve.backends.llm.prompt_logprobs import PromptLogprobs
from ge_serve.backends.llm.sampler import Sampler
from ge_serve.backends.llm.sampling import SamplingParams
from ge_serve.backends.llm.structured import Constraint
from ge_serve.backends.llm.text import Detokenizer, StopStrings
from ge_serve.backends.llm.thinking import ThinkingBudget

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
    # Times it was preempted (vLLM's vllm:request_num_preemptions).
    preemptions: int = 0
    finish_reason: str | None = None
    # Generated tokens already sent (in `output_ids`), when streaming.
    sent_ids: int = 0
    # Set from the event loop when the client has gone.
    cancelled: bool = False
    answer: list[str] = field(default_factory=list)
    # Every response carries finish_reason ("None" until the last, as vLLM's str(None)):
    # the client asked for it (return_finish_reason, or named it among its outputs);
    # otherwise only the last response does, where `reason` allows it.
    reason_always: bool = False
    # Which of finish_reason / num_input_tokens / num_output_tokens this request gets
    # (genrequest.extra_outputs: the model's opt-in flags, or all of them).
    reason: bool = True
    input_count: bool = True
    output_count: bool = True
    # Whether its responses carry `output_ids` (False where the config declares the flag
    # `return_output_ids` and the request leaves it unset).
    send_ids: bool = True
    # The prompt tokens found in the prefix cache when it was first admitted (vLLM's
    # num_cached_tokens), and whether its responses carry them (`num_cached_tokens`).
    cached: int = 0
    send_cached: bool = False
    # The request's log probabilities (its sampling `logprobs`; None: not asked for), and
    # whether its responses carry `logprobs` / `cumulative_logprob` (the return_* flags).
    logprobs: TokenLogprobs | None = None
    send_logprobs: bool = False
    send_cumulative: bool = False
    # The request's prompt log probabilities (sampling `prompt_logprobs`), and whether its
    # first response carries them (`prompt_logprobs` output; then False).
    prompt_logprobs: PromptLogprobs | None = None
    send_prompt_logprobs: bool = False
    # vLLM's logits processors the request asked for (penalties, logit_bias...); None:
    # none, and its logits go to the sampler as the step gave them.
    processor: LogitsProcessor | None = None
    # The grammar of a request with `structured_outputs` (compiled before it reaches the
    # engine); its state lives as long as the sequence, through preemptions.
    constraint: Constraint | None = None
    # vLLM's `thinking_token_budget` (backends/llm/thinking.py); None: no budget.
    thinking: ThinkingBudget | None = None
    # The request's timings, which the core's statistics read once it is answered.
    timings: Timings = field(default_factory=Timings)

    def admit(self, now: float) -> bool:
        """An admission at `now`; True the first time, which sets when it was scheduled
        and its cached tokens, what admission shared (`computed`): a preempted sequence's
        re-admission changes neither (vLLM's num_cached_tokens is the first's)."""
        if self.scheduled_s is not None:
            return False
        self.scheduled_s, self.cached = now, self.computed
        return True

    @property
    def remaining(self) -> int:
        """Tokens still to compute before the next token can be sampled."""
        return len(self.tokens) - self.computed

    @property
    def may_share(self) -> bool:
        """Whether admission may share a cached prefix: not while prompt positions whose
        log probabilities the request asked for are still to compute (vLLM's rule)."""
        found = self.prompt_logprobs
        return found is None or found.done(self.prompt_len)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    def new_ids(self) -> list[int]:
        """The generated tokens not sent yet (all of them for a non-streamed answer), now
        counted as sent."""
        start = self.prompt_len + self.sent_ids
        self.sent_ids = self.generated
        return self.tokens[start:]

    def response(self, text: str, final: bool, ids: list[int]) -> dict[str, Any]:
        """One response's outputs, as Triton's vLLM backend makes them: the text (a delta
        when streaming), the prompt's token count, the count of the tokens `ids` behind
        this response's text (so a stream's counts sum to the total, as Triton's OpenAI
        frontend sums them), and the finish reason; `ids` also go out as TensorRT-LLM's
        `output_ids`, and where asked the prompt's cached tokens."""
        outputs = {"text_output": np.array([text.encode("utf-8")], dtype=object)}
        if self.send_ids:
            outputs["output_ids"] = np.array(ids, dtype=np.int32)
        if self.input_count:
            outputs["num_input_tokens"] = np.array([self.prompt_len], dtype=np.int32)
        if self.output_count:
            outputs["num_output_tokens"] = np.array([len(ids)], dtype=np.int32)
        if self.send_cached:
            outputs["num_cached_tokens"] = np.array([self.cached], dtype=np.int32)
        if self.reason and (self.reason_always or (final and self.finish_reason)):
            reason = self.finish_reason if final else None
            outputs["finish_reason"] = np.array([str(reason).encode()], dtype=object)
        if self.send_logprobs or self.send_cumulative:
            self._add_logprobs(outputs)
        if self.send_prompt_logprobs:  # the first response only
            self.send_prompt_logprobs = False
            found = self.prompt_logprobs
            entries = found.take() if found is not None else b"null"
            outputs["prompt_logprobs"] = np.array([entries], dtype=object)
        return outputs

    def _add_logprobs(self, outputs: dict[str, Any]) -> None:
        """Triton's vLLM backend's: the JSON of this response's tokens ("null" without
        sampling `logprobs`), and the running sum (NaN, its float32 of None, without)."""
        found = self.logprobs
        if self.send_logprobs:
            text = found.take() if found is not None else b"null"
            outputs["logprobs"] = np.array([text], dtype=object)
        if self.send_cumulative:
            total = found.cumulative if found is not None else float("nan")
            outputs["cumulative_logprob"] = np.array([total], dtype=np.float32)
