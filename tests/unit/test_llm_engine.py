"""The generation engine's pure parts: the block allocator, the step's inputs, the
scheduling decisions (admission, chunked prefill, preemption), sampling, its parameters,
stop strings and the incremental detokenizer."""

from __future__ import annotations

import json
from collections import deque
from typing import Any

import llmrepo
import numpy as np
import pytest
from engineseqs import sequence as seq

from ge_serve.backends.llm.kvcache import BlockAllocator
from ge_serve.backends.llm.runner import RowWork, build_step_inputs
from ge_serve.backends.llm.sampler import Sampler
from ge_serve.backends.llm.sampling import (
    SamplingError,
    SamplingParams,
    sampling_params,
)
from ge_serve.backends.llm.settings import SamplingDefaults
from ge_serve.backends.llm.text import GIL_FREE_CHARS, Detokenizer, StopStrings, Tokenizer
from ge_serve.backends.onnx_io import max_intra_op_threads
from ge_serve.scheduler.genplan import Limits, plan_step
from ge_serve.scheduler.genseq import Sequence

DEFAULTS = SamplingDefaults(max_tokens=16, temperature=1.0, top_p=1.0, top_k=0)


def limits(seqs: int = 8, tokens: int = 64, batching: str = "iteration") -> Limits:
    return Limits(block_size=4, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                  batching=batching)  # fmt: skip


# --- blocks ---------------------------------------------------------------------------------


def test_allocator_hands_out_each_block_once_and_never_block_zero() -> None:
    blocks = BlockAllocator(4)
    first = blocks.allocate(3)
    assert first is not None and sorted(first) == [1, 2, 3]
    assert blocks.allocate(2) is None and blocks.free == 1  # nothing taken on failure
    blocks.release(first)
    assert first == [] and blocks.free == 4 and blocks.used == 0


def test_step_inputs_left_pad_and_mask_past_and_causal() -> None:
    rows = [RowWork([7], 5, [3, 9]), RowWork([1, 2, 3], 0, [4])]
    feed, (tokens, blocks, offsets) = build_step_inputs(rows, 4)
    assert feed["input_ids"].tolist() == [[0, 0, 7], [1, 2, 3]]
    assert feed["positions"].tolist() == [[0, 0, 5], [0, 1, 2]]
    assert feed["block_table"].tolist() == [[3, 9], [4, 0]]
    allowed = feed["attention_mask"] == 0
    # Row 0 decodes: its last query sees its 5 past slots and itself.
    assert allowed[0, 2].tolist() == [True] * 5 + [False] * 3 + [False, False, True]
    # Row 1 prefills 3 tokens with no past: causal over the new tokens only.
    assert allowed[1].tolist() == [
        [False] * 8 + [True, False, False],
        [False] * 8 + [True, True, False],
        [False] * 8 + [True, True, True],
    ]
    # The decode token goes to slot 5: block 9, offset 1; the prefill's to block 4. The
    # outputs are flat, row after row of q = 3: the decode token is output 2.
    assert list(zip(tokens, blocks, offsets, strict=True)) == [
        (2, 9, 1), (3, 4, 0), (4, 4, 1), (5, 4, 2)
    ]  # fmt: skip
    # A second group's tokens follow the first's in the outputs.
    _, (tokens, _, _) = build_step_inputs(rows[:1], 4, first_token=6)
    assert tokens.tolist() == [6]


# --- scheduling -----------------------------------------------------------------------------


def test_new_sequences_are_admitted_up_to_max_num_seqs() -> None:
    running: list[Sequence] = []
    waiting = deque(seq(i, 3) for i in range(5))
    plan = plan_step(running, waiting, BlockAllocator(32), limits(seqs=3))
    assert [s.serial for s in plan.admitted] == [0, 1, 2]
    assert len(waiting) == 2 and all(n == 3 for _, n in plan.prefill)


def test_prefill_is_chunked_to_the_token_budget() -> None:
    running: list[Sequence] = []
    waiting = deque([seq(0, 40)])
    plan = plan_step(running, waiting, BlockAllocator(32), limits(tokens=16))
    assert [(s.serial, n) for s, n in plan.prefill] == [(0, 16)]
    first = plan.prefill[0][0]
    first.computed += 16
    plan = plan_step(running, waiting, BlockAllocator(32), limits(tokens=16))
    assert [(s.serial, n) for s, n in plan.prefill] == [(0, 16)]


