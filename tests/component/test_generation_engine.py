"""The generation engine in process: the tiny model (tests/llmrepo.py) loaded by the `llm`
backend and driven by its GenerationScheduler, with a recording sink in place of the
core's. Each batching mode gives the reference's answers; `none` runs one sequence at a
time and `request` admits a new batch only when the last one has finished, while
`iteration` lets a newcomer in at once. Unloading with requests in flight answers them
UNAVAILABLE."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_reference
import llmrepo
import numpy as np
import pytest
import smollm
from google.protobuf import text_format

from ge_serve.backends.base import ModelError, ModelSpec, RequestContext
from ge_serve.backends.ge.acl_sim import SimRuntime
from ge_serve.backends.ge.backend import GeBackend
from ge_serve.backends.ge.sim_cost import parse_sim_cost
from ge_serve.backends.llm.backend import MODEL_KEY, LlmBackend
from ge_serve.backends.llm.sampler import Sampler
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler import genrequest
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

PROMPTS = [f"Prompt {i}: " + "xyz"[: 1 + i % 3] for i in range(6)]
TOKENS = 12


@dataclass
class Recorder:
    """A ResponseSink that notes each response and when it came."""

    texts: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    errors: list[ModelError] = field(default_factory=list)
    final: bool = False
    # The engine's step count at each response (sent from within the step).
    steps: list[int] = field(default_factory=list)
    scheduler: GenerationScheduler | None = None

    def send(
        self,
        outputs: dict[str, Any] | None,
        error: ModelError | None,
        final: bool,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        self.times.append(time.monotonic())
        if self.scheduler is not None:
            self.steps.append(self.scheduler.generation_stats.steps)
        if outputs is not None:
            self.texts.append(outputs["text_output"][0].decode())
        if error is not None:
            self.errors.append(error)
        self.final = self.final or final


def engine(
    tmp_path: Path,
    ge: GeBackend | None = None,
    tokenizer: Any = None,
    model: llmrepo.TinyModel | None = None,
    **parameters: str,
) -> GenerationScheduler:
    folder = llmrepo.write_tiny_llm(tmp_path, "m", parameters, model)
    if tokenizer is not None:  # a `tokenizers` Tokenizer in place of the byte tokenizer
        tokenizer.save(str(folder / "1" / "tokenizer.json"))
    config = text_format.Parse(
        (folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    loaded = LlmBackend(ge).load(ModelSpec("m", 1, config, folder, folder / "1" / "model.onnx"))
    return GenerationScheduler(loaded.extra[MODEL_KEY])


@pytest.fixture
async def modes(tmp_path: Path) -> AsyncIterator[dict[str, GenerationScheduler]]:
    built = {
        mode: engine(tmp_path / mode, batching=mode, max_num_seqs="3")
        for mode in ("iteration", "request", "none")
    }
    yield built
    for scheduler in built.values():
        await scheduler.close(1)


async def ask(scheduler: GenerationScheduler, prompt: str, tokens: int = TOKENS) -> Recorder:
    sink = Recorder(scheduler=scheduler)
    inputs = {
        "text_input": np.array([prompt.encode()], dtype=object),
        "max_tokens": np.array([tokens], np.int32),
        "stream": np.array([True]),
        "sampling_parameters": np.array([b'{"temperature": 0, "ignore_eos": true}'], dtype=object),
    }
    await scheduler.submit(WorkItem(inputs, 1, context=RequestContext(responses=sink)))
    return sink


async def together(
    scheduler: GenerationScheduler, asks: list[Coroutine[Any, Any, Recorder]]
) -> list[Recorder]:
    """Run the requests so that the engine takes them all in one iteration: its wake-up
    lock (reentrant) is held on this thread while they are handed over."""
    wake = scheduler._wake  # white box: the batches must not depend on arrival timing
    with wake:
        tasks = [asyncio.ensure_future(a) for a in asks]
        for _ in range(10):
            await asyncio.sleep(0)
    return await asyncio.gather(*tasks)


def expected(prompt: str) -> str:
    return llmrepo.answer_text(llmrepo.reference_ids(prompt, TOKENS))


async def test_every_batching_mode_gives_the_reference_answers(
    modes: dict[str, GenerationScheduler],
) -> None:
    for mode, scheduler in modes.items():
        sinks = await asyncio.gather(*(ask(scheduler, p) for p in PROMPTS))
        for prompt, sink in zip(PROMPTS, sinks, strict=True):
            assert sink.final and not sink.errors, mode
            assert "".join(sink.texts) == expected(prompt), (mode, prompt)


async def test_none_runs_one_at_a_time_and_request_waits_for_its_batch(
    modes: dict[str, GenerationScheduler],
) -> None:
    alone = await asyncio.gather(*(ask(modes["none"], p) for p in PROMPTS[:3]))
    spans = sorted((s.times[0], s.times[-1]) for s in alone)
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1)), spans
    # The first of three running sequences ends early; the fourth waits for the whole
    # batch with request-level batching, and takes the freed place at once otherwise.
    lengths = [3, *([TOKENS] * (len(PROMPTS) - 1))]
    for mode in ("request", "iteration"):
        asks = [ask(modes[mode], p, n) for p, n in zip(PROMPTS, lengths, strict=True)]
        sinks = await together(modes[mode], asks)
        batch_end = max(s.times[-1] for s in sinks[:3])
        fourth_starts = sinks[3].times[0]
        if mode == "request":
            assert fourth_starts >= batch_end
        else:
            assert fourth_starts < batch_end


async def test_a_late_request_is_answered_within_its_prefill_and_one_step(
    tmp_path: Path,
) -> None:
    scheduler = engine(tmp_path, max_model_len="1024", kv_cache_blocks="512")
    try:
        running = [asyncio.ensure_future(ask(scheduler, f"Long {i}", 900)) for i in range(4)]
        stats = scheduler.generation_stats
        for _ in range(5000):  # until all four are decoding
            if stats.generation_tokens >= 4 * 5:
                break
            await asyncio.sleep(0.002)
        submitted_at = stats.steps
        late = await ask(scheduler, "Late", 1)
        # The step under way when it arrived, then the one that prefills it and samples
        # its token (the running ones decode in that same iteration).
        assert late.steps[-1] - submitted_at <= 2, (submitted_at, late.steps)
        assert not any(task.done() for task in running)
    finally:
        await scheduler.close(0)
    await asyncio.gather(*running)


async def test_unloading_answers_what_is_in_flight_unavailable(tmp_path: Path) -> None:
    scheduler = engine(tmp_path, max_model_len="1024", kv_cache_blocks="128")
    task = asyncio.ensure_future(ask(scheduler, "Long", 1000))
    await asyncio.sleep(0.05)  # the engine is generating (1000 tokens take far longer)
    await scheduler.close(0)
    sink = await task
    assert sink.final and [e.code for e in sink.errors] == ["UNAVAILABLE"]
    assert scheduler.generation_stats.kv_blocks_used == 0
    assert scheduler.generation_stats.finished["abort"] == 1
    # The weights and the KV cache go at the close, not when the version is collected
    # (a late reference can keep it: server/startup/gcheap.py).
    runner = scheduler._model.runner  # white box: nothing outside holds the runner
    assert runner.pool.keys == [] and runner.pool.values == []
    assert not hasattr(runner, "session")


async def test_pending_counts_only_requests_the_engine_has_not_admitted(tmp_path: Path) -> None:
    """Triton's pending count (nv_inference_pending_request_count, which autoscalers read):
    a generation that runs is executing; one queued behind it (one sequence at a time) is
    pending until the engine takes it."""
    scheduler = engine(tmp_path, max_num_seqs="1", max_model_len="1024", kv_cache_blocks="128")
    stats = scheduler.generation_stats

    async def until(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, f"gave up waiting for {what}"
            await asyncio.sleep(0.01)

    try:
        first = asyncio.ensure_future(ask(scheduler, "First", 1000))
        await until(lambda: stats.running == 1, "the first to run")
        assert scheduler.pending == 0
        second = asyncio.ensure_future(ask(scheduler, "Second", 4))
        await until(lambda: stats.waiting == 1, "the second to queue")
        assert scheduler.pending == 1
        first.cancel()  # its client leaves: the second runs, and finishes
        assert (await second).final
        assert scheduler.pending == 0
    finally:
        await scheduler.close(1)


async def test_on_the_simulated_npu_answers_equal_the_reference(tmp_path: Path) -> None:
    executions: list[int] = []
    runtime = SimRuntime(
        on_execute=lambda device, model: executions.append(device),
        cost=parse_sim_cost("default"),  # steps priced by the step profile
    )
    try:
        scheduler = engine(
            tmp_path,
            GeBackend(runtime),
            placement="npu",
            max_num_seqs="4",
            max_num_batched_tokens="32",
            npu_chunk_gears="8,32",
        )
        try:
            sinks = await together(scheduler, [ask(scheduler, p) for p in PROMPTS])
        finally:
            await scheduler.close(1)
        for prompt, sink in zip(PROMPTS, sinks, strict=True):
            assert sink.final and not sink.errors
            assert "".join(sink.texts) == expected(prompt), prompt
        # Every step ran on the (simulated) device: one or two graph runs per iteration.
        assert len(executions) >= scheduler.generation_stats.steps > 0
    finally:
        runtime.shutdown()


async def test_the_npu_placement_refuses_a_context_past_the_graphs_positions(
    tmp_path: Path,
) -> None:
    """The graph's metadata says its RoPE tables hold 2,048 positions, read from the file
    as the NPU placement reads it; a longer max_model_len fails the load before anything
    reaches the device (no compile). A load that fails after the step model is on the
    device (a chat template that is not UTF-8) gives its memory back."""
    runtime = SimRuntime()
    device = runtime.devices[0]
    try:
        with pytest.raises(ValueError, match="max_model_len 2056 exceeds the 2048 positions"):
            engine(tmp_path / "a", GeBackend(runtime), placement="npu", max_model_len="2056",
                   kv_cache_blocks="1024", npu_block_gears="257")  # fmt: skip
        assert device.peak == device.used == 0
        # One gear of each kind: the compile is the test's cost.
        gears = {"npu_batch_gears": "32", "npu_chunk_gears": "128", "npu_block_gears": "32"}
        folder = llmrepo.write_tiny_llm(tmp_path / "t", "m", {"placement": "npu", **gears})
        (folder / "1" / "chat_template.jinja").write_bytes(b"\xff\xfe{{ x }}")
        config = text_format.Parse(
            (folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
        )
        spec = ModelSpec("m", 1, config, folder, folder / "1" / "model.onnx")
        with pytest.raises(UnicodeDecodeError):
            LlmBackend(GeBackend(runtime)).load(spec)
        assert device.peak > 0 and device.used == 0
    finally:
        runtime.shutdown()


async def test_the_npu_placement_refuses_a_graph_with_onnxruntime_kernels(
    tmp_path: Path,
) -> None:
    """The GGUF build's graph (MatMulNBits, com.microsoft) is onnxruntime's: ATC would not
    compile it, so the NPU placement refuses it at load, saying how to build one it takes,
    where the simulated NPU (onnxruntime underneath) would have run it."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    runtime = SimRuntime()
    try:
        with pytest.raises(ValueError, match=r"com\.microsoft domain .*build\.py --fp32-only"):
            engine(tmp_path, GeBackend(runtime), model=llmrepo.q4_1_tiny_model(), placement="npu")
    finally:
        runtime.shutdown()


