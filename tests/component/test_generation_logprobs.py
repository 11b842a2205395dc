"""The `llm` engine's log probabilities against a numpy log-softmax of the reference's
logits (tests/llama_reference.py), sent as Triton's vLLM backend sends them: per
response, the JSON of its own tokens ({token_id: {logprob, rank, decoded_token}}) and the
running `cumulative_logprob`; "null" and NaN where the sampling parameters ask for none.
The tiny model (tests/llmrepo.py), driven in process."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import llmrepo
import numpy as np
import pytest
from recording_sink import RecordingSink

from ge_serve.backends.base import RequestContext
from ge_serve.backends.llm.logprobs import TokenLogprobs
from ge_serve.backends.llm.text import Tokenizer
from ge_serve.scheduler.generation import GenerationScheduler
from ge_serve.scheduler.work import WorkItem
from ge_serve.server.errors import ErrorCode, ServerError

PROMPT = "Count me"
TOKENS = 6
FLAGS = ("return_logprobs", "return_cumulative_logprob", "return_num_output_tokens")


def engine(tmp_path: Path, parameters: dict[str, str] | None = None) -> GenerationScheduler:
    folder = llmrepo.write_tiny_llm(tmp_path, "m", parameters)
    with (folder / "config.pbtxt").open("a") as config:
        for name in FLAGS:
            config.write(
                f'input {{ name: "{name}" data_type: TYPE_BOOL dims: [ 1 ] optional: true }}\n'
            )
        config.write('output { name: "logprobs" data_type: TYPE_STRING dims: [ -1 ] }\n')
        config.write('output { name: "cumulative_logprob" data_type: TYPE_FP32 dims: [ -1 ] }\n')
    return llmrepo.engine_of(folder)


async def ask(
    scheduler: GenerationScheduler, stream: bool, sampling: dict[str, Any], flags: bool = True
) -> RecordingSink:
    sink = RecordingSink()
    inputs: dict[str, Any] = {
        "text_input": np.array([PROMPT.encode()], dtype=object),
        "max_tokens": np.array([TOKENS], np.int32),
        "stream": np.array([stream]),
        "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=object),
    }
    for name in FLAGS if flags else ():
        inputs[name] = np.array([True])
    context = RequestContext(responses=sink)
    await scheduler.submit(WorkItem(inputs, 1, context=context))
    await sink.until_final()
    assert sink.final and not sink.errors, sink.errors
    return sink


@pytest.mark.parametrize("stream", [True, False])
async def test_logprobs_are_the_reference_log_softmax(tmp_path: Path, stream: bool) -> None:
    scheduler = engine(tmp_path)
    try:
        sink = await ask(scheduler, stream, {"temperature": 0, "ignore_eos": True, "logprobs": 3})
        entries: list[dict[str, Any]] = []
        ids: list[int] = []
        cumulative: list[float] = []
        for response in sink.responses:
            mine = json.loads(response["logprobs"][0])
            assert len(mine) == int(response["num_output_tokens"][0])
            assert [int(next(iter(e))) for e in mine] == list(response["output_ids"])
            entries += mine
            ids += [int(i) for i in response["output_ids"]]
            cumulative.append(float(response["cumulative_logprob"][0]))
        assert len(entries) == TOKENS and (len(sink.responses) > 1) == stream
        expected = llmrepo.reference_logprobs(PROMPT, ids)
        total = 0.0
        for at, (token, entry) in enumerate(zip(ids, entries, strict=True)):
            best = [int(i) for i in np.argsort(-expected[at], kind="stable")[:3]]
            # Greedy: the sampled token is the top one, so it appears once, rank 1.
            assert [int(k) for k in entry] == best and best[0] == token
            assert [v["rank"] for v in entry.values()] == [1, 2, 3]
            for key, value in entry.items():
                assert value["logprob"] == pytest.approx(expected[at][int(key)], abs=1e-3)
                assert value["logprob"] <= 0
                alone = llmrepo.byte_tokenizer().decode([int(key)])
                if not alone.endswith("\ufffd"):  # a cut character's is repaired (below)
                    assert value["decoded_token"] == alone
            total += entry[str(token)]["logprob"]
        assert cumulative[-1] == pytest.approx(total, abs=1e-3)
        assert cumulative == sorted(cumulative, reverse=True)
    finally:
        await scheduler.close(1)


async def test_a_sampled_token_outside_the_top_n_comes_first_with_its_rank(
    tmp_path: Path,
) -> None:
    scheduler = engine(tmp_path)
    try:
        sampling = {"temperature": 50, "seed": 7, "ignore_eos": True, "logprobs": 0}
        sink = await ask(scheduler, False, sampling)
        entries = json.loads(sink.responses[0]["logprobs"][0])
        ids = [int(i) for i in sink.responses[0]["output_ids"]]
        expected = llmrepo.reference_logprobs(PROMPT, ids)
        ranks = []
        for at, (token, entry) in enumerate(zip(ids, entries, strict=True)):
            assert list(entry) == [str(token)]
            rank = int(np.count_nonzero(expected[at] >= expected[at][token]))
            assert entry[str(token)]["rank"] == rank
            ranks.append(rank)
        assert max(ranks) > 1  # so hot a temperature samples past the top token
    finally:
        await scheduler.close(1)


async def test_flags_without_sampling_logprobs_send_null_and_nan(tmp_path: Path) -> None:
    scheduler = engine(tmp_path)
    try:
        sink = await ask(scheduler, True, {"temperature": 0})
        for response in sink.responses:
            assert list(response["logprobs"]) == [b"null"]
            assert math.isnan(float(response["cumulative_logprob"][0]))
        # Flags left out: neither output, even with sampling logprobs.
        plain = await ask(scheduler, True, {"temperature": 0, "logprobs": 1}, flags=False)
        for response in plain.responses:
            assert "logprobs" not in response and "cumulative_logprob" not in response
    finally:
        await scheduler.close(1)


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        (
            {"logprobs": 21},
            "Requested sample logprobs of 21, which is greater than max allowed: 20",
        ),
        ({"logprobs": -1}, "Requested sample logprobs of 320, which is greater than max allowed"),
        ({"logprobs": -2}, "logprobs must be non-negative or -1, got -2."),
        ({"logprobs": "x"}, "logprobs must be an integer"),
        ({"prompt_logprobs": -1}, "Requested prompt logprobs of 320, which is greater than max"),
    ],
)
async def test_logprobs_out_of_bounds_are_refused(
    tmp_path: Path, sampling: dict[str, Any], message: str
) -> None:
    scheduler = engine(tmp_path)
    try:
        with pytest.raises(ServerError) as refused:
            await ask(scheduler, True, sampling)
        assert refused.value.code is ErrorCode.INVALID_ARG
        assert message in refused.value.message
    finally:
        await scheduler.close(1)


async def test_max_logprobs_bounds_them_as_vllms_flag(tmp_path: Path) -> None:
    scheduler = engine(tmp_path / "five", {"max_logprobs": "5"})
    try:
        with pytest.raises(ServerError) as refused:
            await ask(scheduler, False, {"logprobs": 6})
        assert "of 6, which is greater than max allowed: 5" in refused.value.message
    finally:
        await scheduler.close(1)
    # -1: the whole vocabulary, which logprobs -1 asks for.
    scheduler = engine(tmp_path / "all", {"max_logprobs": "-1"})
    try:
        sink = await ask(scheduler, False, {"logprobs": -1, "temperature": 0})
        entries = json.loads(sink.responses[0]["logprobs"][0])
        assert [len(e) for e in entries] == [llmrepo.VOCAB] * TOKENS
        for entry in entries:
            total = sum(math.exp(v["logprob"]) for v in entry.values())
            assert total == pytest.approx(1.0, abs=1e-6)
    finally:
        await scheduler.close(1)


def test_a_character_cut_across_tokens_is_spelt_by_the_token_completing_it(
    tmp_path: Path,
) -> None:
    """vLLM's repair: each byte of "é€" alone decodes to U+FFFD; the tokens spell "", "é",
    "", "", "€" (the character on the token that completes it), so they spell the text."""
    path = tmp_path / "tokenizer.json"
    llmrepo.byte_tokenizer().save(str(path))
    found = TokenLogprobs(1, Tokenizer(path), llmrepo.VOCAB)
    ids = llmrepo.prompt_ids("aé€")
    for token in ids:
        logits = np.zeros(llmrepo.VOCAB, np.float32)
        logits[token] = 5.0
        found.add(logits, token)
    pairs = zip(found.entries, ids, strict=True)
    spelt = [entry[str(token)]["decoded_token"] for entry, token in pairs]
    assert spelt == ["a", "", "é", "", "", "€"]
    # A response takes them, and they are let go: a long stream holds only the unsent.
    held = list(found.entries)
    assert json.loads(found.take()) == held
    assert found.entries == [] and json.loads(found.take()) == []


# vLLM's `logprob_token_ids`: `allowed_token_ids` forces the sampled token (vLLM's test's
# shape); the given ids, one repeated and the sampled one among them, follow it once each.
FORCED = 64
CHOSEN = [100, FORCED, 7, 100, 300]


@pytest.mark.parametrize("stream", [True, False])
async def test_logprob_token_ids_are_the_sampled_token_and_those_ids(
    tmp_path: Path, stream: bool
) -> None:
    scheduler = engine(tmp_path)
    try:
        forced = {"temperature": 0, "ignore_eos": True, "allowed_token_ids": [FORCED]}
        # Without `logprobs`: the ids ask for them (vLLM's num_logprobs).
        sink = await ask(scheduler, stream, {**forced, "logprob_token_ids": CHOSEN})
        entries: list[dict[str, Any]] = []
        for response in sink.responses:
            entries += json.loads(response["logprobs"][0])
        ids = [FORCED] * TOKENS
        assert len(entries) == TOKENS
        # Raw logits: what the allowed-token mask did to them does not show.
        expected = llmrepo.reference_logprobs(PROMPT, ids)
        for at, entry in enumerate(entries):
            assert list(entry) == ["64", "100", "7", "300"]
            for key, value in entry.items():
                row = expected[at]
                assert value["logprob"] == pytest.approx(row[int(key)], abs=1e-3)
                assert value["rank"] == int(np.count_nonzero(row >= row[int(key)]))
        cumulative = float(sink.responses[-1]["cumulative_logprob"][0])
        assert cumulative == pytest.approx(sum(e["64"]["logprob"] for e in entries), abs=1e-4)
        # The same tokens' entries with `logprobs`: the same values, the top N instead.
        top = await ask(scheduler, stream, {**forced, "logprobs": 2})
        natural = [e for r in top.responses for e in json.loads(r["logprobs"][0])]
        for entry, other in zip(entries, natural, strict=True):
            assert len(other) == 3 and next(iter(other)) == "64"
            for key in set(entry) & set(other):
                assert entry[key]["logprob"] == pytest.approx(other[key]["logprob"], abs=1e-9)
        # `logprobs` equal to their count is allowed, and the ids still win; [] is none.
        both = await ask(
            scheduler, stream, {**forced, "logprobs": 3, "logprob_token_ids": [9, 8, 7]}
        )
        for response in both.responses:
            for entry in json.loads(response["logprobs"][0]):
                assert list(entry) == ["64", "9", "8", "7"]
        empty = await ask(scheduler, stream, {**forced, "logprob_token_ids": []})
        assert all(list(r["logprobs"]) == [b"null"] for r in empty.responses)
    finally:
        await scheduler.close(1)


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        (
            {"logprob_token_ids": list(range(129))},
            "Requested logprob_token_ids of length 129, which is greater than max allowed: 128",
        ),
        (
            {"logprob_token_ids": [-1, 5, 320]},
            "token_id(s) [-1, 320] in logprob_token_ids contain out-of-vocab token ids. "
            "Vocabulary size: 320",
        ),
        (
            {"logprobs": 2, "logprob_token_ids": [1, 2, 3]},
            "When both logprobs and logprob_token_ids are set, logprobs must equal "
            "len(logprob_token_ids). Got logprobs=2, len(logprob_token_ids)=3.",
        ),
        ({"logprob_token_ids": "1"}, "logprob_token_ids must be a list of token ids"),
        ({"logprob_token_ids": [True]}, "logprob_token_ids must be a list of token ids"),
    ],
)
async def test_bad_logprob_token_ids_are_refused(
    tmp_path: Path, sampling: dict[str, Any], message: str
) -> None:
    scheduler = engine(tmp_path)
    try:
        with pytest.raises(ServerError) as refused:
            await ask(scheduler, False, sampling)
        assert refused.value.code is ErrorCode.INVALID_ARG
        assert refused.value.message == message
    finally:
        await scheduler.close(1)