def test_decoding_sequences_run_every_step_beside_a_prefill() -> None:
    decoding = [seq(0, 5, computed=4), seq(1, 9, computed=8)]
    allocator = BlockAllocator(32)
    for s in decoding:
        taken = allocator.allocate(2)
        assert taken is not None
        s.blocks = taken
    waiting = deque([seq(2, 30)])
    plan = plan_step(list(decoding), waiting, allocator, limits(tokens=8))
    assert plan.decode == decoding
    assert [(s.serial, n) for s, n in plan.prefill] == [(2, 8)]


def test_request_level_batching_admits_only_when_nothing_runs() -> None:
    running = [seq(0, 5, computed=4)]
    allocator = BlockAllocator(32)
    running[0].blocks = allocator.allocate(2) or []
    waiting = deque([seq(1, 3)])
    plan = plan_step(running, waiting, allocator, limits(batching="request"))
    assert not plan.admitted and len(waiting) == 1
    plan = plan_step([], waiting, allocator, limits(batching="request"))
    assert [s.serial for s in plan.admitted] == [1]


def test_a_full_pool_preempts_the_newest_sequence_back_to_the_queue_front() -> None:
    allocator = BlockAllocator(4)
    old, new = seq(0, 8, computed=7), seq(1, 8, computed=7)
    old.blocks = allocator.allocate(2) or []
    new.blocks = allocator.allocate(2) or []
    # Each now needs a third block for token 8; there is none.
    old.tokens.append(1)
    new.tokens.append(1)
    old.computed = new.computed = 8
    running, waiting = [old, new], deque([seq(2, 3)])
    plan = plan_step(running, waiting, allocator, limits())
    assert plan.preempted == [new] and plan.decode == [old]
    assert running == [old] and waiting[0] is new and new.computed == 0 and not new.blocks
    assert len(old.blocks) == 3


def test_a_waiting_sequence_never_preempts_a_running_one() -> None:
    allocator = BlockAllocator(2)
    running = [seq(0, 8, computed=7)]
    running[0].blocks = allocator.allocate(2) or []
    waiting = deque([seq(1, 3)])
    plan = plan_step(running, waiting, allocator, limits())
    assert plan.decode == running and not plan.admitted and not plan.preempted


def test_a_prompt_comes_in_only_when_its_whole_prefill_fits_beside_the_running_ones() -> None:
    # 16 blocks of 4 tokens. The first prompt (40 tokens: 10 blocks) prefills 16 tokens a
    # step; the second (24 tokens: 6 blocks) would fit on its first chunk, but not whole
    # beside what the first still needs, so it waits for it.
    allocator = BlockAllocator(16)
    running: list[Sequence] = []
    first, second = seq(0, 40), seq(1, 24)
    waiting = deque([first, second])
    plan = plan_step(running, waiting, allocator, limits(tokens=16))
    assert plan.admitted == [first] and list(waiting) == [second]
    first.computed += 16
    plan = plan_step(running, waiting, allocator, limits(tokens=16))
    assert plan.admitted == [] and [(s.serial, n) for s, n in plan.prefill] == [(0, 16)]
    # A shorter one, whose 2 blocks fit beside the first's prompt, comes in (the first
    # takes its last 24 tokens in this step, so 6 blocks stay free).
    first.computed += 16
    short = seq(2, 8)
    waiting.appendleft(short)
    plan = plan_step(running, waiting, allocator, limits(tokens=64))
    assert plan.admitted == [short] and list(waiting) == [second]


# --- sampling -------------------------------------------------------------------------------


def test_greedy_and_top_k_one_pick_the_largest_logit() -> None:
    logits = np.array([0.1, 3.0, 2.9, -1.0], np.float32)
    assert Sampler(SamplingParams(max_tokens=1, temperature=0.0)).sample(logits) == 1
    top1 = Sampler(SamplingParams(max_tokens=1, temperature=5.0, top_k=1, seed=3))
    assert {top1.sample(logits) for _ in range(20)} == {1}
    tiny_p = Sampler(SamplingParams(max_tokens=1, temperature=1.0, top_p=0.01, seed=3))
    assert {tiny_p.sample(logits) for _ in range(20)} == {1}


def test_a_seed_repeats_its_samples_and_banned_tokens_never_come() -> None:
    logits = np.zeros(50, np.float32)
    params = SamplingParams(max_tokens=1, temperature=1.0, seed=11)
    a, b = Sampler(params), Sampler(params)
    assert [a.sample(logits) for _ in range(30)] == [b.sample(logits) for _ in range(30)]
    banned = tuple(range(49))
    assert {Sampler(params).sample(logits, banned) for _ in range(10)} == {49}


