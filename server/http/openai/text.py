"""`POST /v1/chat/completions` and `POST /v1/completions`.

Both check the body, find the generative model, build its prompt (chat renders the
messages with the model's chat template; a model without one is a 400 that points to
/v1/completions) and run it through the core.

Not streamed, the answer waits for the model's last response; a client that leaves
before then cancels the request. Streamed, textstream.py sends the answer's chunks.

With `n` > 1 (choices.py), the n generations run together: not streamed, one answer with
n choices; streamed, each choice's chunks as they come, with its index, each choice's
closing chunk when it ends, and the usage chunk once, after all. A completions request
with a list of prompts (prompts.py) runs each prompt n times the same way, all together:
prompt p's choice i is index p * n + i, as vLLM's; so does a batch of conversations
(chatbatch.py), each with its own role, echo and thoughts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ge_serve.backends.base import TextGeneration
from ge_serve.server.inference.model import ModelVersion
from ge_serve.server.inference.types import InferRequest

from ..disconnects import until_disconnect
from . import fields, reasoning, structured, textstream, thinking, tokenids
from .answers import Params, Usage, cached_total, collect
from .catalog import Catalog, text_generation
from .choices import all_of, seeded
from .errors import CONTEXT_LENGTH_EXCEEDED, OpenAIError
from .generation import (
    PRIORITY,
    Array,
    add_special,
    after_thoughts,
    build_request,
    ids_array,
    ids_input,
    keep_special_tokens,
    takes_constraints,
)
from .logprobs import Logprobs
from .objects import Answer
from .prompts import IDS_INLINE, THREADED, Prompt, check_fit, echo_texts
from .schemas import ChatCompletionRequest, ChatOptions, CompletionRequest, Sampling
from .template import RENDERED_ON_THE_LOOP, render_request, variables
from .tools import plan, template_tools

# vLLM's names of the APIs, in its words for a server without a generative model.
CHAT_API = "Chat Completions API"
# vLLM's header whose integer value overrides the body's `priority`.
PRIORITY_HEADER = "X-Vllm-Priority"


async def chat_completion(
    catalog: Catalog, request: Request, body: ChatCompletionRequest
) -> Response:
    name, model, generation = chat_model(catalog, body)
    chosen, parallel = body.chosen_tool(), body.parallel_tool_calls
    constrained = takes_constraints(model.inputs)
    tool_use = plan(chosen, catalog.tools, constrained, name, parallel)
    tools = template_tools(body.tools, body.tool_choice, catalog.tools)
    prompt = await chat_prompt(catalog, generation, body, tools, request)
    forced = catalog.tools.force_include_usage
    answer = identity(
        request,
        body,
        name,
        chat=True,
        role=body.answer_role(catalog.chat.response_role),
        echo=body.echoed(catalog.chat.response_role),
        forced_usage=forced,
    )
    answer.tools = tool_use
    count = body.shown_logprobs()
    as_ids = as_token_ids(catalog, body.return_tokens_as_token_ids)
    answer.logprobs = None if count is None else Logprobs(True, count, as_ids)
    plan_thoughts(catalog, model, body, prompt, answer)
    special = add_special(body.add_special_tokens, chat=True)
    ids = await tokenids.prompt_ids(model, body.return_token_ids, [prompt], special)
    return await answer_prompts(
        catalog, request, model, body, [prompt], answer, ids=ids, special=body.add_special_tokens
    )


def chat_model(catalog: Catalog, body: ChatOptions) -> tuple[str, ModelVersion, TextGeneration]:
    """The generative model a chat request names (or the one the server serves), its name
    and generation; a 400 where it has no chat template or the request's token limit
    cannot fit its context."""
    name, model = catalog.generator(body.model, CHAT_API)
    generation = catalog.chat_generation(name, model, body.chat_template)
    check_limit(body.token_limit(), generation.max_model_len)
    return name, model, generation


def plan_thoughts(
    catalog: Catalog, model: ModelVersion, body: ChatCompletionRequest, prompt: str, answer: Answer
) -> None:
    """With --reasoning-parser, how `answer` (to the chat rendered as `prompt`) splits
    its thoughts from its content, and counts them."""
    if not catalog.tools.reasoning_parser:
        return
    output = "response_format" if body.response_format is not None else "structured_outputs"
    field = structured.constrained(body.sampling(), body.chosen_tool(), output)
    answer.reasoning = reasoning.plan(
        catalog.tools.reasoning_parser,
        body.include_reasoning,
        variables(body, catalog.chat),
        prompt,
        field,
    )
    if field is not None and answer.reasoning is not None and answer.reasoning.after:
        after_thoughts(model, field)
    if answer.reasoning is not None and not answer.reasoning.include:
        answer.logprobs = None  # vLLM's: hidden thoughts hide the tokens' logprobs too
    answer.tags = tokenids.tags(model, answer.reasoning)


async def completion(catalog: Catalog, request: Request, body: CompletionRequest) -> Response:
    name, model = catalog.generator(body.model, "Completions API")
    generation = text_generation(model)
    if generation is not None:
        check_limit(body.token_limit(), generation.max_model_len)
    prompts = body.prompts()
    if not isinstance(prompts[0], str):
        ids_input(model)  # its refusal before echo's need of a tokenizer
        if generation is not None:
            check_fit(prompts, generation.max_model_len)
    echoes = await echo_texts(model, prompts) if body.echo else None
    echo = echoes[0] if echoes else ""
    forced = catalog.tools.force_include_usage
    answer = identity(request, body, name, chat=False, echo=echo, forced_usage=forced)
    answer.echo_only = body.echo_only()
    as_ids = as_token_ids(catalog, body.return_tokens_as_token_ids)
    count = body.shown_logprobs()
    answer.logprobs = None if count is None else Logprobs(False, count, as_ids)
    special = add_special(body.add_special_tokens, chat=False)
    firsts = None
    # The echo's first token is known by the text the others leave, except a special
    # token the tokenizer adds (a BOS, which the text lacks), or where its id is shown.
    adds = special and generation is not None and bool(generation.adds_special_tokens)
    if echoes and answer.logprobs is not None and (as_ids or adds):
        firsts = [await _first_token(generation, p, special) for p in prompts]
        answer.echo_id, answer.echo_first = firsts[0]
    ids = await tokenids.prompt_ids(model, body.return_token_ids, prompts, special)
    return await answer_prompts(
        catalog, request, model, body, prompts, answer, echoes, firsts, ids,
        special=body.add_special_tokens,
    )  # fmt: skip


def _logged(answer: Answer, p: int, heads: list[Answer] | None) -> str:
    """Prompt p's id in the request log, as vLLM's: a completion's `<id>-<p>`, a batch
    chat's conversation's `<id>_<p>`, a chat's the answer's."""
    if not answer.chat:
        return f"{answer.id}-{p}"
    return answer.id if heads is None else f"{answer.id}_{p}"


async def _as_sent(model: ModelVersion, prompts: list[Prompt]) -> list[str | Array]:
    """Each prompt as its requests carry it: a text, or its ids as one array in the dtype
    of the model's `input_ids`, shared by the prompt's n requests (many ids: converted on
    a worker thread)."""
    if all(isinstance(prompt, str) for prompt in prompts):
        return prompts  # type: ignore[return-value]

    def converted() -> list[str | Array]:
        return [p if isinstance(p, str) else ids_array(model, p) for p in prompts]

    if sum(len(p) for p in prompts if isinstance(p, list)) > IDS_INLINE:
        return await asyncio.to_thread(converted)
    return converted()


async def _first_token(
    generation: TextGeneration | None, prompt: Prompt, special: bool = True
) -> tuple[int | None, str]:
    """The prompt's first token id (vLLM's `token_id:<id>` of the echo's first token):
    a text's by the model's tokenizer, as the model tokenizes it; None without one. And
    its text, special tokens kept (vLLM's decode of it), "" where not known."""
    tokenizer = None if generation is None else generation.tokenizer
    if not isinstance(prompt, str):
        first = prompt[0]
    elif tokenizer is None:
        return None, ""
    else:
        if len(prompt) > THREADED:
            ids = await asyncio.to_thread(tokenizer.encode, prompt, special)
        else:
            ids = tokenizer.encode(prompt, special)
        if not ids:
            return None, ""
        first = ids[0]
    return first, "" if tokenizer is None else tokenizer.decode([first], False)


async def chat_prompt(
    catalog: Catalog,
    generation: TextGeneration,
    body: ChatCompletionRequest,
    tools: list[dict[str, Any]] | None = None,
    request: Request | None = None,
) -> str:
    """The chat's prompt (template.render_request, for a model with a chat template,
    under the server's chat settings), rendered off the loop when long; the request's own
    template, stopped if its `request`'s client leaves."""
    work = functools.partial(render_request, generation, body, tools, catalog.chat)
    if body.chat_template:
        # The request's own (--trust-request-chat-template): the client's code.
        rendered = catalog.own_template(work)
        return await (rendered if request is None else until_disconnect(request, rendered))
    if len(body.messages) > RENDERED_ON_THE_LOOP:
        # A template walks every message in Python: seconds for a million of them.
        return await asyncio.to_thread(work)
    return work()


def identity(
    request: Request,
    body: Sampling,
    name: str,
    *,
    chat: bool,
    role: str = "assistant",
    echo: str = "",
    forced_usage: bool = False,
) -> Answer:
    """The answer's identity; `name`: the model it echoes (the one served, where the
    request names none); `forced_usage`: --enable-force-include-usage, usage on every
    stream and on each of its chunks, whatever `stream_options` say (vLLM's)."""
    stream = bool(body.stream)
    return Answer(
        name,
        chat,
        include_usage=stream and (forced_usage or body.include_usage()),
        continuous_usage=stream and (forced_usage or body.continuous_usage()),
        role=role,
        echo=echo,
        id=request_id(request, body.request_id),
    )


def as_token_ids(catalog: Catalog, given: bool | None) -> bool:
    """vLLM's: the request's `return_tokens_as_token_ids`, else the server's
    --return-tokens-as-token-ids."""
    return catalog.tools.tokens_as_ids if given is None else given


def request_id(request: Request, given: str | None) -> str:
    """vLLM's: the `X-Request-Id` header (a gateway's trace id), else the body's
    `request_id`; empty where neither is given (the answer gets a fresh one)."""
    return request.headers.get("x-request-id") or given or ""


def add_priority(request: Request, given: dict[str, Any], body: int | None) -> None:
    """vLLM's request priority into `given` (the sampling keys; the `llm` engine reads
    it there, build_request): the `X-Vllm-Priority` header where it reads as an integer
    (vLLM's _get_priority), else the body's; left out at 0, the default."""
    found = request.headers.get(PRIORITY_HEADER)
    value = body
    if found is not None:
        with contextlib.suppress(ValueError):
            value = int(found)
        if value is not None and not fields.INT64_MIN <= value <= fields.INT64_MAX:
            # The body's bound (a 400 there too); vLLM would take any integer.
            raise OpenAIError(
                f"The {PRIORITY_HEADER} header must be a signed 64-bit integer, got {found}",
                param="priority",
            )
    if value:
        given[PRIORITY] = value


def check_limit(limit: int | None, max_model_len: int, param: str = "max_tokens") -> None:
    """The client's token limit, `param` (a default it did not set is the model's to
    refuse)."""
    if limit is not None and max_model_len > 0 and limit >= max_model_len:
        raise OpenAIError(
            f"{param} is too large: {limit}. This model's context is {max_model_len} "
            "tokens, prompt included",
            param=param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )


async def answer_prompts(
    catalog: Catalog,
    request: Request,
    model: ModelVersion,
    body: Sampling,
    prompts: list[Prompt],
    answer: Answer,
    echoes: list[str] | None = None,
    firsts: list[tuple[int | None, str]] | None = None,
    ids: list[list[int]] | None = None,
    heads: list[Answer] | None = None,
    special: bool | None = None,
) -> Response:
    """The answer to `prompts` (a completions list, a chat batch's conversations; chat's
    one), each generated n times: prompt p's choice i is sequence p * n + i (vLLM's
    order), each a request of its own. `ids`: each prompt's token ids, where
    `return_token_ids` asks for them; `heads`: each prompt's own answer (a batch's
    conversations: its role, echo and thoughts), else `answer`'s; `special`: the
    client's `add_special_tokens` (None: the route's default)."""
    if ids is not None:
        answer.token_ids, answer.prompt_ids = True, ids[0]
    stream = bool(body.stream)
    given = body.sampling()
    keep_special_tokens(
        model, given, (answer if heads is None else heads[0]).reasoning, answer.tools
    )
    add_priority(request, given, body.priority)
    thinking.add_markers(catalog.tools.reasoning_parser, model, given)
    n = body.n or 1
    tags = (answer if heads is None else heads[0]).tags
    reads_ids = answer.token_ids or (tags is not None and tags.counted)
    cached = catalog.tools.prompt_tokens_details  # --enable-prompt-tokens-details
    requests: list[InferRequest] = []
    for p, prompt in enumerate(await _as_sent(model, prompts)):
        use = (answer if heads is None else heads[p]).reasoning
        values = given
        if use is not None and use.after is not None:
            values = {**given, structured.AFTER: use.after}  # the grammar after the thoughts
        values = thinking.grammar_first(values, use is not None)
        catalog.log.received(_logged(answer, p, heads), prompts[p], values, n)
        for each in seeded(values, n) if n > 1 else [values]:
            infer_request, sent = build_request(
                model,
                prompt,
                stream,
                each,
                body.default_max_tokens,
                reads_ids,
                cached,
                answer.chat and isinstance(prompt, str),
                special,
            )
            requests.append(infer_request)
    params = Params("messages" if answer.chat else "prompt", sent, reads_ids, cached)
    answer.log = catalog.log.outputs_of(answer.id)
    for head in heads or ():
        head.log = answer.log
    answers = [answer if heads is None else heads[0]]
    if len(requests) > 1:
        answers = [
            (answer if heads is None else heads[k // n]).choice(
                k,
                None if echoes is None else echoes[k // n],
                None if firsts is None else firsts[k // n],
                None if ids is None else ids[k // n],
            )
            for k in range(len(requests))
        ]
    if stream:
        return await textstream.stream(catalog, request, requests, params, answers, n)
    if len(requests) == 1:
        one = answers[0]
        text, reason, usage, entries = await until_disconnect(
            request, collect(catalog.core, requests[0], params, tokenids.thoughts(one.tags))
        )
        body_json = one.whole(text, reason, usage, entries)
        if answer.log is not None:
            answer.log.whole(0, text, reason)
    else:
        # vLLM's: each prompt counted once, the choices' generated tokens summed.
        counts = [tokenids.thoughts(choice.tags) for choice in answers]
        pairs = zip(requests, counts, strict=True)
        results = await until_disconnect(
            request, all_of([collect(catalog.core, r, params, c) for r, c in pairs])
        )
        total = Usage(sum(results[k][2].prompt_tokens for k in range(0, len(results), n)))
        total.thoughts = tokenids.summed(counts)
        total.cached_tokens = cached_total([results[k][2] for k in range(0, len(results), n)])
        choices = []
        for k, (text, reason, usage, entries) in enumerate(results):
            choice = answers[k]
            if answer.log is not None:
                answer.log.whole(k, text, reason)
            total.completion_tokens += usage.completion_tokens
            found, stop = usage.prompt_logprobs, usage.stop_reason
            choices.append(choice.whole_choice(text, reason, entries, found, stop, usage.token_ids))
            total.prompt_logprobs = found
        body_json = answer.whole_of(choices, total)
    return Response(orjson.dumps(body_json), media_type="application/json")
