"""The body of `POST /v1/responses` (OpenAI's Responses API, as vLLM 0.34 serves it) and
its translation to a chat request, whose path (template, tools, structured outputs,
sampling) then serves it.

- `input`: a string (one user message) or a list of items: messages {role, content: a
  string or `input_text` / `output_text` parts}, and a replayed tool round,
  `function_call` {call_id, name, arguments} (an assistant's call, joined to the
  assistant message before it, as vLLM joins them) and `function_call_output` {call_id,
  output} (a tool message), and `reasoning` {content or summary: [{text}]} (earlier
  thoughts: the assistant message's `reasoning`, joined to the assistant turn before,
  as vLLM joins them). So a response's `output` items can be sent back as they came, as
  the OpenAI Agents SDK and pydantic-ai send them. `instructions` is a system message
  first. An assistant message or reasoning left `in_progress` or `incomplete` last is
  continued (vLLM's rule).
- `text.format` is chat's `response_format` (json_schema flat: name, schema, strict);
  `tools` are flat functions {name, description, parameters, strict}; `tool_choice`
  "none" / "auto" / "required" / {type: function, name}, in vLLM's words.
- vLLM keeps no responses unless started with VLLM_ENABLE_RESPONSES_API_STORE, and then
  never forgets one: `store` is ignored as vLLM ignores it by default, and what needs a
  stored response (`previous_response_id`, `background`) is refused in vLLM's words.
- What would change the answer and is not served (hosted tools, `truncation: auto`,
  images and files, sealed thoughts, `item_reference`...) is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from . import fields
from .errors import OpenAIError, unsupported
from .messages import Body
from .schemas import ChatCompletionRequest, parse
from .thinking import Budget

# The fields of a chat request that the Responses API names otherwise.
RENAMED = {
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "messages": "input",
    "logprobs": "include",
}
# vLLM's: the store is off unless VLLM_ENABLE_RESPONSES_API_STORE is set.
NO_STORE = (
    "This vLLM engine does not support `store=True` and therefore does not support the "
    "background mode. To enable these features, set the environment variable "
    "`VLLM_ENABLE_RESPONSES_API_STORE=1` when launching the vLLM server."
)
LOGPROBS_INCLUDE = "message.output_text.logprobs"
# Chat's sampling fields that the Responses body shares (vLLM's extensions of it),
# passed on as they are: chat's checks, with the same names.
SHARED = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "ignore_eos",
    "stop_token_ids",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "structured_outputs",
    "user",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "request_id",
    "priority",
    "vllm_xargs",
    "thinking_token_budget",
)


def not_found(response_id: str) -> OpenAIError:
    """vLLM's answer for a response it does not hold (it holds none: no store)."""
    return OpenAIError(
        f"Response with id '{response_id}' not found.",
        status=404,
        param="response_id",
        code="not_found",
    )


class TextConfig(Body):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)

    # OpenAI's flat form: {type, name, schema, strict, description}.
    format: dict[str, Any] | None = None
    verbosity: str | None = None