async def test_the_q4_1_graph_answers_equal_the_reference(tmp_path: Path) -> None:
    """On the host CPU the same graph serves: one stream's decode steps run on the blocks,
    and its answers are the tiny model's own (the blocks hold its weights exactly)."""
    pytest.importorskip("gguf", reason="gguf is not installed (the test extra)")
    model = llmrepo.q4_1_tiny_model()
    scheduler = engine(tmp_path, model=model)
    try:
        for prompt in PROMPTS[:2]:  # one at a time: every decode step has one token
            sink = await ask(scheduler, prompt)
            assert sink.final and not sink.errors
            ids = llmrepo.prompt_ids(prompt)
            want = llama_reference.greedy(model.weights, model.cfg, ids, TOKENS, ())
            assert "".join(sink.texts) == llmrepo.answer_text(want), prompt
    finally:
        await scheduler.close(1)


async def test_prompts_that_share_a_prefix_share_its_blocks_and_answer_the_same(
    tmp_path: Path,
) -> None:
    """A prompt that starts like one being generated shares its full blocks (prefix
    caching): it prefills only the rest, and its answer is still the reference's."""
    prefix = "You are a helpful assistant. Say: "
    scheduler = engine(tmp_path)
    try:
        # Long enough to be generating still when the second has been answered.
        first = asyncio.ensure_future(ask(scheduler, prefix + "a", 200))
        stats = scheduler.generation_stats
        for _ in range(5000):  # until the first is decoding: its prompt's blocks are full
            if stats.generation_tokens:
                break
            await asyncio.sleep(0.002)
        second = await ask(scheduler, prefix + "bc")
        assert not first.done()
        assert (await first).final and not first.result().errors
    finally:
        await scheduler.close(1)
    assert second.final and not second.errors
    assert "".join(second.texts) == expected(prefix + "bc")
    shared = len(prefix) // llmrepo.BLOCK_SIZE * llmrepo.BLOCK_SIZE  # a byte per token
    assert stats.prefix_cache_hits >= shared > 0
    assert stats.prefix_cache_queries >= 2 * len(prefix)
    assert stats.kv_blocks_used == 0


