"""Prefix caching in the block allocator and at admission: a new sequence shares the cached
full blocks that hold its prompt's first tokens (at the same positions, after the same
prefix), never its whole prompt; a shared block is freed by its last holder only, and a
released cached block stays findable until the allocator evicts it (least recently
released first, after the never-cached free blocks)."""

from __future__ import annotations

import functools
from collections import deque
from pathlib import Path

import llmrepo
import numpy as np
from engineseqs import sequence as seq
from google.protobuf import text_format
from polling import poll
from recording_sink import RecordingSink

from ge_serve.backends.base import ModelSpec, RequestContext
from ge_serve.backends.llm.backend import MODEL_KEY, LlmBackend
from ge_serve.backends.llm.kvcache import BlockAllocator
from ge_serve.protos.model_config_pb2 import ModelConfig
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.genplan import Limits, StepPlan, plan_step, preempt
from ge_serve.scheduler.genseq import Sequence
from ge_serve.scheduler.work import WorkItem

SIZE = 4


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
    blocks = list(first)
    allocator.release(first)
    assert allocator.used == 2  # the shared two stay with their other holder
    again = allocator.share([*range(8), 99, 99, 99, 99], SIZE, 3)
    assert again == shared  # and can be shared again
    allocator.release(shared)
    assert allocator.used == 2
    allocator.release(again)
    assert allocator.used == 0 and allocator.free == 8
    # Released, but still cached: found again, all three (vLLM's free block queue).
    assert allocator.share(list(range(12)), SIZE, 3) == blocks
    assert allocator.used == 3


def test_a_released_block_is_found_again_until_evicted_least_recent_first() -> None:
    allocator = BlockAllocator(4)
    one = held([1] * SIZE, allocator)
    two = held([2] * SIZE, allocator)
    one_block, two_block = list(one), list(two)
    allocator.release(one)
    allocator.release(two)
    assert allocator.used == 0 and allocator.free == 4 and allocator.cached == 2
    # The two never-cached free blocks go first, then the least recently released.
    plain = allocator.allocate(2)
    assert plain is not None and not set(plain) & {*one_block, *two_block}
    assert allocator.allocate(1) == one_block and allocator.cached == 1
    assert allocator.share([1] * SIZE + [0], SIZE, 1) == []  # evicted: forgotten
    assert allocator.share([2] * SIZE + [0], SIZE, 1) == two_block
    assert allocator.free == 0 and allocator.allocate(1) is None


def test_a_revived_block_is_no_longer_evictable() -> None:
    allocator = BlockAllocator(2)
    first = held([1] * SIZE, allocator)
    block = list(first)
    allocator.release(first)
    revived = allocator.share([1] * SIZE + [0], SIZE, 1)
    assert revived == block and allocator.used == 1 and allocator.free == 1
    taken = allocator.allocate(1)
    assert taken is not None and taken != block
    assert allocator.allocate(1) is None  # the revived block is held, not taken
    allocator.release(revived)
    assert allocator.allocate(1) == block  # evictable again once released


def test_an_evicted_parents_reused_id_never_matches_a_child_on_another_prefix() -> None:
    # A child keyed on its parent's block id would match here: the parent is evicted and
    # its block reused for other content while the child stays cached.
    allocator = BlockAllocator(3)
    parent, child = held([1] * SIZE + [2] * SIZE, allocator)
    allocator.release([parent])  # released first: evicted first
    allocator.release([child])
    taken = allocator.allocate(2)  # the plain free block, then the parent
    assert taken is not None and taken[1] == parent and allocator.cached == 1
    allocator.remember([parent], [7] * SIZE, SIZE, 0, 1)  # its id, other content
    assert allocator.share([7] * SIZE + [2] * SIZE + [0], SIZE, 2) == [parent]
    assert allocator.cached == 2  # the child is still cached, but under its own prefix


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
    # Preempted, and re-admitted without sharing: it computes the whole prompt again.
    allocator.release(holder)
    preempt(newcomer, running, waiting, allocator, StepPlan())
    plan = plan_step(running, waiting, allocator, limits(caching=False))
    assert plan.admitted == [newcomer] and newcomer.computed == 0
    assert not newcomer.admit(2.0) and newcomer.scheduled_s == 1.0
    # What its responses say (num_cached_tokens): the first admission's 8.
    assert newcomer.response("", True, [7])["num_cached_tokens"].tolist() == [8]


def engine(folder: Path, caching: bool) -> GenerationScheduler:
    """The tiny model's engine, its config auto-completed (`num_cached_tokens` opt-in)."""
    found = llmrepo.write_tiny_llm(
        folder, "m", {"enable_prefix_caching": str(caching).lower()}, interface=False
    )
    config = text_format.Parse((found / "config.pbtxt").read_text(), ModelConfig())
    backend = LlmBackend(None)
    backend.autocomplete(config, found)
    loaded = backend.load(ModelSpec("m", 1, config, found, found / "1" / "model.onnx"))
    return GenerationScheduler(loaded.extra[MODEL_KEY])


async def ask(scheduler: GenerationScheduler, prompt: str) -> RecordingSink:
    """The greedy answer to `prompt`, once finished."""
    sink = RecordingSink()
    inputs = {
        "text_input": np.array([prompt.encode()], dtype=object),
        "max_tokens": np.array([10], np.int32),
        "return_num_cached_tokens": np.array([True]),
        "sampling_parameters": np.array([b'{"temperature": 0, "ignore_eos": true}'], dtype=object),
    }
    await scheduler.submit(WorkItem(inputs, 1, context=RequestContext(responses=sink)))
    return sink


def text_of(sink: RecordingSink) -> str:
    return "".join(r["text_output"][0].decode() for r in sink.responses)


def cached_of(sink: RecordingSink) -> int:
    """The prompt tokens the last response says were found cached."""
    return int(sink.responses[-1]["num_cached_tokens"][0])


def all_free(scheduler: GenerationScheduler) -> bool:
    return scheduler.generation_stats.kv_blocks_used == 0


async def test_a_finished_requests_prompt_is_served_from_the_cache(tmp_path: Path) -> None:
    prompt = "You are a helpful assistant. Say something: "  # 44 tokens, a byte each
    answers: dict[bool, list[RecordingSink]] = {}
    for caching in (True, False):
        scheduler = engine(tmp_path / str(caching), caching)
        try:
            # One after the other: the first has released its blocks when the second comes.
            answers[caching] = [await ask(scheduler, prompt) for _ in range(2)]
            # Released cached blocks count as free. The gauge is set when the step that
            # sent the last response ends, just after that response.
            poll(functools.partial(all_free, scheduler), 5, "the engine's blocks all free")
        finally:
            await scheduler.close(1)
    cached, plain = answers[True], answers[False]
    assert not any(a.errors for a in (*cached, *plain))
    texts = {text_of(a) for a in (*cached, *plain)}
    assert texts == {text_of(plain[0])} != {""}  # greedy, same
    full = len(prompt) // llmrepo.BLOCK_SIZE * llmrepo.BLOCK_SIZE
    assert [cached_of(a) for a in cached] == [0, full] and full > 0
    assert [cached_of(a) for a in plain] == [0, 0]  # without prefix caching, none
