"""Closed-loop streamed chat load against an OpenAI-compatible server, and its bookkeeping.

`c` clients each send one streamed `/v1/chat/completions` request after another (the fixed
QUESTIONS, cycled, each client starting at its own offset), temperature 0, `max_tokens`
answers with `ignore_eos` (vLLM's field, which llama-server's requests take too), so every
answer has the same length on every server. After `warmup_s` the window opens; for
`duration_s` every token that arrives is counted; then the clients stop and the requests
still open are closed. With `mixed`, the answers' lengths vary (`mixed_lengths`: 8 to 112
tokens for 48, the same sequence for every server), so that a batch that runs to its
longest member shows what it costs.

Two clients send the same bytes: `httpx` (the default: one `httpx.AsyncClient`, the SSE
lines parsed here) and the official `openai` AsyncOpenAI client (`--client openai`). The
load generator shares the cores with the server, so each point records the generator's own
CPU seconds per generated token (`client_cpu_ms_per_token`): compare the two there.

Bookkeeping (pure, unit-tested): a request's record holds its start, the arrival time of
each content chunk and the completion tokens its `usage` reports (requested with
`stream_options.include_usage`; without usage, one token per content chunk). A chunk
counts one token; tokens the usage reports beyond the chunks (a token that added no text)
count at the usage chunk's arrival. TTFT is start to first content chunk; inter-token
latency the gaps between a request's consecutive content chunks. A window counts the TTFT
of each request whose first token arrived in it (counting those started in it would drop
the slowest ones whenever a window is shorter than a queue), and the gaps that ended in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

QUESTIONS = (
    "What is the capital of France?",
    "Give me three tips for better sleep.",
    "Explain what a prime number is.",
    "How do plants make their food?",
    "Write a short poem about the sea.",
    "Why is the sky blue?",
    "What does a database index do?",
    "Name some healthy breakfast ideas.",
    "How does a bicycle stay upright?",
    "What is the difference between weather and climate?",
    "Summarize the plot of Romeo and Juliet.",
    "How can I learn to cook?",
    "What is machine learning?",
    "Describe a good morning routine.",
    "Why do cats purr?",
    "How do vaccines work?",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default);
    None for no values."""
    return float(np.percentile(values, q)) if values else None


@dataclass
class RequestRecord:
    """One streamed request: perf_counter times, and what its chunks said."""

    start: float
    chunks: list[float] = field(default_factory=list)
    usage_tokens: int | None = None
    usage_at: float | None = None
    prompt_tokens: int | None = None
    error: str | None = None

    def on_event(self, event: dict[str, Any], at: float) -> None:
        """One SSE `data:` JSON object (a chat.completion.chunk) that arrived `at`."""
        for choice in event.get("choices") or ():
            content = (choice.get("delta") or {}).get("content")
            if content:
                self.chunks.append(at)
        usage = event.get("usage")
        if usage:
            self.usage_tokens = int(usage.get("completion_tokens") or 0)
            self.prompt_tokens = usage.get("prompt_tokens")
            self.usage_at = at

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.chunks)

    def token_times(self) -> list[float]:
        """When each token arrived: one per chunk, the rest the usage reports at its chunk."""
        extra = max(0, self.tokens - len(self.chunks))
        at = self.usage_at if self.usage_at is not None else (self.chunks or [self.start])[-1]
        return self.chunks + [at] * extra

    @property
    def ttft(self) -> float | None:
        return self.chunks[0] - self.start if self.chunks else None

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.chunks, self.chunks[1:], strict=False)]


# A kept-alive connection the server closed as the request went out (llama-server's HTTP
# library closes idle ones): the request never reached it, and is sent again once, as
# the openai client's own retries would.
STALE_CONNECTION = ("RemoteProtocolError", "APIConnectionError", "ConnectError", "ReadError")


def is_stale_connection(exc: BaseException) -> bool:
    return type(exc).__name__ in STALE_CONNECTION