def test_sampling_parameters_merge_and_accept_numbers_as_strings() -> None:
    params = sampling_params(
        DEFAULTS,
        {"temperature": 0.5, "id": "x", "unrelated": True},
        b'{"top_p": "0.9", "top_k": -1, "stop": "END", "seed": 4}',
        12,
    )
    assert (params.temperature, params.top_p, params.top_k) == (0.5, 0.9, 0)
    assert (params.stop, params.seed, params.max_tokens) == (("END",), 4, 12)
    assert sampling_params(DEFAULTS, {}, None, None).max_tokens is None


@pytest.mark.parametrize(
    "doc",
    [
        b'{"temperature": -0.1}',
        b'{"top_p": 0}',
        b'{"top_p": 1.01}',
        b'{"top_k": -2}',
        b'{"max_tokens": 0}',
        b'{"temprature": 1}',
        b'{"n": 3}',
        b'{"stop": [""]}',
        b'{"seed": 1.5}',
        b"[1]",
        b"{",
        # Nested past the JSON parser's recursion limit.
        b'{"stop": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        # Each stop string and id is checked after every token: bounded per request.
        b'{"stop": ' + json.dumps(["x"] * 65).encode() + b"}",
        b'{"stop": ' + json.dumps(["x" * 1025]).encode() + b"}",
        b'{"stop_token_ids": ' + json.dumps([1] * 1025).encode() + b"}",
        b'{"stop_token_ids": [true]}',
    ],
)
def test_bad_sampling_parameters_are_refused(doc: bytes) -> None:
    with pytest.raises(SamplingError):
        sampling_params(DEFAULTS, {}, doc, None)


def test_the_bounds_on_stops_are_inclusive() -> None:
    doc = {"stop": ["x" * 1024] * 64, "stop_token_ids": [1] * 1024}
    params = sampling_params(DEFAULTS, {}, json.dumps(doc).encode(), None)
    assert len(params.stop) == 64 and len(params.stop_token_ids) == 1024


@pytest.mark.parametrize("temperature", [1e-310, 1e-6])
def test_a_temperature_too_small_to_divide_by_samples_greedily(temperature: float) -> None:
    # Dividing by 1e-310 overflows the logits to inf and the probabilities to NaN.
    logits = np.linspace(-3, 3, 50).astype(np.float32)
    sampler = Sampler(SamplingParams(max_tokens=1, temperature=temperature, seed=3))
    assert {sampler.sample(logits) for _ in range(20)} == {49}


# --- text -----------------------------------------------------------------------------------


def test_stop_string_spanning_deltas_is_cut_and_never_shown() -> None:
    stops = StopStrings(("STOP",))
    shown = [stops.add(d) for d in ("hello S", "T", "OP and more")]
    assert shown == ["hello ", "", ""]
    assert stops.stopped and stops.text == "hello "


def test_a_false_start_of_a_stop_string_is_released() -> None:
    stops = StopStrings(("STOP",))
    assert stops.add("a ST") == "a "
    assert stops.add("ay") == "STay"
    assert stops.finish() == "" and not stops.stopped
    held = StopStrings(("STOP",))
    assert held.add("ends ST") == "ends "
    assert held.finish() == "ST"


def test_unknown_ids_are_found_past_the_largest_and_in_the_gaps(tmp_path: Any) -> None:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers.models import WordLevel

    # Ids 0, 1 and 5: three tokens, so an id count would call 5 unknown and miss 3.
    vocab = {"[UNK]": 0, "a": 1, "z": 5}
    path = tmp_path / "tokenizer.json"
    HfTokenizer(WordLevel(vocab, unk_token="[UNK]")).save(str(path))
    tokenizer = Tokenizer(path)
    assert tokenizer.unknown_id([0, 1, 5, 1]) is None
    assert tokenizer.unknown_id([1, 3, 2, 5]) == 3
    assert tokenizer.unknown_id([1, 9, 3]) == 9
    assert tokenizer.unknown_id([]) is None
    # A long list decodes off the GIL (decode_batch), to the same text.
    assert tokenizer.decode([1] * 5000) == " ".join(["a"] * 5000)


