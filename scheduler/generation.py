"""The generation engine's scheduler: iteration-level (continuous) batching of one
generative model version (backend `llm`), which ge-serve schedules itself.

The core hands each request to `submit` on the event loop, as for every model. `submit`
reads it into a `Sequence` (genrequest.py; bad input fails there, INVALID_ARG), passes
it to the engine thread and waits until the sequence leaves the engine. The engine
thread runs the iteration loop: at each step boundary it takes new and drops cancelled
sequences, decides the step (genplan.py: who decodes, who prefills which chunk, who is
admitted or preempted), runs it on the step runner, samples, detokenizes, and sends each
sequence's responses through its sink (the core's ResponseQueue, which crosses to the
loop with call_soon_threadsafe). The loop thread never waits on the engine, and the
engine never touches the loop's objects except through call_soon_threadsafe.

A client that goes away cancels `submit`; the sequence is marked, and the engine drops
it and frees its blocks at the next step boundary, within one step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections import deque

import numpy as np
import numpy.typing as npt

from ge_serve.backends.base import ModelError
from ge_serve.backends.llm.backend import LlmModel
from ge_serve.backends.llm.logits import nothing_possible
from ge_serve.backends.llm.prompt_logprobs import LmHead
from ge_serve.backends.llm.runner import RowWork
from ge_serve.backends.llm.structured import (
    Constraint,
    GrammarFailed,
    Grammars,
    Structured,
    UnsupportedTokenizer,
)
from ge_serve.server.errors import ErrorCode, SchedulerClosed, ServerError, invalid_arg

from .genplan import Limits, StepPlan, enqueue, plan_step
from .genrequest import long_prompt, read_sequence
from .genseq import Sequence
from .genstats import GenerationStats, RequestTimes, RequestTokens
from .work import Array, WorkItem

log = logging.getLogger(__name__)

# How long the engine sleeps when it has work it cannot schedule yet (never expected:
# a lone sequence always fits), so it does not spin.
_IDLE_WAIT_S = 0.01


class GenerationScheduler:
    def __init__(self, model: LlmModel) -> None:
        self._model = model
        settings = model.settings
        self._limits = Limits(
            block_size=settings.kv_block_size,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            batching=settings.batching,
            prefix_caching=settings.enable_prefix_caching,
            priority=settings.scheduling_policy == "priority",
        )
        self.generation_stats = GenerationStats.for_engine(
            settings.kv_cache_blocks, settings.max_model_len
        )
        self._wake = threading.Condition()
        self._inbox: list[Sequence] = []
        self._running: list[Sequence] = []
        self._waiting: deque[Sequence] = deque()
        self._stopping = False
        self._closing = False
        # Requests in flight (the drain on close waits for them), and of them, how many were
        # handed to the engine, and how many left its queue for good: admitted for the first
        # time, or dropped before that. Each counter has one writer: the loop, the engine.
        self._pending = 0
        self._submitted = 0
        self._started = 0
        self._serial = 0
        self._drained: asyncio.Event | None = None
        # The LM head, read from the step graph on the first request with prompt_logprobs.
        self._head = LmHead(model.settings.step_model)
        # Built on the first request with `structured_outputs`, never at load.
        self._grammars = Grammars(model.tokenizer, model.runner.shape.vocab, model.eos_ids)
        self._thread = threading.Thread(target=self._loop, name=f"llm-{model.name}", daemon=True)
        self._thread.start()

    # --- the event loop's side ------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Requests not yet admitted by the engine (Triton's pending count, whose queue time
        ends there too); a generation that runs, or was preempted, is executing."""
        return self._submitted - self._started

    async def submit(self, item: WorkItem) -> dict[str, Array]:
        if self._closing:
            raise SchedulerClosed()
        context = item.context
        if context is None or context.responses is None:
            raise ServerError(
                ErrorCode.UNSUPPORTED, "a generative model answers through streaming endpoints only"
            )
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def on_done() -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
                loop.call_soon_threadsafe(_resolve, done)

        self._serial += 1
        timings = item.timings
        read = functools.partial(
            read_sequence,
            self._model,
            item.inputs,
            context.parameters,
            context.responses,
            self._serial,
            on_done,
            context.requested_outputs,
        )
        if long_prompt(item.inputs):
            seq = await asyncio.to_thread(read)  # tokenizing a long prompt takes a while
        else:
            seq = read()
        if seq.params.structured is not None:
            # Compiling (and, the first time, building the model's grammar tokenizer)
            # takes up to seconds: a worker thread, never the loop.
            seq.constraint = await self._constraint(seq.params.structured)
            seq.constraint.after = seq.params.structured_after
        if seq.prompt_logprobs is not None and self._head.weights is None:
            await asyncio.to_thread(self._head.load)  # a file read: never on the loop
        seq.timings = timings
        self._pending += 1
        self._submitted += 1
        if self._drained is None:
            self._drained = asyncio.Event()
        self._drained.clear()
        try:
            with self._wake:
                self._inbox.append(seq)
                self._wake.notify()
            try:
                await done
            except asyncio.CancelledError:
                self.cancel(seq)
                raise
            return {}
        finally:
            self._pending -= 1
            if self._pending == 0:
                self._drained.set()

    async def _constraint(self, structured: Structured) -> Constraint:
        try:
            return await self._grammars.compile(structured)
        except UnsupportedTokenizer as exc:
            raise ServerError(ErrorCode.UNSUPPORTED, str(exc)) from None
        except ValueError as exc:
            raise invalid_arg(str(exc)) from None

    def cancel(self, seq: Sequence) -> None:
        """The client has gone: the engine drops the sequence at the next step boundary."""
        seq.cancelled = True
        with self._wake:
            self._wake.notify()

    async def close(self, drain_timeout_s: float) -> None:
        """Refuse new requests, let those in flight finish within the timeout, then stop
        the engine (what is left gets UNAVAILABLE)."""
        self._closing = True
        if self._pending and self._drained is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), drain_timeout_s)
        with self._wake:
            self._stopping = True
            self._wake.notify()
        await asyncio.to_thread(self._thread.join)
        self._grammars.close()
        await asyncio.to_thread(self._model.close)

    # --- the engine thread ----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            try:
                if not self._next_step():
                    break
            except Exception as exc:
                # A fault in the engine itself: fail what it holds, keep serving.
                log.exception("model '%s': the generation engine failed", self._model.name)
                failed = ModelError(ErrorCode.INTERNAL.value, f"generation failed: {exc}")
                self._end_all(failed, "error")
        self._end_all(ModelError(ErrorCode.UNAVAILABLE.value, "the model was unloaded"), "abort")

    def _end_all(self, error: ModelError, reason: str) -> None:
        """Answer every sequence the engine holds with `error`, free its blocks, and count
        it as finished for `reason` (vLLM's: `error` for a fault, `abort` at unload)."""
        with self._wake:
            left = [*self._inbox, *self._waiting, *self._running]
            self._inbox.clear()
        self._waiting.clear()
        self._running.clear()
        allocator = self._model.runner.pool.allocator
        for seq in left:
            if seq.scheduled_s is None:
                self._started += 1
            allocator.release(seq.blocks)
            if not seq.cancelled:
                seq.sink.send(None, error, True)
            self.generation_stats.finished["abort" if seq.cancelled else reason] += 1
            seq.on_done()
        stats = self.generation_stats
        stats.running = stats.waiting = 0
        stats.kv_blocks_used = allocator.used

    def _next_step(self) -> bool:
        """One iteration; False once the engine stops."""
        with self._wake:
            while not (self._inbox or self._running or self._waiting or self._stopping):
                self._wake.wait()
            if self._stopping:
                return False
            # Taken under the lock that submit() waits for, ordered into the queue after.
            inbox, self._inbox = self._inbox, []
        enqueue(self._waiting, inbox, self._limits)
        self._drop_cancelled()
        allocator = self._model.runner.pool.allocator
        plan = plan_step(self._running, self._waiting, allocator, self._limits)
        stats = self.generation_stats
        stats.preemptions += len(plan.preempted)
        now = time.monotonic()
        for seq in plan.admitted:
            if seq.admit(now):
                self._started += 1
                stats.prompt_tokens += seq.prompt_len
                stats.queue.observe(now - seq.arrival_s)
            if self._limits.prefix_caching:
                # Admission shared what it could: `computed` is the tokens found.
                stats.prefix_cache_queries += len(seq.tokens)
                stats.prefix_cache_hits += seq.computed
        if plan.empty:
            with self._wake:
                self._wake.wait(_IDLE_WAIT_S)
        else:
            self._execute(plan)
        stats.running = len(self._running)
        stats.waiting = len(self._waiting) + len(self._inbox)
        stats.kv_blocks_used = allocator.used
        return True

    def _drop_cancelled(self) -> None:
        if not any(s.cancelled for s in self._running) and not any(
            s.cancelled for s in self._waiting
        ):
            return
        allocator = self._model.runner.pool.allocator
        for group in (self._running, self._waiting):
            for seq in [s for s in group if s.cancelled]:
                if seq.scheduled_s is None:
                    self._started += 1
                group.remove(seq)
                allocator.release(seq.blocks)
                seq.finish_reason = "abort"
                self.generation_stats.finished["abort"] += 1
                seq.on_done()

    def _execute(self, plan: StepPlan) -> None:
        started = time.perf_counter()
        runner = self._model.runner
        graph = 0.0
        # Tokens sampled this step: vLLM's tokens per iteration count them beside the
        # prompt tokens computed (the token a finished prefill samples included).
        sampled = 0
        try:
            # Decode rows and prefill chunks in one call: one pass over the weights.
            decode = [RowWork(s.tokens[s.computed :], s.computed, s.blocks) for s in plan.decode]
            prefill = [
                RowWork(s.tokens[s.computed : s.computed + n], s.computed, s.blocks)
                for s, n in plan.prefill
            ]
            # Every prefill token's hidden state, only where a row wants its prompt's
            # log probabilities (one attribute per prefill row otherwise).
            hidden = any(not s.may_share for s, _ in plan.prefill)
            logits = runner.run(decode, prefill, hidden) if hidden else runner.run(decode, prefill)
            graph += runner.last_graph_s
            if len(logits) != len(decode) + len(prefill):
                raise RuntimeError(
                    f"the step returned {len(logits)} rows for {len(decode) + len(prefill)}"
                )
            if self._limits.prefix_caching:
                self._remember([*plan.decode, *(s for s, _ in plan.prefill)], plan.prefill)
        except Exception as exc:
            log.exception("model '%s': a generation step failed", self._model.name)
            self._fail([*plan.decode, *(s for s, _ in plan.prefill)], "generation step", exc)
        else:
            for seq, row in zip(plan.decode, logits[: len(decode)], strict=True):
                seq.computed += 1
                self._advance_one(seq, row)
            sampled = len(plan.decode)
            token = len(decode)  # the first prefill token's row in `runner.last_hidden`
            for (seq, n), row in zip(plan.prefill, logits[len(decode) :], strict=True):
                first, token = token, token + n
                if not seq.may_share and not self._prompt_rows(seq, first, n):
                    continue
                seq.computed += n
                if seq.remaining == 0:
                    self._advance_one(seq, row)
                    sampled += 1
        stats = self.generation_stats
        stats.step_tokens.observe(sampled + sum(n for _, n in plan.prefill))
        stats.steps += 1
        stats.graph_seconds += graph
        stats.step_seconds += time.perf_counter() - started

    def _remember(self, seqs: list[Sequence], prefill: list[tuple[Sequence, int]]) -> None:
        """Offer the blocks this step filled for prefix sharing (before `computed` moves:
        a decode row computed 1 token, a prefill row n). The blocks below `computed` were
        offered by the steps that computed them (or shared from another sequence)."""
        size = self._limits.block_size
        allocator = self._model.runner.pool.allocator
        counts = {id(s): n for s, n in prefill}
        for seq in seqs:
            start = seq.computed // size
            full = (seq.computed + counts.get(id(seq), 1)) // size
            if full > start:
                allocator.remember(seq.blocks, seq.tokens, size, start, full)

    def _prompt_rows(self, seq: Sequence, token: int, n: int) -> bool:
        """The prompt entries of `seq`'s chunk (its n tokens from row `token` of the
        step's hidden states); False, the sequence failed alone, should that fail."""
        hidden, head = self._model.runner.last_hidden, self._head
        try:
            if hidden is None or head.weights is None:
                raise RuntimeError("the step gave no hidden states")
            assert seq.prompt_logprobs is not None
            rows = hidden[token : token + n]
            seq.prompt_logprobs.add(rows, seq.computed, seq.tokens, seq.prompt_len, head)
        except Exception as exc:
            log.exception("model '%s': a prompt's log probabilities failed", self._model.name)
            self._fail([seq], "prompt_logprobs", exc)
            return False
        return True

    def _advance_one(self, seq: Sequence, logits: npt.NDArray[np.float32]) -> None:
        """`_advance`, failing only this sequence should its own sampling or text fail:
        the step's other sequences are not its client's doing."""
        try:
            self._advance(seq, logits)
        except GrammarFailed as exc:
            # The request's grammar, not the engine: its client is told why, no trace.
            log.warning("model '%s': %s", self._model.name, exc)
            self._fail([seq], "sampling", exc, ErrorCode.INVALID_ARG)
        except Exception as exc:
            log.exception("model '%s': a sequence's next token failed", self._model.name)
            self._fail([seq], "sampling", exc)

    def _fail(
        self,
        seqs: list[Sequence],
        what: str,
        exc: Exception,
        code: ErrorCode = ErrorCode.INTERNAL,
    ) -> None:
        error = ModelError(code.value, f"{what} failed: {exc}")
        for seq in seqs:
            if seq in self._running:
                self._leave(seq)
                if not seq.cancelled:  # its client has gone: nobody to tell, and aborted
                    seq.sink.send(None, error, True)
                self.generation_stats.finished["abort" if seq.cancelled else "error"] += 1
                seq.on_done()

    def _advance(self, seq: Sequence, logits: npt.NDArray[np.float32]) -> None:
        """Sample the sequence's next token and tell its client what it adds."""
        params = seq.params
        eos = self._model.eos_ids
        banned: tuple[int, ...] = ()
        if seq.generated < params.min_tokens:
            # vLLM's MinTokensLogitsProcessor bans every stop id, EOS included whatever
            # ignore_eos says (its all_stop_token_ids hold the EOS either way).
            banned = tuple(eos) + params.stop_token_ids
        # A grammar still waiting for its `structured_outputs_after` text masks nothing.
        constraint = None if seq.constraint is None or seq.constraint.after else seq.constraint
        forced = None  # thinking_token_budget (thinking.py); a grammar that applies rules
        if seq.thinking is not None and constraint is None:
            forced = seq.thinking.forced(seq.tokens)
        if forced is not None:
            token = forced  # vLLM's: every other token masked, whatever else holds it off
        elif seq.processor is None and constraint is None:
            token = seq.sampler.sample(logits, banned)
        else:
            row = logits
            if seq.processor is not None:
                row = seq.processor.apply(logits, seq.tokens, seq.prompt_len, banned)
                banned = ()
            # The grammar says itself when its mask leaves nothing; a processor's -inf
            # (bad words over allowed_token_ids) shows only in the row.
            allowed = row if constraint is None else constraint.allowed(row, banned)
            if allowed is None or (seq.processor is not None and nothing_possible(allowed)):
                # Nothing the request allows is left (allowed_token_ids all banned, a
                # complete grammar's EOS held off by min_tokens): the answer ends here
                # rather than sample a token the request ruled out.
                self._end_unsampled(seq)
                return
            token = seq.sampler.sample(allowed)
            if constraint is not None:
                constraint.accept(token)
        if seq.logprobs is not None:  # asked for: all the cost is the asker's
            seq.logprobs.add(logits, token)
        seq.tokens.append(token)
        now = time.monotonic()
        stats = self.generation_stats
        stats.generation_tokens += 1
        if seq.first_token_s is None:
            seq.first_token_s = now
            stats.ttft.observe(now - seq.arrival_s)
        else:
            stats.inter_token.observe(now - seq.last_token_s)
        seq.last_token_s = now
        reason: str | None = None
        delta = ""
        # vLLM's `stop_reason`: the stop token id that ended the answer (EOS ids but one).
        stop: int | None = None
        ends = token in eos and not params.ignore_eos
        if ends or token in params.stop_token_ids:
            reason, stop = "stop", None if ends and token == self._model.eos_id else token
        else:
            # vLLM's: no stop string ends within the first min_tokens tokens.
            text = seq.detokenizer.add(token)
            if seq.constraint is not None:
                seq.constraint.see(text)
            delta = seq.stops.add(text, seq.generated > params.min_tokens)
            if seq.stops.stopped:
                reason = "stop"
        if reason is None and seq.generated >= seq.max_tokens:
            reason = "length"
        if reason is None:
            if seq.stream:  # every token, its text held back or not, as vLLM's outputs
                seq.sink.send(seq.response(delta, False, seq.new_ids()), None, False)
            elif delta:
                seq.answer.append(delta)
            return
        if not seq.stops.stopped:
            delta += seq.stops.add(seq.detokenizer.flush(), seq.generated > params.min_tokens)
            delta += seq.stops.finish()
        self._finish(seq, reason, delta, stop)

    def _end_unsampled(self, seq: Sequence) -> None:
        """No token the request allows is left: the answer ends "stop" as it is, for this
        request alone (vLLM samples from a row of -inf there and fails the request)."""
        if seq.first_token_s is None:
            seq.last_token_s = time.monotonic()
        delta = seq.stops.add(seq.detokenizer.flush(), seq.generated > seq.params.min_tokens)
        self._finish(seq, "stop", delta + seq.stops.finish())

    def _finish(self, seq: Sequence, reason: str, delta: str, stop: int | None = None) -> None:
        """The last response; a stop token id or stop string that ended it goes with it as
        the response parameter `stop_reason` (the /v1 answers' vLLM field)."""
        self._leave(seq)
        seq.finish_reason = reason
        # For statistics, before the last response lets the core count the request:
        # waiting for a place, then generating (first prefill to last token).
        scheduled = seq.scheduled_s or seq.arrival_s
        seq.timings.queue_ns = int((scheduled - seq.arrival_s) * 1e9)
        seq.timings.compute_infer_ns = int(max(seq.last_token_s - scheduled, 0.0) * 1e9)
        # One execution of batch 1, as Triton's Python backend counts a vLLM model's
        # execute call: the engine's steps are shared by whatever runs, so they are no
        # request's execution.
        seq.timings.batch_size, seq.timings.first_in_batch = 1, True
        text = delta if seq.stream else seq.echo + "".join(seq.answer) + delta
        found = stop if stop is not None or reason != "stop" else seq.stops.matched
        extra = None if found is None else {"stop_reason": found}
        seq.sink.send(seq.response(text, True, seq.new_ids()), None, True, extra)
        first = seq.first_token_s if seq.first_token_s is not None else seq.last_token_s
        self.generation_stats.request_finished(
            reason,
            RequestTimes(seq.arrival_s, scheduled, first, time.monotonic()),
            RequestTokens(seq.prompt_len, seq.generated, seq.max_tokens, seq.preemptions),
        )
        seq.on_done()

    def _leave(self, seq: Sequence) -> None:
        if seq in self._running:
            self._running.remove(seq)
        self._model.runner.pool.allocator.release(seq.blocks)


def _resolve(done: asyncio.Future[None]) -> None:
    if not done.done():
        done.set_result(None)
