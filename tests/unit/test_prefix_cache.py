"""Prefix caching in the block allocator and at admission: a new sequence shares the held
full blocks that hold its prompt's first tokens (at the same positions, after the same
prefix), never its whole prompt, and a shared block is freed by its last holder only."""

from __future__ import annotations

from collections import deque
from typing import Any

from ge_serve.backends.llm.kvcache import BlockAllocator
from ge_serve.backends.llm.sampling import Sampler, SamplingParams
from ge_serve.backends.llm.text import StopStrings
from ge_serve.scheduler.genplan import Limits, StepPlan, plan_step, preempt
from ge_serve.scheduler.genseq import Sequence

SIZE = 4


def seq(serial: int, tokens: list[int]) -> Sequence:
    params = SamplingParams(max_tokens=8, temperature=0.0)
    none: Any = None
    return Sequence(
        serial=serial, tokens=list(tokens), prompt_len=len(tokens), max_tokens=8,
        params=params, sampler=Sampler(params), detokenizer=none, stops=StopStrings(()),
        sink=none, stream=False, echo="", arrival_s=float(serial), on_done=lambda: None,
    )  # fmt: skip


def limits(caching: bool = True, tokens: int = 64) -> Limits:
    return Limits(block_size=SIZE, max_num_seqs=8, max_num_batched_tokens=tokens,
                  batching="iteration", prefix_caching=caching)  # fmt: skip


def held(tokens: list[int], allocator: BlockAllocator) -> list[int]:
    """A sequence's blocks holding `tokens`, all full and remembered."""
    blocks = allocator.allocate(len(tokens) // SIZE)
    assert blocks is not None
    allocator.remember(blocks, tokens, SIZE, 0, len(blocks))
    return blocks


def test_full_blocks_of_the_same_prefix_are_shared_and_freed_by_the_last_holder() -> None:
    allocator = BlockAllocator(8)
    first = held(list(range(12)), allocator)
    shared = allocator.share([0, 1, 2, 3, 4, 5, 6, 7, 99, 99, 99, 99], SIZE, 3)
    assert shared == first[:2] and allocator.used == 3
    allocator.release(first)
    assert allocator.used == 2  # the shared two stay with their other holder
    again = allocator.share(list(range(12)), SIZE, 3)
    assert again == shared  # and can be shared again
    allocator.release(shared)
    assert allocator.used == 2
    allocator.release(again)
    assert allocator.used == 0
    assert allocator.share(list(range(12)), SIZE, 3) == []  # forgotten once free


def test_a_block_is_shared_only_after_the_same_prefix() -> None:
    allocator = BlockAllocator(8)
    held(list(range(8)), allocator)
    # The same tokens as the first's second block, but after another first block.
    assert allocator.share([9, 9, 9, 9, 4, 5, 6, 7, 1], SIZE, 2) == []


def test_admission_shares_the_prompt_prefix_but_computes_its_last_token() -> None:
    allocator = BlockAllocator(32)
    running = seq(0, list(range(10)))
    running.blocks = held(list(range(8)), allocator) + (allocator.allocate(1) or [])
    running.computed = 10
    same_start = seq(1, [*range(8), 50, 51])
    whole = seq(2, list(range(8)))
    waiting = deque([same_start, whole])
    plan = plan_step([running], waiting, allocator, limits())
    # What is left to prefill: 2 tokens, and 4 (cut to the batch's chunk of 2).
    assert [(s.serial, n) for s, n in plan.prefill] == [(1, 2), (2, 2)]
    assert same_start.blocks[:2] == running.blocks[:2] and same_start.computed == 8
    # A prompt of exactly two shared blocks shares one: its last token is computed again.
    assert whole.blocks[:1] == running.blocks[:1] and whole.computed == 4
    assert allocator.used == 3 + 1 + 1  # each newcomer took one block of its own


def test_without_prefix_caching_nothing_is_shared() -> None:
    allocator = BlockAllocator(32)
    running = seq(0, list(range(8)))
    running.blocks = held(list(range(8)), allocator)
    newcomer = seq(1, [*range(8), 50])
    plan = plan_step([], deque([newcomer]), allocator, limits(caching=False))
    assert plan.prefill == [(newcomer, 9)] and newcomer.computed == 0
    assert not set(newcomer.blocks) & set(running.blocks)


def test_a_sequence_that_cannot_be_admitted_gives_its_shared_blocks_back() -> None:
    allocator = BlockAllocator(3)
    running = seq(0, list(range(8)))
    running.blocks = held(list(range(8)), allocator)
    newcomer = seq(1, [*range(8), *range(50, 59)])  # needs 3 more blocks, 1 is free
    waiting = deque([newcomer])
    plan = plan_step([running], waiting, allocator, limits())
    assert not plan.admitted and list(waiting) == [newcomer]
    assert newcomer.blocks == [] and newcomer.computed == 0 and allocator.used == 2


def test_a_readmitted_sequence_keeps_its_first_admissions_cached_tokens() -> None:
    allocator = BlockAllocator(8)
    holder = held(list(range(8)), allocator)
    newcomer = seq(1, [*range(8), 50])
    newcomer.send_cached = True
    waiting, running = deque([newcomer]), list[Sequence]()
    plan = plan_step(running, waiting, allocator, limits())
    assert plan.admitted == [newcomer] and newcomer.admit(1.0)
    newcomer.computed, newcomer.tokens = 9, [*newcomer.tokens, 7]  # prefilled, sampled
    # Preempted once the blocks it shared are its alone: freed and forgotten, so its
    # re-admission shares nothing and computes the whole prompt again.
    allocator.release(holder)
    preempt(newcomer, running, waiting, allocator, StepPlan())
    plan = plan_step(running, waiting, allocator, limits())
    assert plan.admitted == [newcomer] and newcomer.computed == 0
    assert not newcomer.admit(2.0) and newcomer.scheduled_s == 1.0
    # What its responses say (num_cached_tokens): the first admission's 8.
    assert newcomer.response("", True, [7])["num_cached_tokens"].tolist() == [8]