def test_a_stop_string_within_min_tokens_never_ends_the_text_later() -> None:
    # Unchecked (the tokens before min_tokens): "," lies wholly there, so it never counts,
    # even beside a longer stop string; "ab" begins there and ends after, so it does.
    stops = StopStrings((",", "abc"))
    assert stops.add("x,", check=False) == "x,"
    assert stops.add("yz") == "yz" and not stops.stopped
    spanning = StopStrings((",", "abc"))
    assert spanning.add("x,ab", check=False) == "x,"
    assert spanning.add("cd") == "" and spanning.stopped and spanning.text == "x,"


def test_stop_string_may_be_included() -> None:
    stops = StopStrings(("!",), include_stop=True)
    assert stops.add("hi! there") == "hi!"


def test_detokenizer_holds_a_split_character_until_it_is_whole(tmp_path: Any) -> None:
    path = tmp_path / "tokenizer.json"
    llmrepo.byte_tokenizer().save(str(path))
    tokenizer = Tokenizer(path)
    text = "añ€x"
    ids = tokenizer.encode(text)
    assert len(ids) == len(text.encode())  # one token per byte
    detok = Detokenizer(tokenizer)
    deltas = [detok.add(i) for i in ids]
    assert "".join(deltas) == text
    assert "\ufffd" not in "".join(deltas)
    assert deltas[1] == "" and deltas[2] == "ñ"


def test_an_answer_cut_inside_a_character_ends_without_it(tmp_path: Any) -> None:
    # max_tokens can end an answer after the first bytes of a character: as vLLM, the
    # answer drops them rather than showing U+FFFD, and keeps what came before.
    tokenizer = saved(tmp_path, llmrepo.byte_tokenizer())
    ids = tokenizer.encode("a🍕b🍕")[:-2]
    detok = Detokenizer(tokenizer)
    text = "".join(detok.add(i) for i in ids) + detok.flush()
    assert text == "a🍕b"
    assert detok.flush() == ""


def test_a_long_text_is_tokenized_as_a_short_one(tmp_path: Any) -> None:
    # Past GIL_FREE_CHARS another call tokenizes (one that releases the GIL): the same ids.
    tokenizer = saved(tmp_path, llmrepo.byte_tokenizer())
    text = "añ€🍕 <|endoftext|>x" * 100
    assert len(text) > GIL_FREE_CHARS
    assert tokenizer.encode(text) == list(llmrepo.byte_tokenizer().encode(text).ids)


def saved(tmp_path: Any, hf_tokenizer: Any) -> Tokenizer:
    path = tmp_path / "tokenizer.json"
    hf_tokenizer.save(str(path))
    return Tokenizer(path)


def spaces_bpe() -> Any:
    """Byte-level BPE whose longest token is four spaces, "ĠĠĠĠ": 4 bytes of text, though
    8 bytes in UTF-8."""
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {char: i for i, char in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["ĠĠ"] = len(vocab)
    vocab["ĠĠĠĠ"] = len(vocab)
    tokenizer = HfTokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "Ġ"), ("ĠĠ", "ĠĠ")]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def metaspace_bpe() -> Any:
    """A Llama-2-like BPE: the normalizer turns spaces into "▁" (1 byte into 3)."""
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import models, normalizers

    vocab = {"<unk>": 0, "▁": 1, "a": 2, "▁▁": 3, "▁a": 4}
    tokenizer = HfTokenizer(
        models.BPE(vocab=vocab, merges=[("▁", "▁"), ("▁", "a")], unk_token="<unk>")
    )
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    return tokenizer


TEXTS = ["", " ", " " * 401, "a " * 50, "  a  ", "añ€🍕 x", "<|endoftext|>" * 9, "K" * 40]


@pytest.mark.parametrize(
    ("build", "most"),
    [(spaces_bpe, 4), (llmrepo.byte_tokenizer, len("<|endoftext|>")), (metaspace_bpe, 6)],
    ids=["byte-level", "added-token", "metaspace"],
)
def test_no_text_has_fewer_tokens_than_its_length_bounds(
    tmp_path: Any, build: Any, most: int
) -> None:
    tokenizer = saved(tmp_path, build())
    assert tokenizer.max_token_bytes == most
    for text in TEXTS:
        assert len(tokenizer.encode(text)) >= tokenizer.min_tokens(len(text.encode())), text
    if build is spaces_bpe:  # byte-level tokens counted by the bytes they stand for
        assert len(tokenizer.encode(" " * 400)) == tokenizer.min_tokens(400) == 100


def lstrip_token(tokenizer: Any) -> None:
    from tokenizers import AddedToken

    tokenizer.add_special_tokens([AddedToken("<s>", lstrip=True)])


