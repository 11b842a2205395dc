"""The JSON bodies of the /v1 endpoints, as pydantic models, and their checks.

Why pydantic here, where the v2 infer path decodes by hand: these bodies are small
control-plane-sized JSON (a chat is a few messages), each request then runs a model for
milliseconds to seconds, so validation is far from the cost that matters; one model both
checks a body and describes it in the OpenAPI document (openapi.py), as the v2 control
plane's bodies do (bodies.py). The v2 hot path never sees these.

Fields follow OpenAI's API reference and vLLM's extensions of it (vLLM's
`ChatCompletionRequest` and `CompletionRequest`, which most OpenAI-compatible clients are
tested against). Types are strict (JSON `"1"` is not a number, `1.0` is not an integer;
an integer is a valid float). A field whose silent loss would change the answer (legacy
`functions`, prompt logprobs, a request's own chat template; response formats
and guided decoding for a model that takes no `structured_outputs`...) is a 400 that
names the parameter (`refuse_unsupported`), except at the value that changes nothing
(vLLM's default). Fields that change nothing here (vLLM's cache salt, disaggregation and
scheduling hints...) and fields neither knows are ignored.
vLLM's sampling extensions are fields here, checked with vLLM's ranges, since the model
contract takes vLLM's sampling keys; which of them reach a given model, and which it
refuses, is generation.py's decision (`sampling` gives it what the client set).
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import BeforeValidator, ConfigDict, Field, ValidationError

from . import fields, structured, thinking
from .errors import OpenAIError, unsupported
from .fields import DEFAULT_ONLY, NEVER_SERVED, SAMPLING_KEYS, refuse_by_table
from .logprobs import TOKEN_IDS, check_chat, check_completion, check_prompt, check_token_ids
from .messages import Body as Body
from .messages import ChatMessage as ChatMessage
from .prompts import Prompt, form, prompt_list
from .tools import Tool, check_constraints, choice, constraint

M = TypeVar("M", bound="Body")

# Pieces of a pydantic error location that name a union member, not a field.
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
_FIELD = re.compile(r"^[a-z_]+$")


class StreamOptions(Body):
    # Unknown keys are kept, to be seen: vLLM refuses any non-empty `stream_options`
    # without `stream`, whatever its keys.
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    include_usage: bool = False
    # vLLM's: usage (so far) on every chunk too; only with include_usage, as vLLM.
    continuous_usage_stats: bool = False


class ResponseFormat(Body):
    type: str
    json_schema: Any = None  # {"name", "schema", "strict"?}: structured.py reads it
    # type "structural_tag": vLLM's legacy form, or xgrammar's `format` (both checked by
    # backends/llm/structtag.py).
    structures: Any = None
    triggers: Any = None
    format: Any = None


# --- sampling, shared by chat and completions ------------------------------------------------

_Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
_TokenId = Annotated[int, Field(ge=0)]


class Sampling(Body):
    """The parameters chat and completions share; `sampling` gives those the client set,
    by vLLM's sampling keys."""

    # The limit a request that sets none gets (None: the model's own).
    default_max_tokens: ClassVar[int | None] = None

    # vLLM's: optional; without it, the one generative model the server serves
    # (Catalog.generator).
    model: str | None = Field(None, min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    # vLLM's: -1 (or 0) leaves top-k off.
    top_k: int | None = Field(None, ge=-1)
    # vLLM's bounds; the engine refuses a negative one in its own words.
    seed: int | None = Field(None, ge=fields.INT64_MIN, le=fields.INT64_MAX)
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1)
    presence_penalty: _Penalty | None = None
    frequency_penalty: _Penalty | None = None
    # OpenAI's: token id (a string) -> bias; the engine clamps it to vLLM's [-100, 100].
    logit_bias: dict[str, float] | None = None
    # vLLM's sampling extensions, with vLLM's ranges (vllm/sampling_params.py).
    ignore_eos: bool | None = None
    min_tokens: int | None = Field(None, ge=0)
    stop_token_ids: list[_TokenId] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    repetition_penalty: float | None = Field(None, gt=0.0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    length_penalty: float | None = None
    use_beam_search: bool | None = None
    bad_words: list[str] | None = None
    spaces_between_special_tokens: bool | None = None
    allowed_token_ids: list[_TokenId] | None = None
    truncate_prompt_tokens: int | None = Field(None, ge=1)
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_whitespace_pattern: Any = None
    structured_outputs: Any = None
    response_format: ResponseFormat | None = None
    prompt_logprobs: int | None = None
    # vLLM's: these ids' log probabilities in place of the top N (the engine checks them).
    logprob_token_ids: list[int] | None = None
    prompt_embeds: Any = None
    repetition_detection: Any = None
    truncation_side: Any = None
    logits_processors: Any = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    watermarking: bool | None = None
    # vLLM's request priority (text.add_priority): the `llm` engine's queue order.
    priority: int | None = Field(None, ge=fields.INT64_MIN, le=fields.INT64_MAX)
    # vLLM's: a non-negative integer, or -1 (unlimited); thinking.py checks it.
    thinking_token_budget: thinking.Budget = None
    vllm_xargs: dict[str, Any] | None = None
    # vLLM's: the answer's id is the API's prefix and this.
    request_id: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def continuous_usage(self) -> bool:
        """Usage on every streamed chunk: vLLM's `continuous_usage_stats`, which it
        honours only with `include_usage`."""
        options = self.stream_options
        return bool(options and options.include_usage and options.continuous_usage_stats)

    # vLLM's fields served only at their default (DEFAULT_ONLY); a request kind adds its own.
    default_only: ClassVar[dict[str, tuple[Any, ...]]] = DEFAULT_ONLY

    def refuse_unsupported(self) -> None:
        fields.check_n(self.n, self.temperature)
        refuse_by_table(self, NEVER_SERVED, self.default_only)
        options = self.stream_options
        given = options is not None and bool(options.model_fields_set or options.model_extra)
        if given and not self.stream:
            # vLLM's check and words, on the body as sent: any key, an unknown one too; `{}`
            # (falsy in its check) is accepted.
            raise OpenAIError(
                "Stream options can only be defined when `stream=True`.",
                param="stream_options",
            )
        check_prompt(self.prompt_logprobs, self.stream)
        thinking.checked(self.thinking_token_budget)
        structured.structured_outputs(self)  # its 400s, before the model is asked
        if any(not s for s in self.stops()):
            raise OpenAIError("'stop' strings must not be empty", param="stop")
        limit = self.token_limit() or self.default_max_tokens
        if self.min_tokens and limit is not None and self.min_tokens > limit:
            # vLLM's rule and words (its sampling parameters'); a limit the model sets
            # (chat's, unset) is the model's to check.
            raise OpenAIError(
                f"min_tokens must be less than or equal to max_tokens={limit}, "
                f"got {self.min_tokens}.",
                param="min_tokens",
            )

    def token_limit(self) -> int | None:
        """The client's `max_tokens`; None where it set none."""
        return self.max_tokens

    def logprob_count(self) -> int | None:
        """vLLM's sampling `logprobs` for the request; None: none asked for."""
        return None

    def shown_logprobs(self) -> int | None:
        """How many of each token's entries the answer shows (Logprobs' count; None: no
        logprobs): with `logprob_token_ids`, all of them (-1), which are the sampled token
        and those ids (vLLM's `return_all`), whatever `top_logprobs` says."""
        count = self.logprob_count()
        return -1 if count is not None and self.logprob_token_ids else count

    def sampling(self) -> dict[str, Any]:
        """The sampling parameters the client set, by vLLM's keys; a model gets its own
        defaults for the rest (`max_tokens`, unset, is `default_max_tokens`)."""
        params: dict[str, Any] = {}
        limit = self.token_limit()
        if limit is not None:
            params["max_tokens"] = limit
        for key in SAMPLING_KEYS:
            value = self.stops() if key == "stop" and self.stop is not None else getattr(self, key)
            if value is not None:
                params[key] = value
        if self.logprob_token_ids:
            # vLLM's: the ids take the place of the top N, so no `logprobs` goes with them
            # (the engine gives one entry per id); an empty list is none.
            params[TOKEN_IDS] = self.logprob_token_ids
        elif (count := self.logprob_count()) is not None:
            params["logprobs"] = count
        # vLLM's: `echo` asks the prompt's as many as the answer's, unless set.
        prompt = self.prompt_logprobs
        if prompt is None and getattr(self, "echo", False):
            prompt = getattr(self, "top_logprobs" if "messages" in type(self).model_fields
                             else "logprobs")  # fmt: skip
        if prompt is not None:
            params["prompt_logprobs"] = prompt
        if (constraint := structured.structured_outputs(self)) is not None:
            params[structured.KEY] = constraint
        if (budget := thinking.checked(self.thinking_token_budget)) is not None:
            params["thinking_token_budget"] = budget
        return params


class ChatOptions(Sampling):
    """Chat's fields but its `messages`: one conversation's (ChatCompletionRequest), or
    each of a batch's (chatbatch.py)."""

    # OpenAI's newer name for max_tokens; either may be given, not both differently.
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    # vLLM's chat template controls (template.py checks them, and renders with them).
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None
    reasoning_effort: str | None = None
    # vLLM's: false drops the thoughts a --reasoning-parser reads (reasoning.py).
    include_reasoning: bool = True
    chat_template: str | None = None
    # vLLM's: the last message begins the answer when it has the answer's role.
    echo: bool = False
    # vLLM's, default false for chat (the template writes them): the `llm` engine takes
    # either value; another model only the default (generation.build_request).
    add_special_tokens: bool | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        self._refuse_template_controls()
        check_token_ids(self.logprob_token_ids, self.use_beam_search, bool(self.logprobs), True)
        check_chat(self.logprobs, self.top_logprobs)
        if self.tools:
            check_constraints(self.chosen_tool(), structured.given(self))
        # The legacy `functions` (vLLM ignores them): refused, not silently dropped.
        if self.functions or self.function_call not in (None, "none"):
            name = "functions" if self.functions else "function_call"
            raise unsupported(name, f"'{name}' (legacy function calling): use 'tools'")
        self._refuse_message_parts()
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise OpenAIError(
                "Give 'max_completion_tokens' or 'max_tokens', not both with different values",
                param="max_completion_tokens",
            )

    def chosen_tool(self) -> Any:
        return choice(self.tools, self.tool_choice)

    def sampling(self) -> dict[str, Any]:
        params = super().sampling()
        # vLLM's: a named function or "required" overrides the structured outputs.
        forced = constraint(self.tools, self.chosen_tool(), self.parallel_tool_calls)
        if forced is not None:
            params[structured.KEY] = json.dumps(forced)
        return params

    def _refuse_message_parts(self) -> None:
        """The messages' content parts (`refuse_parts`): each request kind's own."""

    def _refuse_template_controls(self) -> None:
        """vLLM's rules for its chat template controls (template.py renders with them),
        each a 400 naming its field."""
        given = self.chat_template_kwargs or {}
        fields.refuse_template_controls(
            self.continue_final_message,
            self.add_generation_prompt,
            given,
            " (`add_generation_prompt` is true unless set to false)",
        )
        for name in ("add_generation_prompt", "continue_final_message"):
            if name in given and given[name] != getattr(self, name):
                raise OpenAIError(
                    f"'chat_template_kwargs.{name}' ({json.dumps(given[name])}) disagrees "
                    f"with '{name}' ({json.dumps(getattr(self, name))}): set '{name}' itself",
                    param=f"chat_template_kwargs.{name}",
                )

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprob_count(self) -> int | None:
        # vLLM's: `top_logprobs` (0 unset) where `logprobs` is true.
        return (self.top_logprobs or 0) if self.logprobs else None


class ChatCompletionRequest(ChatOptions):
    messages: list[ChatMessage] = Field(min_length=1)

    def _refuse_message_parts(self) -> None:
        refuse_parts(self.messages, "messages")

    def answer_role(self, response_role: str = "assistant") -> str:
        """vLLM's: `response_role` (--response-role's), or where no generation prompt
        opens the answer's turn, the last message's."""
        return response_role if self.add_generation_prompt else self.messages[-1].role

    def echoed(self, response_role: str = "assistant") -> str:
        """What `echo` puts before the answer: the last message, where it has the
        answer's role (vLLM's rule)."""
        last = self.messages[-1]
        return last.text() if self.echo and last.role == self.answer_role(response_role) else ""


def refuse_parts(messages: list[ChatMessage], where: str) -> None:
    """Content parts other than text, and text parts without text, named from `where`
    (the messages' parameter)."""
    for index, message in enumerate(messages):
        parts = message.content if isinstance(message.content, list) else []
        for number, part in enumerate(parts):
            at = f"{where}[{index}].content[{number}]"
            if part.type != "text":
                raise unsupported(
                    f"{at}.type", f"Only text content parts are served, not '{part.type}'"
                )
            if part.text is None:
                raise OpenAIError(f"Missing required parameter: '{at}.text'", param=at)


# OpenAI's (and vLLM's) default for /v1/completions, where the model's own applies to chat.
COMPLETION_DEFAULT_MAX_TOKENS = 16


class CompletionRequest(Sampling):
    default_max_tokens: ClassVar[int | None] = COMPLETION_DEFAULT_MAX_TOKENS

    # vLLM's forms (prompts.py): text, texts, token ids, lists of token ids.
    prompt: Annotated[str | list[str] | list[int] | list[list[int]], BeforeValidator(form)]
    # 0 only with `echo` (vLLM's): the prompt alone is the answer.
    max_tokens: int | None = Field(None, ge=0)
    # The prompt begins the answer.
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None
    # As chat's, but vLLM's default for completions is true.
    add_special_tokens: bool | None = None

    def refuse_unsupported(self) -> None:
        if self.max_tokens == 0 and not self.echo:
            # The words of the check that chat's and every other limit get.
            raise OpenAIError(
                "Invalid value for 'max_tokens': Input should be greater than or equal to 1",
                param="max_tokens",
            )
        super().refuse_unsupported()
        prompt_list(self.prompt, self.n or 1)
        if self.suffix:
            raise unsupported("suffix", "'suffix' is not supported")
        fields.check_best_of(self.best_of, self.n)
        check_token_ids(
            self.logprob_token_ids,
            self.use_beam_search,
            self.logprobs is not None,
            False,
            self.echo_only(),
        )
        check_completion(self.logprobs)

    def logprob_count(self) -> int | None:
        return self.logprobs

    def echo_only(self) -> bool:
        """vLLM's `echo` with `max_tokens: 0`: the model runs for one token (which counts
        the prompt, and checks it fits), and the answer's text is the prompt alone."""
        return bool(self.echo) and self.max_tokens == 0

    def token_limit(self) -> int | None:
        return 1 if self.max_tokens == 0 else self.max_tokens

    def prompts(self) -> list[Prompt]:
        return prompt_list(self.prompt, self.n or 1)


# A value outside a field's choices names the value given, cut to this many characters.
_CHOICE_ERRORS = frozenset({"literal_error", "enum"})
_SHOWN = 80


def parse(model: type[M], document: Any) -> M:
    """`document` checked against `model`; the first problem is a 400 naming its field
    (`param`, e.g. `messages[0].role`)."""
    if not isinstance(document, dict):
        raise OpenAIError("The request body must be a JSON object")
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = next((e for e in errors if e["type"] == "missing"), errors[0])
        param = _param(first["loc"])
        if first["type"] == "missing":
            message = f"Missing required parameter: '{param}'"
        else:
            message = f"Invalid value for '{param}': {first['msg']}"
            given = first.get("input")
            if first["type"] in _CHOICE_ERRORS and isinstance(given, str | int | float):
                # The value given, as vLLM's pydantic error and OpenAI's name it.
                message += f" (given: {json.dumps(given)[:_SHOWN]})"
        raise OpenAIError(message, param=param or None) from None


def _param(loc: tuple[int | str, ...]) -> str:
    """A pydantic location as OpenAI names a parameter, without union member names."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _FIELD.match(part) and part not in _TYPE_NAMES:
            text += f".{part}" if text else part
    return text
