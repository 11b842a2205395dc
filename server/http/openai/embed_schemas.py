"""The bodies of vLLM's pooling routes for embedding models: `/v1/embeddings` (OpenAI's,
with vLLM's extensions, its EmbeddingRequest) and `/pooling` (vLLM's PoolingRequest).

Both take the text to embed as `input` (a string or a list of them), or as a chat,
vLLM's chat forms: `messages` (one conversation, or for /v1/embeddings a list of them)
or `input` holding messages; each conversation is rendered with the model's chat
template (embeddings.py) and embedded as one text. vLLM's pooling fields are checked
with its rules, then served or refused by name (fields.py's EMBEDDING_* tables).
"""

from __future__ import annotations

from typing import Any, Literal, cast

from pydantic import Field

from . import fields
from .errors import OpenAIError, unsupported
from .messages import Body, ChatMessage

TOKEN_IDS = (
    "Token-id input is not supported: give {what} as text. '{field}' takes a string "
    "or a list of strings here, not token ids"
)
# vLLM's words for an empty prompt (its input processor's _validate_prompt_len).
EMPTY_PROMPT = "The decoder prompt cannot be empty"
# OpenAI's limit on the inputs of one embeddings request.
MAX_EMBEDDING_INPUTS = 2048
# vLLM's words where a model's tokenizer has no chat template (its renderer's).
NO_CHAT_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must "
    "provide a chat template if the tokenizer does not define one."
)

# vLLM's words for the pooling tasks it removed, and for a plugin task without a plugin.
REMOVED_TASKS = {
    "score": "`score` task was removed; use `classify` instead.",
    "encode": "`encode` task was removed; use `token_embed` or `token_classify` instead.",
}
NO_PLUGIN = (
    "No IOProcessor plugin installed. Please refer to the documentation and to the "
    "'prithvi_geospatial_mae_io_processor' offline inference example for more details."
)
# An embedding model's one task: its pooled vector (no token embeddings, no classifier).
EMBED_TASKS = ("embed",)

_Conversation = list[ChatMessage]


def check_count(field: str, count: int, what: str = "items") -> None:
    """At most MAX_EMBEDDING_INPUTS of `what` in `field`: the embedding routes' one bound."""
    if count > MAX_EMBEDDING_INPUTS:
        raise OpenAIError(
            f"'{field}' holds {count} {what}; at most {MAX_EMBEDDING_INPUTS}", param=field
        )


def _token_ids(value: object) -> bool:
    """Whether `value` is token ids: integers, or lists of them (vLLM's forms)."""
    return isinstance(value, list) and any(
        isinstance(item, int) or (isinstance(item, list) and any(isinstance(i, int) for i in item))
        for item in value
    )


def _chat(value: object) -> bool:
    """Whether `value` is a conversation, or a list of them, rather than text."""
    return isinstance(value, list) and any(
        isinstance(item, ChatMessage) or (isinstance(item, list) and bool(item)) for item in value
    )


