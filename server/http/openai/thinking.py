"""vLLM's `thinking_token_budget` on /v1 (chat, completions, the Responses API, and the
Messages API's `thinking.budget_tokens`): checked with vLLM's rule and words, and given
to the `llm` engine in its `sampling_parameters` with the --reasoning-parser's markers
(reasoning.py's `<think>` and `</think>`), which vLLM's engine knows from the parser and
this engine is told (backends/llm/thinking.py counts and forces).

Without --reasoning-parser the budget is a 400 in vLLM's words; a model other than the
`llm` engine's would fail on the engine's own keys (a Python model builds vLLM's
SamplingParams from them): a 400 naming the field; so is a model whose tokenizer lacks
`<think>` and `</think>` as tokens of their own (vLLM refuses such a parser at start).
Where a grammar applies from the first token (the prompt closed the thoughts, or qwen3's
thinking is off) the thoughts are closed: the budget is not sent (the engine refuses a
budget under a grammar it cannot force the end through); on completions, whose grammar
applies to the thoughts too, such a budget is a 400.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import WithJsonSchema

from ge_serve.backends.llm.thinking import (
    BUDGET,
    END,
    NOT_A_BUDGET,
    START,
    budget_of,
    single_id,
)
from ge_serve.server.inference.model import ModelVersion

from . import reasoning
from .errors import OpenAIError, unsupported
from .generation import SAMPLING
from .structured import AFTER, KEY

# vLLM's words (its input processor) for a budget without a reasoning parser.
NO_PARSER = (
    "thinking_token_budget is set but reasoning_config is not configured. Please set "
    "--reasoning-parser and/or --reasoning-config to use thinking_token_budget."
)

# The field's type in a body: any value, checked by `checked` with vLLM's words (a
# pydantic int would refuse 1.5 in its own); its schema is vLLM's, integer or null.
Budget = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "null"}]})]


def checked(value: Any) -> int | None:
    """The request's budget (None: unset or -1, unlimited); vLLM's 400 otherwise."""
    try:
        return budget_of(value)
    except ValueError:
        raise OpenAIError(NOT_A_BUDGET, param=BUDGET) from None


def add_markers(parser: str, model: ModelVersion, given: dict[str, Any]) -> None:
    """Where `given` (the request's sampling keys) holds a budget, the markers of the
    parser's thoughts beside it; the 400s where it cannot be served."""
    if BUDGET not in given:
        return
    if not parser:
        raise OpenAIError(NO_PARSER, param=BUDGET)
    generation = model.loaded.text_generation
    if SAMPLING not in model.inputs or generation is None or not generation.thinking_budget:
        raise unsupported(
            BUDGET,
            f"'{BUDGET}' needs a model of the 'llm' backend, whose '{SAMPLING}' the server "
            f"tells where the thoughts start and end: the model '{model.name}' is not one",
        )
    tokenizer = generation.tokenizer
    tags = reasoning.tags_of(parser)
    if tags is None:
        raise unsupported(
            BUDGET,
            f"'{BUDGET}' needs think start/end tokens, and the {parser} reasoning parser reads "
            "its model's thoughts from text, not from tokens",
        )
    opening, closing = tags
    for tag in (opening, closing):
        if tokenizer is None or single_id(tag, tokenizer.encode) is None:
            raise OpenAIError(
                f"'{BUDGET}' needs the reasoning parser's think start/end tokens "
                f"({opening!r}, {closing!r}) as single tokens of the model's "
                f"tokenizer: the {parser} reasoning parser could not locate think start/end "
                f"tokens in the tokenizer of the model '{model.name}'",
                param=BUDGET,
            )
    given[START], given[END] = opening, closing


def grammar_first(given: dict[str, Any], planned: bool) -> dict[str, Any]:
    """`given` where no grammar applies from the first token; without the budget where
    one does and the parser `planned` the answer (its thoughts are closed, the module's
    doc); a 400 where it did not (completions: the grammar would hold the thoughts too)."""
    if BUDGET not in given or KEY not in given or AFTER in given:
        return given
    if not planned:
        raise OpenAIError(
            f"'{BUDGET}' cannot be enforced with structured outputs on completions: the "
            "grammar applies from the first token, thoughts included, and the end of the "
            "thoughts could not be forced through it",
            param=BUDGET,
        )
    return {key: value for key, value in given.items() if key not in (BUDGET, START, END)}