def set_normalizer(name: str, *args: Any) -> Any:
    def edit(tokenizer: Any) -> None:
        from tokenizers import normalizers

        tokenizer.normalizer = getattr(normalizers, name)(*args)

    return edit


def whitespace_split(tokenizer: Any) -> None:
    from tokenizers import pre_tokenizers

    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()


def word_piece(tokenizer: Any) -> None:
    from tokenizers import models

    tokenizer.model = models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]")


@pytest.mark.parametrize(
    "edit",
    [
        # "<s>" takes the whitespace before it, however long.
        lstrip_token,
        # The Kelvin sign (3 bytes) lowercases to "k" (1 byte); NFKC maps the fullwidth
        # A (U+FF21, 3 bytes) to "A"; Strip and a shorter Replace drop text.
        set_normalizer("Lowercase"),
        set_normalizer("NFKC"),
        set_normalizer("Strip"),
        set_normalizer("Replace", "  ", " "),
        # Whitespace drops the spaces between words; WordPiece makes one [UNK] of a word.
        whitespace_split,
        word_piece,
        # The text is cut to 16 tokens, whatever its length.
        lambda tokenizer: tokenizer.enable_truncation(16),
    ],
    ids=[
        "lstrip",
        "lowercase",
        "nfkc",
        "strip",
        "replace",
        "whitespace",
        "wordpiece",
        "truncation",
    ],
)
def test_a_tokenizer_that_can_shrink_text_gives_no_bound(tmp_path: Any, edit: Any) -> None:
    hf_tokenizer = spaces_bpe()
    edit(hf_tokenizer)
    tokenizer = saved(tmp_path, hf_tokenizer)
    assert tokenizer.max_token_bytes is None
    assert tokenizer.min_tokens(10**9) == 0


def test_top_p_keeps_the_smallest_nucleus_over_a_large_flat_vocabulary() -> None:
    # 2000 equally likely tokens but the first 10, which hold half the mass: top_p 0.5
    # keeps exactly those ten (more than the fast path's candidates are sorted otherwise).
    logits = np.zeros(2000, np.float32)
    logits[:10] = np.log(1990 / 10)
    sampler = Sampler(SamplingParams(max_tokens=1, temperature=1.0, top_p=0.5, seed=5))
    assert {sampler.sample(logits) for _ in range(200)} <= set(range(10))
    wide = Sampler(SamplingParams(max_tokens=1, temperature=1.0, top_p=0.9, seed=5))
    seen = {wide.sample(np.zeros(2000, np.float32)) for _ in range(200)}
    assert len(seen) > 100 and max(seen) < 2000


