"""`POST /v1/chat/completions/batch`, vLLM 0.34's batch chat: `messages` is a list of
conversations, each answered as /v1/chat/completions answers one, all in one
`chat.completion` whose choice i is conversation i's.

The body has chat's fields (`BatchChatCompletionRequest`, vLLM's, whose extra fields it
passes on to each conversation's chat request: chat's fields all mean here what they
mean there). Refused as vLLM's check_batch_mode refuses them, in its words: beam search,
`n` other than 1, `logprob_token_ids` without `logprobs`. vLLM's docstring says streaming
and tools are not supported, but its validator lets `stream` and `tools` through and
ignores them (the answer is whole, the tools never reach the template): here they are
400s, as is `prompt_logprobs` (vLLM computes and drops them: its answer has one place for
one prompt's), so that nothing a client asks for is silently lost.

Each conversation is rendered with the model's chat template (off the loop when they are
long), then all run as a completions list of prompts runs (text.answer_prompts): each
conversation a request of its own in the model's queue, a client that leaves cancels
them all, and one that fails fails the request and cancels the rest. At most
MAX_CONVERSATIONS (completions' bound on prompts; vLLM has none).

The answer is vLLM's: choice i has conversation i's role (the response's, or the last
message's with `add_generation_prompt` false), its echo, its thoughts apart with
--reasoning-parser, and its generated ids with `return_token_ids`; `usage` sums every
conversation's prompt and generated tokens (and thoughts). vLLM's batch answer has no
`prompt_token_ids` or `prompt_logprobs`: null.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response

from ge_serve.backends.base import TextGeneration

from . import tokenids
from .catalog import Catalog
from .errors import OpenAIError, unsupported
from .logprobs import Logprobs
from .messages import ChatMessage
from .objects import Answer
from .prompts import MAX_PROMPTS, Prompt
from .schemas import ChatCompletionRequest, ChatOptions, refuse_parts
from .template import RENDERED_ON_THE_LOOP, render_request
from .text import (
    answer_prompts,
    as_token_ids,
    chat_model,
    identity,
    plan_thoughts,
)

# Each conversation is a request in the model's queue: completions' bound on prompts.
MAX_CONVERSATIONS = MAX_PROMPTS


class BatchChatCompletionRequest(ChatOptions):
    """vLLM's: chat's fields, with `messages` a list of conversations."""

    messages: list[Annotated[list[ChatMessage], Field(min_length=1)]] = Field(min_length=1)
    # vLLM's: no tools, so no other choice.
    tool_choice: Literal["none"] | None = None

    def refuse_unsupported(self) -> None:
        # vLLM's check_batch_mode first (it runs before the fields' checks), in its words.
        if self.use_beam_search:
            raise OpenAIError(
                "Batch chat completions do not support beam search. "
                "Please set `use_beam_search` to False.",
                param="use_beam_search",
            )
        if self.logprob_token_ids and not self.logprobs:
            raise OpenAIError(
                "when using `logprob_token_ids`, `logprobs` must be set to true.",
                param="logprob_token_ids",
            )
        if self.n is not None and self.n != 1:
            raise OpenAIError(
                "Batch chat completions do not support `n > 1`. Please set `n` to 1.",
                param="n",
            )
        if self.stream:
            raise OpenAIError(
                "Batch chat completions do not support streaming. Please set `stream` to False.",
                param="stream",
            )
        if self.tools:
            raise unsupported(
                "tools", "Batch chat completions do not support tools. Please omit `tools`."
            )
        if self.prompt_logprobs is not None:
            raise unsupported(
                "prompt_logprobs",
                "Batch chat completions do not support `prompt_logprobs`: the answer has "
                "no place for each conversation's.",
            )
        super().refuse_unsupported()

    def _refuse_message_parts(self) -> None:
        for index, conversation in enumerate(self.messages):
            refuse_parts(conversation, f"messages[{index}]")

    def sampling(self) -> dict[str, Any]:
        params = super().sampling()
        # vLLM's `echo` asks for the prompt's logprobs, which its batch answer drops.
        params.pop("prompt_logprobs", None)
        return params

    def conversations(self) -> list[ChatCompletionRequest]:
        """Each conversation as a chat request of its own (vLLM's
        to_chat_completion_request), its fields already checked here."""
        shared = {name: getattr(self, name) for name in ChatOptions.model_fields}
        given = self.model_fields_set
        return [
            ChatCompletionRequest.model_construct(given, **shared, messages=conversation)
            for conversation in self.messages
        ]


def bounded(document: Any) -> None:
    """At most MAX_CONVERSATIONS conversations, refused before their messages are checked."""
    messages = document.get("messages") if isinstance(document, dict) else None
    if isinstance(messages, list) and len(messages) > MAX_CONVERSATIONS:
        raise OpenAIError(
            f"conversation list length {len(messages)} exceeds the maximum allowed count "
            f"of {MAX_CONVERSATIONS}",
            param="messages",
        )


async def batch_chat_completion(
    catalog: Catalog, request: Request, body: BatchChatCompletionRequest
) -> Response:
    name, model, generation = chat_model(catalog, body)
    if body.return_token_ids:
        tokenids.check_reported(model)
    chats = body.conversations()
    prompts = await _rendered(catalog, generation, chats)
    answer = identity(request, body, name, chat=True)
    answer.token_ids = bool(body.return_token_ids)
    count = body.shown_logprobs()
    as_ids = as_token_ids(catalog, body.return_tokens_as_token_ids)
    answer.logprobs = None if count is None else Logprobs(True, count, as_ids)
    heads: list[Answer] = []
    for index, (chat, prompt) in enumerate(zip(chats, prompts, strict=True)):
        head = answer.choice(index, chat.echoed(catalog.chat.response_role))
        head.role = chat.answer_role(catalog.chat.response_role)
        plan_thoughts(catalog, model, chat, prompt, head)
        heads.append(head)
    sent: list[Prompt] = list(prompts)
    special = body.add_special_tokens
    return await answer_prompts(
        catalog, request, model, body, sent, answer, heads=heads, special=special
    )


async def _rendered(
    catalog: Catalog, generation: TextGeneration, chats: list[ChatCompletionRequest]
) -> list[str]:
    """Each conversation's prompt; rendered off the loop where they are long in all. A
    conversation the template refuses is a 400 naming it."""

    def rendered() -> list[str]:
        prompts = []
        for index, chat in enumerate(chats):
            try:
                prompts.append(render_request(generation, chat, None, catalog.chat))
            except OpenAIError as exc:
                if exc.param == "messages":
                    exc.param = f"messages[{index}]"
                raise
        return prompts

    if chats[0].chat_template:  # the request's own: the client's code (templateproc.py)
        return await catalog.own_template(rendered)
    if sum(len(chat.messages) for chat in chats) > RENDERED_ON_THE_LOOP:
        return await asyncio.to_thread(rendered)
    return rendered()
