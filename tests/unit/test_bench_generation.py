"""The generation suite's pure parts: percentiles, the token and latency bookkeeping from
SSE chunks, the engine counters, and ratios as medians of each run's ratio."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from bench.lib import genload, genservers
from bench.suites import generation


def test_percentile_matches_numpy_linear() -> None:
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (0, 25, 50, 90, 99, 100):
        assert genload.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert genload.percentile([4.0], 99) == 4.0
    assert genload.percentile([], 50) is None


def chunk(content: str | None = None, usage: dict[str, int] | None = None) -> str:
    """One SSE line of a chat.completion.chunk, as the servers stream them."""
    event: dict[str, Any] = {"object": "chat.completion.chunk", "choices": []}
    if content is not None:
        event["choices"] = [{"index": 0, "delta": {"content": content}}]
    if usage is not None:
        event["usage"] = usage
    return "data: " + json.dumps(event)


def feed(record: genload.RequestRecord, lines: list[tuple[str, float]]) -> None:
    for line, at in lines:
        event = genload.parse_sse_line(line)
        if event is not None:
            record.on_event(event, at)


def test_sse_bookkeeping_counts_usage_tokens_beyond_the_chunks() -> None:
    record = genload.RequestRecord(start=10.0)
    feed(
        record,
        [
            (chunk(""), 10.05),  # the role chunk: no text, no token
            (chunk("Hel"), 10.2),
            ("", 10.2),
            (chunk("lo"), 10.25),
            (chunk(" there"), 10.4),
            (chunk(usage={"completion_tokens": 5, "prompt_tokens": 31}), 10.5),
            ("data: [DONE]", 10.5),
        ],
    )
    assert record.ttft == pytest.approx(0.2)
    assert record.gaps() == pytest.approx([0.05, 0.15])
    assert record.tokens == 5
    assert record.prompt_tokens == 31
    # Two tokens added no text: they count when the usage arrives.
    assert record.token_times() == [10.2, 10.25, 10.4, 10.5, 10.5]


def test_without_usage_each_content_chunk_is_one_token() -> None:
    record = genload.RequestRecord(start=0.0)
    feed(record, [(chunk("a"), 1.0), (chunk("b"), 2.0), (": keep-alive", 2.5)])
    assert record.tokens == 2
    assert record.token_times() == [1.0, 2.0]


def test_summarize_counts_only_what_falls_in_the_window() -> None:
    early = genload.RequestRecord(start=0.0)  # first token before the window
    feed(early, [(chunk("x"), 0.5), (chunk("y"), 1.5), (chunk("z"), 2.5)])
    inside = genload.RequestRecord(start=1.2)
    feed(
        inside,
        [
            (chunk("p"), 1.6),
            (chunk("q"), 1.9),
            (chunk(usage={"completion_tokens": 2, "prompt_tokens": 20}), 1.95),
        ],
    )
    late = genload.RequestRecord(start=2.9)  # its first token after the window
    feed(late, [(chunk("w"), 3.5)])
    failed = genload.RequestRecord(start=1.1, error="HTTP 500")
    point = genload.summarize([early, inside, late, failed], t0=1.0, t1=3.0)
    # early's y and z, inside's p and q; x and w fall outside.
    assert point["tokens"] == 4
    assert point["tokens_per_s"] == pytest.approx(2.0)
    # Only `inside` had its first token in the window.
    assert point["ttft_p50_ms"] == pytest.approx(400.0)
    # Gaps ending in the window: early 1.0 and 1.0, inside 0.3.
    assert point["itl_p50_ms"] == pytest.approx(1000.0)
    assert point["itl_p99_ms"] == pytest.approx(1000.0)
    assert point["requests_finished"] == 1
    assert point["answer_tokens"] == [2]
    assert point["prompt_tokens_mean"] == 20
    assert point["errors"] == 1


def test_median_ratio_is_the_median_of_each_runs_ratio() -> None:
    # Ratio of medians would be 200 / 100 = 2; the runs' own ratios are 4, 1, 1.5.
    assert genload.median_ratio([400.0, 200.0, 150.0], [100.0, 200.0, 100.0]) == 1.5
    assert genload.median_ratio([1.0, None, 3.0], [2.0, 5.0, 0.0]) == 0.5
    assert genload.median_ratio([None], [1.0]) is None


def test_request_body_asks_for_fixed_greedy_streamed_answers() -> None:
    body = genload.request_body(genload.Target("http://h/v1", "m"), "Why?", 48)
    assert body["max_tokens"] == 48
    assert body["temperature"] == 0
    assert body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True}


EXPOSITION = """\
# HELP ge_serve_generation_steps_total engine iterations
ge_serve_generation_steps_total{model_name="a",version="1"} 110
ge_serve_generation_steps_total{model_name="b",version="1"} 7
ge_serve_generation_step_seconds_total{model_name="a",version="1"} 2.2
ge_serve_generation_graph_seconds_total{model_name="a",version="1"} 2.0
vllm:generation_tokens_total{model_name="a",version="1"} 880
"""


def test_engine_counters_and_step_figures() -> None:
    after = genservers.parse_counters(EXPOSITION, "a")
    assert after["ge_serve_generation_steps_total"] == 110
    before = dict.fromkeys(genservers.COUNTERS, 0.0) | {
        "ge_serve_generation_steps_total": 10.0,
        "ge_serve_generation_step_seconds_total": 0.2,
        "vllm:generation_tokens_total": 80.0,
    }
    figures = genservers.step_figures(before, after)
    assert figures["steps"] == 100
    assert figures["tokens_per_step"] == pytest.approx(8.0)
    assert figures["step_ms"] == pytest.approx(20.0)
    assert figures["graph_ms"] == pytest.approx(20.0)
    assert figures["engine_ms"] == pytest.approx(0.0)
    assert genservers.step_figures(after, after) == {}


def point(run: int, contender: str, c: int, tps: float, **more: Any) -> dict[str, Any]:
    return {"run": run, "contender": contender, "concurrency": c, "tokens_per_s": tps,
            "ttft_p50_ms": 100.0, "itl_p50_ms": 10.0, "answer_tokens": [48], "errors": 0,
            **more}  # fmt: skip


def test_suite_tables_take_medians_of_per_run_ratios() -> None:
    runs = [
        {
            "run": r,
            "points": [
                point(r, "iteration", 1, i1, step_ms=s1, engine_ms=e1),
                point(r, "iteration", 16, i16),
                point(r, "llama", 16, ll),
            ],
            "raw_step_ms": {"1": raw},
        }
        for r, (i1, i16, ll, s1, e1, raw) in enumerate(
            [(20, 100, 50, 30, 3, 25), (30, 90, 90, 40, 2, 40), (10, 50, 20, 33, 1, 30)]
        )
    ]
    tables = generation.summarize(runs)
    ratios = {(r["ratio"], r["concurrency"]): r for r in tables["ratios"]}
    # ge ÷ llama per run: 2, 1, 2.5 -> 2.
    assert ratios[("ge ÷ llama-server", 16)]["tokens/s"] == 2.0
    # c16 ÷ c1 per run: 5, 3, 5 -> 5.
    assert ratios[("iteration c16 ÷ c1", "16 ÷ 1")]["tokens/s"] == 5.0
    steps = {(s["contender"], s["concurrency"]): s for s in tables["steps"]}
    assert ("llama", 16) not in steps
    # engine ÷ raw per run: 0.12, 0.05, 0.0333 -> 0.05.
    assert steps[("iteration", 1)]["engine ÷ raw"] == pytest.approx(0.05)
    assert steps[("iteration", 1)]["step ÷ raw"] == pytest.approx(1.1)
    rows = {(p["contender"], p["concurrency"]): p for p in tables["points"]}
    assert rows[("iteration", 16)]["tokens_per_s"] == 90
    assert rows[("iteration", 16)]["answer"] == "48"


def test_mixed_lengths_average_max_tokens_and_differ() -> None:
    lengths = genload.mixed_lengths(48)
    assert lengths == (8, 16, 24, 32, 48, 64, 80, 112)
    assert sum(lengths) / len(lengths) == 48
    assert min(genload.mixed_lengths(2)) >= 1
