"""The chat path that /v1/responses and /v1/messages share (responses_serve.py,
anthropic_serve.py): a body, made a chat request, becomes the model's request (its
model, tools.plan's tool use, the chat template's prompt, --reasoning-parser's
thoughts and the grammar after them, the sampling with vLLM's priority), whose answer
comes whole or, streamed, from its first piece on. Each refusal names the field as the
route's API names it (`Route.renamed`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass

from starlette.requests import Request

from ge_serve.server.control.requestlog import Outputs
from ge_serve.server.inference.model import ModelVersion
from ge_serve.server.inference.types import InferRequest

from ..disconnects import until_disconnect
from . import reasoning, tokenids
from .answers import Params, Piece, Usage, collect, pieces
from .catalog import Catalog
from .errors import OpenAIError
from .generation import after_thoughts, build_request, keep_special_tokens, takes_constraints
from .logprobs import Entry
from .reasoning import Reasoning
from .schemas import ChatCompletionRequest
from .structured import AFTER, constrained
from .template import variables
from .text import add_priority, chat_prompt, check_limit
from .thinking import add_markers, grammar_first
from .tokenids import Tags
from .tools import ToolUse, plan, template_tools


@dataclass(frozen=True, slots=True)
class Route:
    """How an API on the chat path names what chat's request holds."""

    # vLLM's name of the API (in its words for a server without a generative model).
    api: str
    # The body's token limit's field, and the prompt's (what a model's refusal names).
    limit_field: str
    prompt_field: str
    renamed: Callable[[OpenAIError], OpenAIError]
    include_reasoning: bool = True
    # vLLM's Responses usage: the thoughts counted on the ids, the cached tokens always.
    details: bool = False


@dataclass(slots=True)
class Planned:
    """A body's request to its model, and how to read the answer."""

    route: Route
    name: str
    model: ModelVersion
    tools: ToolUse | None
    thinking: Reasoning | None
    tags: Tags | None
    request: InferRequest
    params: Params
    # --enable-log-outputs: the whole answers are logged (control/requestlog.py).
    outputs: Outputs | None = None


async def prepare(
    catalog: Catalog,
    request: Request,
    chat: ChatCompletionRequest,
    route: Route,
    *,
    model: str | None,
    limit: int | None,
    stream: bool,
    output_field: str,
    priority: int | None = None,
    answer_id: str = "",
) -> Planned:
    """The request to the generative model `model` names; `output_field`: the field
    whose structured outputs constrain an answer without forced tools."""
    name, found = catalog.generator(model, route.api)
    generation = catalog.chat_generation(name, found, chat.chat_template)
    check_limit(limit, generation.max_model_len, route.limit_field)
    chosen = chat.chosen_tool()
    tools: ToolUse | None = None
    try:
        if chosen != "auto" or catalog.tools.parser:
            given_constraints = takes_constraints(found.inputs)
            tools = plan(chosen, catalog.tools, given_constraints, name, chat.parallel_tool_calls)
        given_tools = template_tools(chat.tools, chat.tool_choice, catalog.tools)
        prompt = await chat_prompt(catalog, generation, chat, given_tools, request)
        given = chat.sampling()  # the tools' schemas checked for "required"
    except OpenAIError as exc:
        raise route.renamed(exc) from None
    add_priority(request, given, priority)
    try:
        add_markers(catalog.tools.reasoning_parser, found, given)
    except OpenAIError as exc:  # Anthropic's names it `thinking.budget_tokens`
        raise route.renamed(exc) from None
    thinking = None
    if catalog.tools.reasoning_parser:
        field = constrained(given, chosen, output_field)
        thinking = reasoning.plan(
            catalog.tools.reasoning_parser,
            route.include_reasoning,
            variables(chat, catalog.chat),
            prompt,
            field,
        )
        if field is not None and thinking is not None and thinking.after is not None:
            after_thoughts(found, field)
            given[AFTER] = thinking.after  # the grammar after the thoughts
    keep_special_tokens(found, given, tools, thinking)
    given = grammar_first(given, thinking is not None)
    tags = tokenids.tags(found, thinking) if route.details else None
    counted = tags is not None and tags.counted  # the thought tokens counted on the ids
    # vLLM fills the Responses API's `input_tokens_details.cached_tokens` always, the
    # Messages API's `cache_read_input_tokens` with --enable-prompt-tokens-details.
    cached = route.details or catalog.tools.prompt_tokens_details
    try:
        infer_request, sent = build_request(
            found, prompt, stream, given, ids=counted, cached=cached, chat=True
        )
    except OpenAIError as exc:  # a refusal names this API's field
        raise route.renamed(exc) from None
    params = Params(route.prompt_field, sent, counted, cached=cached)
    catalog.log.received(answer_id, prompt, given)
    outputs = catalog.log.outputs_of(answer_id)
    return Planned(route, name, found, tools, thinking, tags, infer_request, params, outputs)


async def whole(
    catalog: Catalog, request: Request, planned: Planned
) -> tuple[str, str, Usage, list[Entry]]:
    """The whole answer (answers.collect), cancelled with a client that leaves."""
    counting = tokenids.thoughts(planned.tags)
    try:
        found = await until_disconnect(
            request, collect(catalog.core, planned.request, planned.params, counting)
        )
    except OpenAIError as exc:
        raise planned.route.renamed(exc) from None
    if planned.outputs is not None:
        planned.outputs.whole(0, found[0], found[1])
    return found


async def first_piece(
    catalog: Catalog, request: Request, planned: Planned
) -> tuple[Piece | None, AsyncGenerator[Piece, None]]:
    """The answer's first piece and the rest: the stream's status waits for the model's
    first response, as chat's does, so a request it refuses at once is a plain error."""
    rest = pieces(catalog.core, planned.request, planned.params)
    try:
        first = await until_disconnect(request, anext(rest, None))
    except OpenAIError as exc:
        await rest.aclose()
        raise planned.route.renamed(exc) from None
    except BaseException:
        await rest.aclose()
        raise
    if planned.outputs is not None and first is not None:
        planned.outputs.piece(0, first.text, first.finish_reason)
        rest = _logged(planned.outputs, rest)
    return first, rest


async def _logged(
    outputs: Outputs, rest: AsyncGenerator[Piece, None]
) -> AsyncGenerator[Piece, None]:
    """`rest`, each piece logged (--enable-log-outputs), and the whole text at its end;
    nothing more where it ends otherwise (an error, the client gone), as vLLM's."""
    async with contextlib.aclosing(rest):
        async for piece in rest:
            outputs.piece(0, piece.text, piece.finish_reason)
            yield piece
    outputs.complete()