class FunctionTool(Body):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Reasoning(Body):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(Body):
    # vLLM's: optional, as chat's (Catalog.generator).
    model: str | None = Field(None, min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    structured_outputs: Any = None
    stream: bool | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    reasoning: Reasoning | None = None
    # vLLM's: false drops the thoughts a --reasoning-parser reads (reasoning.py).
    include_reasoning: bool = True
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    request_id: str | None = None
    priority: int | None = Field(None, ge=fields.INT64_MIN, le=fields.INT64_MAX)
    vllm_xargs: dict[str, Any] | None = None
    thinking_token_budget: Budget = None  # vLLM's rule: chat's check (thinking.py)
    # Not served: refused by name where given (`refuse_unsupported`).
    prompt: Any = None
    conversation: Any = None
    previous_input_messages: Any = None
    n: Any = None

    def refuse_unsupported(self) -> None:
        """vLLM's refusals, in its words, and those of what ge-serve does not serve."""
        if self.background and self.store is False:
            raise OpenAIError(
                "background can only be used when `store` is true", param="background"
            )
        if self.prompt is not None:
            raise OpenAIError("prompt template is not supported", param="prompt")
        if self.background:
            raise OpenAIError(NO_STORE, param="background")
        if self.previous_response_id is not None:
            raise not_found(self.previous_response_id)
        for name, what in (
            ("conversation", "'conversation' needs stored conversations, which are not kept"),
            ("previous_input_messages", "'previous_input_messages' (harmony models only)"),
            ("n", "'n' is not a parameter of the Responses API"),
        ):
            if getattr(self, name) is not None:
                raise unsupported(name, f"{what}: it is not supported")
        if self.truncation == "auto":
            raise unsupported(
                "truncation",
                "truncation 'auto' is not supported: a prompt longer than the model's "
                "context is refused, never cut ('disabled')",
            )
        self._refuse_tools()

    def _refuse_tools(self) -> None:
        for index, tool in enumerate(self.tools or ()):
            if tool.type != "function":
                raise unsupported(
                    f"tools[{index}].type",
                    f"Only function tools are served, not '{tool.type}' (hosted tools "
                    "need OpenAI's servers)",
                )
            if not tool.name:
                raise OpenAIError(
                    f"Missing required parameter: 'tools[{index}].name'",
                    param=f"tools[{index}].name",
                )
        choice = self.tool_choice
        if isinstance(choice, dict) and choice.get("type") != "function":
            raise unsupported(
                "tool_choice",
                f"tool_choice of type {choice.get('type')!r} is not supported: "
                '"none", "auto", "required" or {"type": "function", "name": ...}',
            )

    def logprobs_asked(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or ())

    def chosen_tool(self) -> Any:
        """vLLM's check_tool_usage: without tools "auto" is "none"; what names a tool
        must find it."""
        choice = self.tool_choice if self.tool_choice is not None else "auto"
        if not self.tools:
            if choice in ("auto", "none"):
                return "none"
            if choice == "required":
                raise OpenAIError(
                    "Tool choice 'required' must be specified with 'tools' parameter.",
                    param="tool_choice",
                )
        if isinstance(choice, dict):
            name = choice.get("name")
            if not name or not any(tool.name == name for tool in self.tools or ()):
                raise OpenAIError(
                    "Tool choice 'function' not found in 'tools' parameter.",
                    param="tool_choice",
                )
            return {"type": "function", "function": {"name": name}}
        if choice not in ("none", "auto", "required"):
            raise OpenAIError(f"Invalid value for 'tool_choice': {choice!r}", param="tool_choice")
        return choice

    def echoed_tool_choice(self) -> Any:
        """`tool_choice` as the answer echoes it (vLLM's: "none" without tools)."""
        chosen = self.chosen_tool()
        if isinstance(chosen, dict):
            return {"type": "function", "name": chosen["function"]["name"]}
        return chosen

    def chat(self) -> ChatCompletionRequest:
        """The chat request that serves this one, checked as chat checks its own (a
        refusal names the Responses API's field)."""
        messages = input_messages(self.instructions, self.input)
        continued = _continues(self.input)
        document: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "add_generation_prompt": not continued,
            "continue_final_message": continued,
        }
        for name in SHARED:
            value = getattr(self, name)
            if value is not None:
                document[name] = value
        if self.max_output_tokens is not None:
            document["max_tokens"] = self.max_output_tokens
        if self.tools:
            document["tools"] = [
                {"type": "function", "function": _function(tool)} for tool in self.tools
            ]
        document["tool_choice"] = self.chosen_tool()
        if self.reasoning is not None and self.reasoning.effort is not None:
            document["reasoning_effort"] = self.reasoning.effort
        if self.logprobs_asked():
            document["logprobs"] = True
            document["top_logprobs"] = self.top_logprobs or 0
        fmt = self.text.format if self.text is not None else None
        if fmt is not None:
            if self.structured_outputs is not None:
                raise OpenAIError(
                    "Cannot specify both structured_outputs and text.format",
                    param="structured_outputs",
                )
            document["response_format"] = _response_format(fmt)
        try:
            chat = parse(ChatCompletionRequest, document)
            chat.refuse_unsupported()
        except OpenAIError as exc:
            raise renamed(exc) from None
        return chat


def _function(tool: FunctionTool) -> dict[str, Any]:
    """A flat function tool as chat's `function`: the fields sent."""
    return tool.model_dump(exclude={"type"}, exclude_none=True)


def renamed(exc: OpenAIError) -> OpenAIError:
    """A chat refusal, its parameter named as the Responses API names it."""
    param = exc.param
    if param is None:
        return exc
    head, dot, rest = param.partition(".")
    bracket = head.find("[")
    stem = head if bracket < 0 else head[:bracket]
    if stem in RENAMED and RENAMED[stem] != stem:
        new = RENAMED[stem] + head[len(stem) :] + dot + rest
        exc.message = exc.message.replace(f"'{param}'", f"'{new}'")
        exc.param = new
    return exc


