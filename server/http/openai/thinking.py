"""vLLM's `thinking_token_budget` on /v1 (chat, completions, the Responses API, and the
Messages API's `thinking.budget_tokens`): checked with vLLM's rule and words, and given
to the `llm` engine in its `sampling_parameters` with the --reasoning-parser's markers
(reasoning.py's `<think>` and `</think>`), which vLLM's engine knows from the parser and
this engine is told (backends/llm/thinking.py counts and forces).

Without --reasoning-parser the budget is a 400 in vLLM's words; a model other than the
`llm` engine's would fail on the engine's own keys (a Python model builds vLLM's
SamplingParams from them): a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from ge_serve.backends.llm.thinking import BUDGET, END, NOT_A_BUDGET, START, budget_of
from ge_serve.server.inference.model import ModelVersion

from . import reasoning
from .errors import OpenAIError, unsupported
from .generation import SAMPLING

# vLLM's words (its input processor) for a budget without a reasoning parser.
NO_PARSER = (
    "thinking_token_budget is set but reasoning_config is not configured. Please set "
    "--reasoning-parser and/or --reasoning-config to use thinking_token_budget."
)


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
    given[START], given[END] = reasoning.START, reasoning.END
