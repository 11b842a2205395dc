"""A ResponseSink that keeps every response a decoupled model or ensemble sends, in order,
for a test to read after."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import NamedTuple

from ge_serve.backends.base import ModelError, ParamValue
from ge_serve.scheduler.work import Array


class Sent(NamedTuple):
    outputs: dict[str, Array] | None
    error: ModelError | None
    final: bool
    parameters: Mapping[str, ParamValue] | None


class RecordingSink:
    def __init__(self) -> None:
        self.sent: list[Sent] = []

    def send(
        self,
        outputs: dict[str, Array] | None,
        error: ModelError | None,
        final: bool,
        parameters: Mapping[str, ParamValue] | None = None,
    ) -> None:
        self.sent.append(Sent(outputs, error, final, parameters))

    @property
    def responses(self) -> list[dict[str, Array]]:
        """The outputs of every response that had any, in order."""
        return [sent.outputs for sent in self.sent if sent.outputs is not None]

    @property
    def errors(self) -> list[ModelError]:
        return [sent.error for sent in self.sent if sent.error is not None]

    @property
    def final(self) -> bool:
        """Whether the final response has been sent."""
        return any(sent.final for sent in self.sent)

    async def until_final(self, within_s: float = 6.0) -> None:
        """Wait (on the loop) for the final response; AssertionError past `within_s`."""
        deadline = asyncio.get_running_loop().time() + within_s
        while not self.final:
            assert asyncio.get_running_loop().time() < deadline, "no final response came"
            await asyncio.sleep(0.01)
