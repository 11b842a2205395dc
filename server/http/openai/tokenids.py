"""Token ids on /v1, as vLLM 0.34 gives them: its `return_token_ids` (chat and
completions), and the count of thought tokens with --reasoning-parser (chat's
`usage.completion_tokens_details.reasoning_tokens`, the Responses API's
`output_tokens_details.reasoning_tokens`).

The generated ids are what the model reports in TensorRT-LLM's `output_ids` output (the
`llm` engine sends each response's tokens there where the config declares it), read
only where asked for: a model without that output is a 400 on `return_token_ids`, and
its thoughts count 0. A prompt's ids are its token ids as given, or its text tokenized
with the model's tokenizer, the one the `llm` engine tokenizes it with; a model whose
tokenizer the server does not hold (a Python model tokenizes inside itself) is a 400
for a text prompt.

Thoughts are counted on the ids, as vLLM's parsers count them: `deepseek_r1` (vLLM's
BaseThinkingReasoningParser) counts the tokens between a generated `<think>` and its
`</think>` (nested spans by depth, a stray `</think>` ignored), so thoughts a template
opened in the prompt count 0; `qwen3` (vLLM's parser engine) counts every token of the
thoughts, from the first where thinking is on, the tag tokens not counted, up to
`</think>` or `<tool_call>`. The tags are the model tokenizer's single tokens; a
tokenizer without `<think>` and `</think>` as tokens of their own, alone and beside
other text (vLLM refuses such a parser at start) counts nothing: chat's
`completion_tokens_details` is null.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from ge_serve.backends.base import TextTokenizer
from ge_serve.backends.llm.thinking import single_id
from ge_serve.server.inference.model import ModelVersion
from ge_serve.server.inference.types import InferResponse

from .catalog import text_generation
from .errors import unsupported
from .prompts import THREADED, Prompt
from .reasoning import Reasoning

OUTPUT_IDS = "output_ids"
FIELD = "return_token_ids"
_TOOL_CALL = "<tool_call>"


def reported(model: ModelVersion) -> bool:
    """Whether the model reports its generated ids (an integer `output_ids` output)."""
    spec = model.outputs.get(OUTPUT_IDS)
    return spec is not None and spec.datatype.numpy.kind in "iu"


def output_ids(response: InferResponse) -> list[int]:
    """A response's generated ids ([] where it has none)."""
    for tensor in response.outputs:
        if tensor.name == OUTPUT_IDS:
            return [int(i) for i in np.asarray(tensor.data).reshape(-1).tolist()]
    return []


def check_reported(model: ModelVersion) -> None:
    """A 400 on `return_token_ids` where the model does not report its generated ids."""
    if not reported(model):
        raise unsupported(
            FIELD,
            f"'{FIELD}' is not supported by the model '{model.name}': it reports no token "
            f"ids (it has no '{OUTPUT_IDS}' output)",
        )


async def prompt_ids(
    model: ModelVersion, asked: bool | None, prompts: list[Prompt], special: bool = True
) -> list[list[int]] | None:
    """Each prompt's ids where `return_token_ids` asks for them (None where not); a 400
    where the model does not report its generated ids, or a text prompt's ids are not
    known here. `special`: the request's `add_special_tokens` (a chat's default false:
    its template writes them)."""
    if not asked:
        return None
    check_reported(model)
    if all(isinstance(prompt, list) for prompt in prompts):
        return [list(prompt) for prompt in prompts]  # type: ignore[arg-type]
    generation = text_generation(model)
    tokenizer = None if generation is None else generation.tokenizer
    if tokenizer is None:
        raise unsupported(
            FIELD,
            f"'{FIELD}' with a text prompt needs the model's tokenizer, and the model "
            f"'{model.name}' has none ge-serve can use: it tokenizes inside the model",
        )

    def encoded() -> list[list[int]]:
        return [p if isinstance(p, list) else tokenizer.encode(p, special) for p in prompts]

    if sum(len(p) for p in prompts) > THREADED:
        return await asyncio.to_thread(encoded)
    return encoded()


def _single(tokenizer: TextTokenizer, tag: str) -> int | None:
    """`tag`'s id where it is a token of its own (the budget's rule, thinking.py)."""
    return single_id(tag, tokenizer.encode)


@dataclass(frozen=True, slots=True)
class Tags:
    """How a request's thoughts are counted: the parser, the tags' token ids, and whether
    the answer begins in its thoughts (qwen3's thinking, reasoning.py)."""

    qwen3: bool
    start: int | None
    end: int | None
    call: int | None
    thinking: bool

    @property
    def counted(self) -> bool:
        """Whether the ids are read to count (else the count stays 0)."""
        return self.start is not None and self.end is not None

    def thoughts(self) -> Thoughts:
        return Thoughts(self)


def tags(model: ModelVersion, use: Reasoning | None) -> Tags | None:
    """How `model`'s thoughts are counted under `use` (the request's --reasoning-parser
    plan; None: no parser, no count). Without ids or tag tokens, nothing is counted."""
    if use is None:
        return None
    qwen3 = use.parser == "qwen3"
    generation = text_generation(model)
    tokenizer = None if generation is None else generation.tokenizer
    # A parser that reads text (granite, olmo3) has no tag tokens to count on.
    if tokenizer is None or not reported(model) or use.tags is None:
        return Tags(qwen3, None, None, None, False)
    opening, closing = use.tags
    start, end = _single(tokenizer, opening), _single(tokenizer, closing)
    if start is None or end is None:
        return Tags(qwen3, None, None, None, False)
    call = _single(tokenizer, _TOOL_CALL) if qwen3 else None
    return Tags(qwen3, start, end, call, use.thinking)


class Thoughts:
    """One answer's thought tokens, counted as its ids come (vLLM's count_reasoning_tokens
    for the parser)."""

    __slots__ = ("count", "depth", "open", "tags")

    def __init__(self, tags: Tags) -> None:
        self.tags = tags
        # qwen3: still in the thoughts; deepseek_r1: how many `<think>` are open.
        self.open = tags.thinking and tags.counted
        self.depth = 0
        self.count = 0

    def feed(self, ids: list[int]) -> None:
        tags = self.tags
        if tags.qwen3:
            for token in ids if self.open else ():
                if token == tags.end or token == tags.call:
                    self.open = False
                    return
                self.count += token != tags.start
            return
        for token in ids if tags.counted else ():
            if token == tags.start:
                self.depth += 1
            elif token == tags.end:
                self.depth -= self.depth > 0
            elif self.depth:
                self.count += 1


def thoughts(tags: Tags | None) -> Thoughts | None:
    """A fresh count for one answer (None: not counted: no parser, or no ids or tag tokens
    to count on, where a count of 0 would say the answer had no thoughts)."""
    return None if tags is None or not tags.counted else Thoughts(tags)


def summed(parts: list[Thoughts | None]) -> Thoughts | None:
    """The choices' counts together (vLLM's usage sums its choices')."""
    if not parts or parts[0] is None:
        return None
    total = Thoughts(parts[0].tags)
    total.count = sum(part.count for part in parts if part is not None)
    return total