# --- load ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"kv_cache_blocks": "4"}, "cannot hold one sequence"),
        ({"batching": "sometimes"}, "batching"),
        # vLLM's --scheduling-policy: its two values, nothing else.
        ({"scheduling_policy": "priority"}, None),
        ({"scheduling_policy": "lifo"}, "scheduling_policy: 'lifo' is not one of fcfs, priority"),
        ({"kv_block_size": "16"}, None),  # the graph's block dim is symbolic: any size goes
        ({"max_model_len": "x"}, "not an integer"),
        # The graph's RoPE tables hold 2,048 positions (its metadata says so).
        ({"max_model_len": "2048", "kv_cache_blocks": "1024"}, None),
        (
            {"max_model_len": "2049", "kv_cache_blocks": "1024"},
            "max_model_len 2049 exceeds the 2048 positions the step model computes",
        ),
        ({"tokenizer": "../../etc/passwd"}, "inside the model folder"),
        ({"step_model": "missing.onnx"}, "not found"),
        ({"eos_token_ids": "1,x"}, "eos_token_ids"),
        ({"default_top_p": "0"}, "default_top_p"),
        # The one spelling of true and false that flags and other parameters take.
        ({"enable_prefix_caching": "off"}, None),
        ({"enable_prefix_caching": "maybe"}, "enable_prefix_caching"),
        # Thousands of onnxruntime threads hang the load once the process has no more
        # (just past the bound here: without the check the load would succeed).
        (
            {"intra_op_thread_count": str(max_intra_op_threads() + 1)},
            f"intra_op_thread_count {max_intra_op_threads() + 1} is more threads",
        ),
        ({"intra_op_thread_count": "-1"}, "is below 0"),
        ({"allow_spinning": "sometimes"}, "allow_spinning: 'sometimes' is not true or false"),
    ],
)
def test_settings_the_engine_cannot_honour_fail_the_load(
    tmp_path: Any, parameters: dict[str, str], message: str | None
) -> None:
    from google.protobuf import text_format

    from ge_serve.backends.base import ModelSpec
    from ge_serve.backends.llm.backend import LlmBackend
    from ge_serve.protos import model_config_pb2

    folder = llmrepo.write_tiny_llm(tmp_path, "m", parameters)
    config = text_format.Parse(
        (folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    spec = ModelSpec("m", 1, config, folder, folder / "1" / "model.onnx")
    if message is None:
        LlmBackend().load(spec)
        return
    with pytest.raises(ValueError, match=message):
        LlmBackend().load(spec)


@pytest.mark.parametrize(("value", "spins"), [(None, "1"), ("false", "0"), ("True", "1")])
def test_allow_spinning_reaches_onnxruntime(tmp_path: Any, value: str | None, spins: str) -> None:
    """On by default (a step is thousands of small parallel ops); `false` lets the threads
    sleep, for a host whose cores other models share."""
    from google.protobuf import text_format

    from ge_serve.backends.base import ModelSpec
    from ge_serve.backends.llm.backend import MODEL_KEY, LlmBackend
    from ge_serve.backends.llm.runner import StepRunner
    from ge_serve.protos import model_config_pb2

    parameters = {} if value is None else {"allow_spinning": value}
    folder = llmrepo.write_tiny_llm(tmp_path, "m", parameters | {"intra_op_thread_count": "2"})
    config = text_format.Parse(
        (folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    loaded = LlmBackend().load(ModelSpec("m", 1, config, folder, folder / "1" / "model.onnx"))
    try:
        runner = loaded.extra[MODEL_KEY].runner
        assert isinstance(runner, StepRunner)
        options = runner.session.get_session_options()
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == spins
    finally:
        loaded.extra[MODEL_KEY].close()


def test_a_config_that_is_not_decoupled_fails_the_load(tmp_path: Any) -> None:
    from google.protobuf import text_format

    from ge_serve.backends.base import ModelSpec
    from ge_serve.backends.llm.backend import LlmBackend
    from ge_serve.protos import model_config_pb2

    folder = llmrepo.write_tiny_llm(tmp_path, "m")
    text = (folder / "config.pbtxt").read_text().replace("decoupled: true", "decoupled: false")
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    spec = ModelSpec("m", 1, config, folder, folder / "1" / "model.onnx")
    with pytest.raises(ValueError, match="decoupled"):
        LlmBackend().load(spec)


# --- the simulated NPU's step cost ---------------------------------------------------------


def test_step_cost_is_a_roofline_over_weights_and_context() -> None:
    from ge_serve.backends.ge.sim_cost import STEP_PROFILE, SimCost, priced_ns

    weights = 540_000_000  # SmolLM2-135M in fp32
    one = STEP_PROFILE.duration_ns(weights, 30, 3 * 64, tokens=1, past_slots=0)
    # 270 MB of fp16 weights at 204.8 GB/s, plus the 500 us launch.
    assert one == pytest.approx((500 + 270e6 / 204.8e9 * 1e6) * 1000, rel=1e-3)
    batch = STEP_PROFILE.duration_ns(weights, 30, 3 * 64, tokens=32, past_slots=32 * 64)
    assert one < batch < 2 * one  # decode is memory bound: 32 rows cost far less than 32x
    long = STEP_PROFILE.duration_ns(weights, 30, 3 * 64, tokens=32, past_slots=32 * 2048)
    assert long > batch  # reading a longer context costs more
    cost = SimCost("rows", 100.0, 10.0)
    names = ["input_ids", "positions", "block_table", "attention_mask", "key_cache_0"]
    shapes = [(4, 1), (4, 1), (4, 2), (4, 1, 33), (9, 16, 2, 8)]
    assert priced_ns(cost, names, shapes, 4.0, 1000) == STEP_PROFILE.duration_ns(
        1000, 1, 16, 4, 4 * 2 * 16
    )
    assert priced_ns(cost, ["x"], [(4, 3)], 4.0, 1000) == cost.duration_ns(4.0)


@pytest.mark.parametrize("value", ["0", "-5", "12x", "\u00b2", ""])
def test_a_graph_whose_positions_are_not_a_count_is_refused(value: str) -> None:
    from ge_serve.backends.llm.runner import max_positions

    with pytest.raises(ValueError, match=f"max_positions {value!r} is not a count"):
        max_positions({"max_positions": value})
    assert max_positions({}) is None
    assert max_positions({"max_positions": "4096"}) == 4096