async def test_a_sequence_whose_sampling_fails_fails_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step is shared; one sequence's next token failing ends only that sequence."""

    class Failing(Sampler):
        def sample(self, logits: Any, banned: tuple[int, ...] = ()) -> int:
            raise ValueError("this sampler cannot")

    class Leaving(Sampler):
        def sample(self, logits: Any, banned: tuple[int, ...] = ()) -> int:
            # Its client leaves during the step (white box: the engine's running list).
            for seq in scheduler._running:
                if seq.params.seed == 667:
                    seq.cancelled = True
            raise ValueError("nobody is told")

    def sampler(params: Any) -> Any:
        # The prompt cannot be seen here; a seed picks the one that fails.
        failing = {666: Failing, 667: Leaving}.get(params.seed)
        return (failing or Sampler)(params)

    monkeypatch.setattr(genrequest, "Sampler", sampler)
    scheduler = engine(tmp_path, max_num_seqs="3")
    try:
        bad = Recorder(scheduler=scheduler)
        inputs = {
            "text_input": np.array([b"Prompt bad"], dtype=object),
            "max_tokens": np.array([TOKENS], np.int32),
            "sampling_parameters": np.array([b'{"seed": 666}'], dtype=object),
        }
        work = WorkItem(inputs, 1, context=RequestContext(responses=bad))
        good = await together(
            scheduler,
            [
                ask(scheduler, PROMPTS[0]),
                _submitted(scheduler, work, bad),
                ask(scheduler, PROMPTS[1]),
            ],
        )
        assert bad.final and [e.message for e in bad.errors] == [
            "sampling failed: this sampler cannot"
        ]
        # Counted as vLLM counts a request the engine failed.
        assert scheduler.generation_stats.finished == {
            "stop": 0, "length": 2, "abort": 0, "error": 1
        }  # fmt: skip
        # One whose client left is not told, and counts as aborted.
        gone = Recorder(scheduler=scheduler)
        inputs["sampling_parameters"] = np.array([b'{"seed": 667}'], dtype=object)
        await scheduler.submit(WorkItem(inputs, 1, context=RequestContext(responses=gone)))
        assert not gone.final and gone.errors == []
        assert scheduler.generation_stats.finished["abort"] == 1
        assert scheduler.generation_stats.finished["error"] == 1
        for prompt, sink in zip((PROMPTS[0], PROMPTS[1]), (good[0], good[2]), strict=True):
            assert sink.final and not sink.errors
            assert "".join(sink.texts) == expected(prompt)
    finally:
        await scheduler.close(1)