def parse_sse_line(line: str) -> dict[str, Any] | None:
    """The JSON of one `data:` line; None for other lines and `[DONE]`."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    event: dict[str, Any] = json.loads(payload)
    return event


def summarize(records: Sequence[RequestRecord], t0: float, t1: float) -> dict[str, Any]:
    """A point's figures over the window [t0, t1): tokens/s of the tokens that arrived in
    it; TTFT of the requests whose first token arrived in it; the chunk gaps that ended
    in it."""
    tokens = sum(1 for r in records for t in r.token_times() if t0 <= t < t1)
    ttfts = [r.ttft for r in records if r.ttft is not None and t0 <= r.chunks[0] < t1]
    gaps = [
        g for r in records for g, end in zip(r.gaps(), r.chunks[1:], strict=False) if t0 <= end < t1
    ]
    finished = [r for r in records if r.usage_at is not None and t0 <= r.usage_at < t1]
    answers = sorted({r.tokens for r in finished})
    prompts = [r.prompt_tokens for r in finished if r.prompt_tokens]

    def ms(values: Sequence[float], q: float) -> float | None:
        p = percentile(values, q)
        return None if p is None else p * 1e3

    return {
        "tokens_per_s": tokens / (t1 - t0),
        "tokens": tokens,
        "requests_finished": len(finished),
        "errors": sum(1 for r in records if r.error),
        "first_error": next((r.error for r in records if r.error), None),
        "answer_tokens": answers,
        "prompt_tokens_mean": statistics.fmean(prompts) if prompts else None,
        "ttft_p50_ms": ms(ttfts, 50),
        "ttft_p99_ms": ms(ttfts, 99),
        "itl_p50_ms": ms(gaps, 50),
        "itl_p99_ms": ms(gaps, 99),
    }


def median_ratio(
    numerators: Sequence[float | None], denominators: Sequence[float | None]
) -> float | None:
    """The median over runs of each run's ratio (runs where either side is missing or the
    denominator is 0 are left out); None when no run has both."""
    ratios = [n / d for n, d in zip(numerators, denominators, strict=True) if n is not None and d]
    return statistics.median(ratios) if ratios else None


@dataclass(frozen=True)
class Target:
    """An OpenAI-compatible server: its /v1 base URL and the model name it serves."""

    base_url: str
    model: str


# Answer lengths as multiples of max_tokens, averaging 1: under request-level batching a
# batch runs to its longest member, which only shows when lengths differ.
MIXED_FRACTIONS = (1 / 6, 1 / 3, 1 / 2, 2 / 3, 1, 4 / 3, 5 / 3, 7 / 3)


def mixed_lengths(max_tokens: int) -> tuple[int, ...]:
    """Answer lengths averaging about `max_tokens` (8 to 112 for 48)."""
    return tuple(max(1, round(max_tokens * f)) for f in MIXED_FRACTIONS)


def request_body(target: Target, question: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": target.model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _httpx_request(
    client: Any, target: Target, body: dict[str, Any], record: RequestRecord
) -> None:
    async with client.stream("POST", f"{target.base_url}/chat/completions", json=body) as r:
        if r.status_code != 200:
            record.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            return
        async for line in r.aiter_lines():
            event = parse_sse_line(line)
            if event is not None:
                record.on_event(event, time.perf_counter())


async def _openai_request(
    client: Any, target: Target, body: dict[str, Any], record: RequestRecord
) -> None:
    extra = {"ignore_eos": body["ignore_eos"]}
    stream = await client.chat.completions.create(
        model=body["model"],
        messages=body["messages"],
        max_tokens=body["max_tokens"],
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=extra,
    )
    async for chunk in stream:
        record.on_event(chunk.model_dump(), time.perf_counter())


async def run_point(
    target: Target,
    concurrency: int,
    warmup_s: float,
    duration_s: float,
    max_tokens: int,
    client_kind: str = "httpx",
    mixed: bool = False,
) -> dict[str, Any]:
    """Drive `concurrency` closed-loop clients; the point's figures (see `summarize`).
    `mixed`: answer lengths from `mixed_lengths(max_tokens)`, each client going through
    them in turn from its own offset, instead of `max_tokens` each."""
    import httpx

    records: list[RequestRecord] = []
    retried: list[RequestRecord] = []
    lengths = mixed_lengths(max_tokens) if mixed else (max_tokens,)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    http = httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits)
    closers = [http.aclose]
    if client_kind == "openai":
        from openai import AsyncOpenAI

        # Its own HTTP client (openai 3 is built on httpx2, not httpx); no retries, so a
        # failure shows as one.
        client: Any = AsyncOpenAI(
            base_url=target.base_url, api_key="none", max_retries=0, timeout=300.0
        )
        closers.append(client.close)
        send = _openai_request
    else:
        client, send = http, _httpx_request
    began = time.perf_counter()
    t0, t1 = began + warmup_s, began + warmup_s + duration_s

    async def worker(index: int) -> None:
        n = index
        turn = index
        while time.perf_counter() < t1:
            length = lengths[turn % len(lengths)]
            body = request_body(target, QUESTIONS[n % len(QUESTIONS)], length)
            n += concurrency
            turn += 1
            # Filled in place, so a request closed at the window's end keeps its chunks.
            record = RequestRecord(time.perf_counter())
            records.append(record)
            for attempt in (0, 1):
                try:
                    await send(client, target, body, record)
                    break
                except Exception as exc:  # a transport error is counted, not fatal
                    if attempt == 0 and not record.chunks and is_stale_connection(exc):
                        retried.append(record)
                        record.start = time.perf_counter()
                        continue
                    record.error = f"{type(exc).__name__}: {exc}"
                    await asyncio.sleep(0.1)

    cpu0 = time.process_time()
    tasks = [asyncio.create_task(worker(i)) for i in range(concurrency)]
    await asyncio.sleep(max(0.0, t1 - time.perf_counter()))
    # Requests still open at the window's end are closed (the server frees them).
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    cpu = time.process_time() - cpu0
    for close in closers:
        await close()
    point = summarize(records, t0, t1)
    total = sum(r.tokens for r in records)
    point["client_cpu_ms_per_token"] = cpu * 1e3 / total if total else None
    point["concurrency"] = concurrency
    point["retried"] = len(retried)
    return point