class PooledBody(Body):
    """The fields of vLLM's embedding and pooling requests (its EmbedRequestMixin,
    PoolingBasicRequestMixin and chat options)."""

    # Token ids (vLLM takes them, LangChain sends them) are parsed to be refused.
    input: (
        str
        | list[str]
        | list[int]
        | list[list[int]]
        | list[ChatMessage]
        | list[list[ChatMessage]]
        | None
    ) = None
    messages: list[ChatMessage] | list[list[ChatMessage]] | None = None
    # vLLM's values; "bytes" and "bytes_only" are its octet-stream answers.
    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    # vLLM's: the answer's id is the route's prefix and this (`X-Request-Id` wins).
    request_id: str | None = None
    # vLLM's: base64's and bytes' element type and byte order (embeddings.py encodes them).
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"
    # vLLM's pooling extensions, with its checks (EMBEDDING_* tables: which are served).
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    padding: Literal["max_length", "do_not_pad"] | None = None
    add_special_tokens: bool | None = None
    use_activation: bool | None = None
    # Accepted and ignored: no engine queue to order (vLLM's `fcfs` ignores it too).
    priority: int | None = Field(None, ge=fields.INT64_MIN, le=fields.INT64_MAX)
    # vLLM's chat options (the chat forms only).
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Removed by vLLM, which refuses it, as here: its `false` must not pass unnoticed.
    normalize: Any = None

    def refuse_unsupported(self) -> None:
        if "normalize" in self.model_fields_set:
            raise OpenAIError(fields.REMOVED_NORMALIZE, param="normalize")
        if self.input is None and self.messages is None:
            raise OpenAIError("Missing required parameter: 'input'", param="input")
        fields.refuse_by_table(self, fields.EMBEDDING_NEVER_SERVED, fields.EMBEDDING_DEFAULT_ONLY)
        if _token_ids(self.input):
            raise unsupported("input", TOKEN_IDS.format(field="input", what="each input"))
        fields.refuse_template_controls(
            self.continue_final_message,
            self.add_generation_prompt,
            self.chat_template_kwargs,
        )

    def conversations(self) -> tuple[str, list[_Conversation]] | None:
        """The chat forms' conversations and the field that holds them; None for text."""
        # `input` wins over `messages`, as vLLM's union of forms picks its text form.
        name, given = "messages", self.messages if self.input is None else None
        if _chat(self.input):
            name, given = "input", cast(list[ChatMessage] | list[list[ChatMessage]], self.input)
        if given is None:
            return None
        if not given:
            raise OpenAIError(f"'{name}' must not be an empty list", param=name)
        nested = [c for c in given if isinstance(c, list)]
        found: list[_Conversation] = nested or [[m for m in given if isinstance(m, ChatMessage)]]
        if any(not conversation for conversation in found):
            raise OpenAIError(f"'{name}' must not hold an empty conversation", param=name)
        check_count(name, len(found), "conversations")
        return name, found

    def texts(self) -> list[str]:
        """The text form's inputs (token ids and the chat forms are handled first)."""
        given = self.input
        if isinstance(given, list) and any(isinstance(item, list) for item in given):
            # Only empty lists are left (token ids and chats are read first): `[[]]` is
            # vLLM's empty prompt of token ids, refused in its words, not text "[]".
            raise OpenAIError(EMPTY_PROMPT, param="input")
        texts = [given] if isinstance(given, str) else [str(t) for t in given or []]
        if not texts:
            raise OpenAIError("'input' must not be an empty list", param="input")
        check_count("input", len(texts))
        if any(not text for text in texts):
            raise OpenAIError("'input' must not hold an empty string", param="input")
        return texts


class EmbeddingRequest(PooledBody):
    # vLLM's: optional; here, without it, the one embedding model the server serves.
    model: str | None = Field(None, min_length=1)


class PoolingRequest(PooledBody):
    # vLLM's: optional; here, without it, the one embedding model the server serves.
    model: str | None = Field(None, min_length=1)
    # vLLM's pooling tasks; which one an embedding model serves is pooling.py's to say.
    task: (
        Literal["embed", "classify", "token_embed", "token_classify", "plugin"]
        | Literal["embed&token_classify", "score", "encode"]
        | None
    ) = None
    # vLLM's IOProcessorRequest's payload, for a plugin task (none is served).
    data: Any = None

    def refuse_unsupported(self) -> None:
        """vLLM's checks of a pooling request, in its order (its validation, then its
        ServingPooling's), then the pooling fields' (PooledBody's)."""
        if "normalize" in self.model_fields_set:
            raise OpenAIError(fields.REMOVED_NORMALIZE, param="normalize")
        if self.task in REMOVED_TASKS:
            raise OpenAIError(REMOVED_TASKS[self.task], param="task")
        if self.dimensions is not None:
            raise OpenAIError("dimensions is currently not supported", param="dimensions")
        plugin = self.data is not None and self.input is None and self.messages is None
        task = "plugin" if plugin else self.task or EMBED_TASKS[0]
        if task == "plugin":
            raise OpenAIError(NO_PLUGIN, param="task")
        if task not in EMBED_TASKS:
            raise OpenAIError(
                f"Unsupported task: {task!r} Supported tasks: {EMBED_TASKS}", param="task"
            )
        super().refuse_unsupported()