async def _submitted(scheduler: GenerationScheduler, work: WorkItem, sink: Recorder) -> Recorder:
    await scheduler.submit(work)
    return sink


async def test_the_loop_runs_on_while_a_long_prompt_is_tokenized(tmp_path: Path) -> None:
    """A prompt is tokenized whole where its length gives no bound on its tokens (here the
    EOS token takes the whitespace before it): on a worker thread, by a call that releases
    the GIL, so the event loop serves everyone else meanwhile."""
    from tokenizers import AddedToken

    tokenizer = llmrepo.byte_tokenizer()
    tokenizer.add_special_tokens([AddedToken(llmrepo.EOS_TOKEN, lstrip=True, special=True)])
    scheduler = engine(tmp_path, tokenizer=tokenizer)
    assert scheduler._model.tokenizer.max_token_bytes is None  # white box: no shortcut
    gaps: list[float] = []

    async def heartbeat() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    beat = asyncio.ensure_future(heartbeat())
    try:
        await asyncio.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(ServerError, match="maximum context length is 256 tokens"):
            await ask(scheduler, "a b " * 500_000)  # 2 MB: seconds of tokenizing
        took = time.monotonic() - started
    finally:
        beat.cancel()
        await scheduler.close(1)
    # With the GIL held the loop would stand still the whole time (seconds); a fixed
    # bound, generous for a busy machine whose threads may wait for a core.
    assert max(gaps) < max(0.5, took / 2), (max(gaps), took)


