"""`n` > 1 on /v1/chat/completions and /v1/completions, as vLLM serves it (its parallel
sampling): n requests for the same prompt, sent to the model together, answered as one
(the `llm` engine's prefix sharing then computes the prompt once). Built here, over the
model contract, so any generative model /v1 serves answers n choices.

- With a `seed`, choice i is sampled with seed + i, as vLLM seeds its children: the
  choices differ, and each repeats.
- Not streamed: every choice's answer; the first to fail fails the request (its error),
  and the others are cancelled.
- Streamed: the choices' pieces as the model gives them, each with its index, and the end
  of each choice as an item of its own; one that fails ends the stream, and the others
  are cancelled. Closing the stream cancels them all.

`all_of` serves every route that sends one request for many items the same way: a
completions list of prompts, and the texts of /v1/embeddings, /score and /rerank.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Mapping
from typing import Any, TypeVar

from .answers import Piece

T = TypeVar("T")
# A choice's index and its next piece; None: the choice has ended.
Item = tuple[int, Piece | None]


def seeded(given: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    """The sampling parameters of each of `n` choices: vLLM's seed + i where a seed is set."""
    seed = given.get("seed")
    return [dict(given) if seed is None else {**given, "seed": seed + i} for i in range(n)]


async def all_of(awaitables: list[Awaitable[T]]) -> list[T]:
    """Each awaitable's result, run together; the first to fail (in order) raises, and
    the rest are cancelled, as they are when this is."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            failure = task.exception() if task.done() and not task.cancelled() else None
            if failure is not None:
                raise failure
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def one(stream: AsyncGenerator[Piece, None]) -> AsyncGenerator[Item, None]:
    """A single choice's pieces as items (no tasks, no queue: n = 1 costs what it did)."""
    async with contextlib.aclosing(stream):
        async for piece in stream:
            yield 0, piece
    yield 0, None


async def merged(streams: list[AsyncGenerator[Piece, None]]) -> AsyncGenerator[Item, None]:
    """The pieces of every stream as they come, choice i's tagged i, each stream's end
    too. A stream's error is raised here; leaving (closing this) cancels every stream."""
    # Bounded: a slow client holds the model's responses back, as with one choice.
    queue: asyncio.Queue[Item | Exception] = asyncio.Queue(len(streams))

    async def pump(index: int, stream: AsyncGenerator[Piece, None]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for piece in stream:
                    await queue.put((index, piece))
            await queue.put((index, None))
        except Exception as exc:  # an OpenAIError, or one to report as the stream's
            await queue.put(exc)

    tasks = [asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            running -= item[1] is None
            yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