def _response_format(fmt: dict[str, Any]) -> dict[str, Any]:
    """`text.format` as chat's `response_format`: json_schema's flat fields nested."""
    kind = fmt.get("type")
    if kind == "json_schema":
        spec = {k: v for k, v in fmt.items() if k in ("name", "schema", "strict", "description")}
        spec.setdefault("name", "response")
        if not isinstance(fmt.get("schema"), dict):
            raise OpenAIError(
                "Missing required parameter: 'text.format.schema'", param="text.format.schema"
            )
        return {"type": "json_schema", "json_schema": spec}
    if kind in ("text", "json_object"):
        return {"type": kind}
    raise OpenAIError(
        f"text.format type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
        param="text.format.type",
    )


def input_messages(instructions: str | None, given: str | list[dict[str, Any]]) -> list[Any]:
    """The chat messages of the input, as vLLM's construct_input_messages makes them."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
        return messages
    if not given:
        raise OpenAIError("'input' must not be an empty list", param="input")
    for index, item in enumerate(given):
        _add_item(messages, index, item)
    return messages


def _add_item(messages: list[dict[str, Any]], index: int, item: dict[str, Any]) -> None:
    where = f"input[{index}]"
    kind = item.get("type", "message")
    previous = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
    if kind == "function_call":
        call = {
            "id": _text(item, "call_id", where),
            "type": "function",
            "function": {
                "name": _text(item, "name", where),
                "arguments": _text(item, "arguments", where),
            },
        }
        if previous is not None:
            previous.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        return
    if kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _parts_text(output, f"{where}.output")
        messages.append(
            {"role": "tool", "content": text, "tool_call_id": _text(item, "call_id", where)}
        )
        return
    if kind == "reasoning":
        thoughts = _thoughts(item, where)
        if previous is not None and previous.get("reasoning") is None:
            previous["reasoning"] = thoughts  # vLLM's: joined to the assistant turn before
        else:
            messages.append({"role": "assistant", "content": None, "reasoning": thoughts})
        return
    if kind != "message":
        raise OpenAIError(f"Unsupported input item type: {kind}", param=f"{where}.type")
    role = item.get("role")
    if not isinstance(role, str):
        raise OpenAIError(f"Missing required parameter: '{where}.role'", param=f"{where}.role")
    content = item.get("content")
    text = content if isinstance(content, str) else _parts_text(content, f"{where}.content")
    if role == "assistant" and previous is not None and previous.get("content") is None:
        previous["content"] = text  # vLLM's: a call's message takes the text that follows
        return
    messages.append({"role": role, "content": text})


def _thoughts(item: dict[str, Any], where: str) -> str:
    """A reasoning item's thoughts, as vLLM reads them: its first `content` part's text,
    else its first `summary` part's, else none (""); `encrypted_content` (OpenAI's own
    thoughts, sealed) refused in vLLM's words."""
    if item.get("encrypted_content"):
        raise OpenAIError("Encrypted content is not supported.", param=f"{where}.encrypted_content")
    for key in ("content", "summary"):
        parts = item.get(key)
        if not parts:
            continue
        if not isinstance(parts, list) or not isinstance(parts[0], dict):
            raise OpenAIError(
                f"Invalid value for '{where}.{key}': a list of parts {{type, text}}",
                param=f"{where}.{key}",
            )
        return _text(parts[0], "text", f"{where}.{key}[0]")
    return ""


def _text(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise OpenAIError(f"Missing required parameter: '{where}.{key}'", param=f"{where}.{key}")
    return value


def _parts_text(parts: Any, where: str) -> str:
    """Text parts joined by a line break, as chat joins its parts; others refused."""
    if not isinstance(parts, list):
        raise OpenAIError(f"Invalid value for '{where}': a string or a list of parts", param=where)
    texts = []
    for number, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise unsupported(
                f"{where}[{number}].type",
                f"Only text content parts are served, not '{kind}'",
            )
        texts.append(_text(part, "text", f"{where}[{number}]"))
    return "\n".join(texts)


def _continues(given: str | list[dict[str, Any]]) -> bool:
    """vLLM's should_continue_final_message: an assistant message or its thoughts left
    unfinished last."""
    if isinstance(given, str) or not given:
        return False
    last = given[-1]
    kind = last.get("type", "message")
    return (
        kind == "reasoning" or (kind == "message" and last.get("role") == "assistant")
    ) and last.get("status") in ("in_progress", "incomplete")