async def test_a_prompt_whose_length_alone_is_past_the_context_is_never_tokenized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = engine(tmp_path)  # 256 tokens; no token stands for more than 13 bytes
    tokenizer = scheduler._model.tokenizer
    assert tokenizer.max_token_bytes == len(llmrepo.EOS_TOKEN)

    def encode(text: str) -> list[int]:
        raise AssertionError("tokenized")

    try:
        monkeypatch.setattr(tokenizer, "encode", encode)
        with pytest.raises(ServerError) as refused:
            await ask(scheduler, "x" * 8_000_000)
        assert refused.value.code is ErrorCode.INVALID_ARG
        assert refused.value.message == (
            "This model's maximum context length is 256 tokens. However, the prompt is at "
            "least 615385 tokens (8000000 bytes, at most 13 a token), which leaves no room "
            "to generate."
        )
        # 2600 bytes are at least 200 tokens: with 100 more to generate, past 256.
        with pytest.raises(ServerError, match="you requested at least 300 tokens"):
            await ask(scheduler, "x" * 2600, 100)
    finally:
        await scheduler.close(1)


async def test_a_mixture_of_experts_answers_equal_the_reference(tmp_path: Path) -> None:
    """A mixture's graph (onnxruntime's MoE operator, llama_moe.py) in the engine: three
    sequences batched together, each token routed to its own experts, each answer the
    reference's."""
    cfg = smollm.tiny_config(
        vocab_size=llmrepo.VOCAB, max_position_embeddings=2048, num_experts=6,
        experts_used=2, expert_size=64,
    )  # fmt: skip
    model = llmrepo.TinyModel(cfg, smollm.llama_weights().random_weights(cfg, seed=1), eos_id=256)
    scheduler = engine(tmp_path, model=model)
    try:
        sinks = await together(scheduler, [ask(scheduler, p) for p in PROMPTS[:3]])
        for prompt, sink in zip(PROMPTS[:3], sinks, strict=True):
            assert sink.final and not sink.errors
            want = llama_reference.greedy(
                model.weights, cfg, llmrepo.prompt_ids(prompt), TOKENS, ()
            )
            assert "".join(sink.texts) == llmrepo.answer_text(want), prompt
    finally:
        await scheduler.close(1)
