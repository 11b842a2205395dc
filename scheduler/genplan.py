"""The engine's scheduling decisions for one iteration, apart from running them.

Every iteration computes one token for each running sequence that is decoding, and
prefills a bounded chunk for sequences that are not (chunked prefill), so a long prompt
delays the running sequences' next tokens by at most one chunk of work:
`max_num_batched_tokens` bounds the prefill, counted padded (rows x the longest chunk),
as that is what the step graph computes.

Admission by batching mode: `iteration` admits waiting sequences at every step boundary
while fewer than `max_num_seqs` hold blocks; `request` admits only when nothing is
running (a batch runs until its longest member ends, request-level batching); `none`
runs one sequence at a time. A waiting sequence is admitted only if its first chunk's
blocks are free, and the blocks its whole prompt takes too, beside what the prompts of
the running sequences still need; it never preempts a running one.

When a running sequence needs a block and none is free, the newest running sequence is
preempted (its blocks freed, recomputed later; vLLM's recompute policy): the oldest keep
going, and the preempted one goes back to the front of the queue. A sequence alone always
fits (the load checks that the pool holds max_model_len), so the oldest sequence always
progresses: never an out-of-memory failure, never a lost request.

That is vLLM's `fcfs` policy. Under `priority` (Limits.priority) the waiting queue is kept
ordered by `rank` (the request's priority, lower first, then arrival), new and preempted
sequences alike, and the victim is the running sequence of the largest rank (vLLM's
`max(running, key=(priority, arrival))`), which may be the one that needs the block.

With prefix caching, an admitted sequence first shares the cached blocks that already hold
its prompt's first full blocks, and prefills from there.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ge_serve.backends.llm.kvcache import BlockAllocator, blocks_for

from .genseq import Sequence


@dataclass(frozen=True, slots=True)
class Limits:
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    batching: str
    # Share the cached full blocks of a prefix with a new sequence (kvcache.py).
    prefix_caching: bool = False
    # vLLM's scheduling policy "priority" (else "fcfs"): see the module's docstring.
    priority: bool = False


@dataclass(slots=True)
class StepPlan:
    decode: list[Sequence] = field(default_factory=list)
    # Each prefilling sequence with the number of tokens it computes this step.
    prefill: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    admitted: list[Sequence] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill


def plan_step(
    running: list[Sequence], waiting: deque[Sequence], allocator: BlockAllocator, limits: Limits
) -> StepPlan:
    """Decide this iteration, taking and freeing blocks as decided. `running` (ordered
    oldest first) and `waiting` are updated in place: preempted sequences move from
    running to waiting (its front, or by rank under `priority`), admitted ones from
    waiting to running."""
    plan = StepPlan()
    for seq in list(running):
        if seq.remaining != 1 or seq not in running:
            continue
        if _grow(seq, seq.computed + 1, running, waiting, allocator, limits, plan):
            plan.decode.append(seq)
    budget = limits.max_num_batched_tokens
    q = 0
    for seq in list(running):
        if seq.remaining <= 1 or seq not in running:
            continue
        chunk = _chunk(seq, len(plan.prefill), q, budget)
        if chunk and _grow(seq, seq.computed + chunk, running, waiting, allocator, limits, plan):
            plan.prefill.append((seq, chunk))
            q = max(q, chunk)
    started_empty = not running
    size = limits.block_size
    # Blocks the running sequences' prompts still need, to the end of their prefill
    # (counted only when a sequence waits: most steps have none).
    promised = (
        sum(blocks_for(len(s.tokens), size) - len(s.blocks) for s in running if s.remaining > 1)
        if waiting
        else 0
    )
    while waiting and _may_admit(limits, len(running), started_empty):
        seq = waiting[0]
        if limits.prefix_caching and not seq.blocks and seq.may_share:
            # Never the whole prompt: its last token is computed, for the logits.
            seq.blocks.extend(allocator.share(seq.tokens, size, (len(seq.tokens) - 1) // size))
            seq.computed = len(seq.blocks) * size
        chunk = _chunk(seq, len(plan.prefill), q, budget)
        whole = blocks_for(len(seq.tokens), size) - len(seq.blocks)
        more = blocks_for(seq.computed + chunk, size) - len(seq.blocks)
        # Only a prompt whose whole prefill fits beside those of the running ones comes
        # in (vLLM's rule). Let in on its first chunk alone, a long prompt next to another
        # preempted itself at a later chunk and was computed again, over and over, each
        # time inside the steps of the sequences running, so that two together took far
        # longer than one after the other. A sequence alone always fits (the load checks
        # the pool holds max_model_len).
        fits = not running or allocator.free - promised >= whole
        taken = allocator.allocate(more) if chunk and fits else None
        if taken is None:
            allocator.release(seq.blocks)
            seq.computed = 0
            break
        promised += whole - more
        seq.blocks.extend(taken)
        waiting.popleft()
        running.append(seq)
        plan.admitted.append(seq)
        plan.prefill.append((seq, chunk))
        q = max(q, chunk)
    return plan


def rank(seq: Sequence) -> tuple[int, float, int]:
    """A sequence's place under the `priority` policy, lowest first: vLLM's Request order
    (priority, then arrival; the serial, for arrivals at the same instant)."""
    return seq.params.priority, seq.arrival_s, seq.serial


def enqueue(waiting: deque[Sequence], new: Iterable[Sequence], limits: Limits) -> None:
    """New sequences into the waiting queue: at its end, or by rank under `priority`:
    the batch sorted once and merged into the queue in one pass (an insert per sequence
    into the deque cost a pass each: a burst of 50k took 0.6 s), or, where it all ranks
    after the queue (arrivals of one priority), appended."""
    if not limits.priority:
        waiting.extend(new)
        return
    batch = sorted(new, key=rank)
    if not batch:
        return
    if not waiting or rank(waiting[-1]) <= rank(batch[0]):
        waiting.extend(batch)
        return
    merged = list(heapq.merge(waiting, batch, key=rank))
    waiting.clear()
    waiting.extend(merged)


def _may_admit(limits: Limits, running: int, started_empty: bool) -> bool:
    if limits.batching == "none":
        return running == 0
    if limits.batching == "request":
        return started_empty and running < limits.max_num_seqs
    return running < limits.max_num_seqs


def _chunk(seq: Sequence, rows: int, q: int, budget: int) -> int:
    """Tokens this sequence may prefill now, with `rows` rows of longest chunk `q`
    already planned: 0 when it does not fit the budget."""
    if rows == 0:
        return min(seq.remaining, budget)
    chunk = min(seq.remaining, q)
    if (rows + 1) * max(q, chunk) > budget:
        return 0
    return chunk


def _grow(
    seq: Sequence,
    tokens: int,
    running: list[Sequence],
    waiting: deque[Sequence],
    allocator: BlockAllocator,
    limits: Limits,
    plan: StepPlan,
) -> bool:
    """Give `seq` blocks for `tokens` tokens, preempting the newest (under `priority`, the
    largest-ranked) running sequences while none are free; False when `seq` itself was
    preempted."""
    more = blocks_for(tokens, limits.block_size) - len(seq.blocks)
    while True:
        taken = allocator.allocate(more)
        if taken is not None:
            seq.blocks.extend(taken)
            return True
        victim = max(running, key=rank) if limits.priority else running[-1]
        preempt(victim, running, waiting, allocator, plan, limits.priority)
        if victim is seq:
            return False


def preempt(
    seq: Sequence,
    running: list[Sequence],
    waiting: deque[Sequence],
    allocator: BlockAllocator,
    plan: StepPlan,
    ranked: bool = False,
) -> None:
    """Free `seq`'s blocks and put it back in the queue: at its front, or by rank where
    `ranked` (the `priority` policy)."""
    running.remove(seq)
    allocator.release(seq.blocks)
    seq.computed = 0
    seq.preemptions += 1
    if ranked:
        bisect.insort(waiting, seq, key=rank)
    else:
        waiting.appendleft(seq)
    plan.preempted.append(seq)
    if seq in plan.decode:
        plan.decode.remove(seq)
    plan.prefill = [(s, n) for s, n in plan.prefill if s is not seq]
