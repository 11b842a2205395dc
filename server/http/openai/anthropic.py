"""The bodies of `POST /v1/messages` and `POST /v1/messages/count_tokens` (Anthropic's
Messages API, as vLLM 0.34 serves it) and their translation to a chat request, whose path
(template, tools, reasoning, sampling, stop) then serves them.

As vLLM's `to_chat_completion_request`:

- `system` (a string or text blocks, joined) is a system message first; a message of
  role "system" (vLLM's inline system messages) is a system message where it stands.
- A message's `content` is a string or blocks: `text` (several: text parts, which chat
  joins by a line break), `thinking` (an assistant's earlier thoughts: its `reasoning`),
  `tool_use` {id, name, input} (an assistant's call, `input` as JSON arguments),
  `tool_result` {tool_use_id, content: a string or text blocks} (in a user message, a
  tool message before the message's own text; in an assistant's, the text
  "Tool result: ..."), `redacted_thinking` and `tool_reference` read past. `image`
  blocks (in `system` and in a tool result too) are refused: no model here takes
  images. vLLM's `tool_addition` / `tool_removal` blocks are refused.
- `max_tokens` (required, >= 1), `stop_sequences` (chat's `stop`), `temperature`,
  `top_p`, `top_k`, and vLLM's `min_tokens`, `chat_template_kwargs`, `vllm_xargs` as
  chat takes them; `metadata` is accepted and ignored.
- `tools` {name, description, input_schema} are chat's functions (the schema's `type`
  "object" where it has none; another type is refused, as Anthropic's: a call's input
  is an object); `tool_choice` auto / any / tool {name} / none is chat's
  "auto" / "required" / named / "none", `disable_parallel_tool_use` its
  `parallel_tool_calls`; with tools and no `tool_choice`, "auto".
- `thinking` {type: enabled (budget_tokens >= 1024, count_tokens' too; below
  max_tokens), adaptive, disabled, between_tools}: disabled and between_tools set
  `reasoning_effort` "none" (the template's `enable_thinking` false); `output_config`
  {effort, format: {type: json_schema, schema}} is `reasoning_effort` and
  `response_format`.

A field neither Anthropic nor vLLM knows is ignored, as vLLM's models ignore it. A
refusal of chat's checks (the `llm` engine's too) names the Messages API's field:
`renamed`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, get_args

from pydantic import ConfigDict, Field

from .errors import OpenAIError, unsupported
from .messages import Body
from .schemas import ChatCompletionRequest, parse

BlockType = Literal[
    "text",
    "image",
    "tool_use",
    "tool_result",
    "tool_reference",
    "thinking",
    "redacted_thinking",
    "tool_addition",
    "tool_removal",
]
BLOCK_TYPES = get_args(BlockType)
Effort = Literal["low", "medium", "high", "xhigh", "max"]
# Chat's fields that the Messages API names otherwise.
RENAMED = {
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "thinking_token_budget": "thinking.budget_tokens",
    "reasoning_effort": "output_config.effort",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
}
# Chat's words for what the Messages API writes otherwise (tools.py's refusals).
REWORDED = (
    (re.compile(r'tool_choice="required"'), 'tool_choice {"type": "any"}'),
    (
        re.compile(r'tool_choice=function (".*?") is not'),
        r'tool_choice {"type": "tool", "name": \1} is not',
    ),
    (re.compile(r"in the parameters of tool '"), "in the input_schema of tool '"),
)
NO_IMAGES = (
    "Image content is not supported: no model this server serves takes images (only "
    "text, tool_use, tool_result and thinking blocks are)"
)
# vLLM's: Claude Code's attribution header, a per-request hash, dropped from system text
# blocks and inline system messages (a top-level `system` string is kept whole).
BILLING_HEADER = "x-anthropic-billing-header"


class Block(Body):
    type: BlockType
    text: str | None = None
    source: dict[str, Any] | None = None
    id: str | None = None
    tool_use_id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    # The list first: a wrong item is named there, not as "a valid string" (as content).
    content: list[dict[str, Any]] | str | None = None
    is_error: bool | None = None
    tool_name: str | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    tool: Any = None


class Message(Body):
    role: Literal["user", "assistant", "system"]
    # Blocks first: a wrong field of a block is named (`messages[0].content[1].input`),
    # not the string that `content` may be instead.
    content: list[Block] | str


class Tool(Body):
    type: str | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    # Required of a custom tool; Anthropic's own tools have none (refused by their type).
    input_schema: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class ToolChoice(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(Body):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None
    display: Literal["summarized", "omitted", "updates"] | None = None


class OutputFormat(Body):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True, populate_by_name=True)

    type: Literal["json_schema"] = "json_schema"
    json_schema: dict[str, Any] | None = Field(None, alias="schema")


class OutputConfig(Body):
    effort: Effort | None = None
    format: OutputFormat | None = None


class CountTokensRequest(Body):
    """`POST /v1/messages/count_tokens`: the conversation, tools and thinking only."""

    model: str = Field(min_length=1)
    messages: list[Message]
    system: list[Block] | str | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        for index, tool in enumerate(self.tools or ()):
            if tool.type not in (None, "custom"):
                # vLLM's words: Anthropic's own tools (web search...) need its servers.
                raise unsupported(
                    f"tools[{index}].type",
                    f"tool type {tool.type!r} is not supported; only custom tools with an "
                    "input_schema are supported",
                )
            where = f"tools[{index}].input_schema"
            if tool.input_schema is None:
                raise OpenAIError(f"Missing required parameter: '{where}'", param=where)
            kind = tool.input_schema.get("type", "object")
            if kind != "object":
                # Anthropic's rule: a call's `input` is an object (vLLM takes the schema,
                # and fails on the call's input that is not one).
                raise OpenAIError(
                    f"Invalid value for '{where}': its type must be \"object\" (a tool's "
                    f"input is an object), got {json.dumps(kind)[:80]}",
                    param=where,
                )
        choice = self.tool_choice
        if choice is not None and choice.type == "tool" and not choice.name:
            raise OpenAIError(
                "tool_choice.name is required when type is 'tool'", param="tool_choice.name"
            )
        thinking = self.thinking
        if thinking is not None and thinking.type == "enabled":
            # vLLM's rules, in its words (its count request's too).
            if thinking.budget_tokens is None:
                raise OpenAIError(
                    "Missing required parameter: 'thinking.budget_tokens'",
                    param="thinking.budget_tokens",
                )
            if thinking.budget_tokens < 1024:
                raise OpenAIError(
                    "thinking.budget_tokens must be at least 1024",
                    param="thinking.budget_tokens",
                )

    def chat(self) -> ChatCompletionRequest:
        """The chat request that renders this conversation (nothing is generated)."""
        return checked(self._document())

    def _document(self) -> dict[str, Any]:
        document: dict[str, Any] = {"model": self.model, "messages": chat_messages(self)}
        if self.chat_template_kwargs is not None:
            document["chat_template_kwargs"] = self.chat_template_kwargs
        config = self.output_config
        if config is not None and config.format is not None and config.format.json_schema:
            spec = {"name": config.format.type, "schema": config.format.json_schema}
            document["response_format"] = {"type": "json_schema", "json_schema": spec}
        if config is not None and config.effort is not None:
            document["reasoning_effort"] = config.effort
        if self.thinking is not None and self.thinking.type in ("disabled", "between_tools"):
            document["reasoning_effort"] = "none"
        if self.tool_choice is not None:
            document["tool_choice"] = _tool_choice(self.tool_choice)
            document["parallel_tool_calls"] = not self.tool_choice.disable_parallel_tool_use
        if self.tools is not None:
            document["tools"] = [_function(tool) for tool in self.tools]
            document.setdefault("tool_choice", "auto")
        return document


class MessagesRequest(CountTokensRequest):
    """`POST /v1/messages`."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    # vLLM's extensions of the Messages API.
    min_tokens: int | None = None
    vllm_xargs: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        thinking = self.thinking  # enabled: its budget given, >= 1024 (checked above)
        budget = thinking.budget_tokens if thinking and thinking.type == "enabled" else None
        if budget is not None and budget >= self.max_tokens:
            raise OpenAIError(
                "thinking.budget_tokens must be less than max_tokens",
                param="thinking.budget_tokens",
            )

    def chat(self) -> ChatCompletionRequest:
        document = self._document()
        document["max_tokens"] = self.max_tokens
        document["stream"] = bool(self.stream)
        for name, value in (
            ("stop", self.stop_sequences),
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("top_k", self.top_k),
            ("min_tokens", self.min_tokens),
            ("vllm_xargs", self.vllm_xargs),
        ):
            if value is not None:
                document[name] = value
        if self.thinking is not None and self.thinking.type == "enabled":
            # vLLM's mapping: the budget is chat's `thinking_token_budget`.
            document["thinking_token_budget"] = self.thinking.budget_tokens
        return checked(document)


def known_blocks(document: Any) -> None:
    """A block of a type the API does not have is a 400 naming it, before the schema's
    checks (whose first complaint would be the string that `content` may be instead)."""
    if not isinstance(document, dict) or not isinstance(document.get("messages"), list):
        return
    for index, message in enumerate(document["messages"]):
        content = message.get("content") if isinstance(message, dict) else None
        for number, block in enumerate(content if isinstance(content, list) else ()):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in BLOCK_TYPES:
                where = f"messages[{index}].content[{number}].type"
                raise OpenAIError(
                    f"Invalid value for '{where}': {json.dumps(kind)[:80]} is not one of "
                    f"{', '.join(BLOCK_TYPES)}",
                    param=where,
                )
            if kind == "text" and "text" not in block:
                # Anthropic's required field; without it the block would be read past.
                where = f"messages[{index}].content[{number}].text"
                raise OpenAIError(f"Missing required parameter: '{where}'", param=where)


# The most messages count_tokens renders. vLLM counts a conversation of any length (one
# past the model's context too: a client asks before it compacts one), so the bound is not
# the context /v1/messages is held to; it bounds the render's time, a few seconds here.
COUNTED_MESSAGES = 65536


def counted_fits(document: Any) -> None:
    """count_tokens' bound, before the schema's checks: at most COUNTED_MESSAGES."""
    known_blocks(document)
    messages = document.get("messages") if isinstance(document, dict) else None
    if isinstance(messages, list) and len(messages) > COUNTED_MESSAGES:
        raise OpenAIError(
            f"Invalid value for 'messages': {len(messages)} messages; count_tokens counts "
            f"at most {COUNTED_MESSAGES}",
            param="messages",
        )


def checked(document: dict[str, Any]) -> ChatCompletionRequest:
    """The chat request, checked as chat checks its own (a refusal names the Messages
    API's field)."""
    if not document["messages"]:
        # Every message was read past (empty text, thoughts left out...): say so, not
        # that chat's list is empty.
        raise OpenAIError(
            "Invalid value for 'messages': no message has content to send the model (empty "
            "text blocks, and a message of nothing else, are read past)",
            param="messages",
        )
    try:
        chat = parse(ChatCompletionRequest, document)
        chat.refuse_unsupported()
    except OpenAIError as exc:
        raise renamed(exc) from None
    return chat


def renamed(exc: OpenAIError) -> OpenAIError:
    """A chat refusal, its parameter named as the Messages API names it."""
    for pattern, words in REWORDED:
        exc.message = pattern.sub(words, exc.message)
    param = exc.param
    if param is None:
        return exc
    head, dot, rest = param.partition(".")
    bracket = head.find("[")
    stem = head if bracket < 0 else head[:bracket]
    if stem in RENAMED:
        new = RENAMED[stem] + head[len(stem) :] + dot + rest
        exc.message = _named(exc.message, param, new)
        exc.param = new
    return exc


def _named(message: str, old: str, new: str) -> str:
    """`message` with chat's name `old` as the Messages API's `new`: quoted, where it
    begins the message (the `llm` engine's words: "stop: at most 64 strings"), and, for
    a name no English word is (one with an underscore), wherever it stands."""
    for quote in "'`":
        message = message.replace(f"{quote}{old}{quote}", f"{quote}{new}{quote}")
    if re.match(rf"{re.escape(old)}(?![\w.\[])", message):
        message = f"'{new}'" + message[len(old) :]
    if "_" in old:
        message = re.sub(rf"(?<![\w.'`]){re.escape(old)}(?![\w'`])", new, message)
    return message


def _tool_choice(choice: ToolChoice) -> Any:
    if choice.type == "any":
        return "required"
    if choice.type == "tool":
        return {"type": "function", "function": {"name": choice.name}}
    return choice.type


def _function(tool: Tool) -> dict[str, Any]:
    schema = tool.input_schema or {}
    if "type" not in schema:
        schema = {**schema, "type": "object"}  # vLLM's default
    function: dict[str, Any] = {"name": tool.name, "parameters": schema}
    if tool.description is not None:
        function["description"] = tool.description
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    """The chat messages of the request, as vLLM's _convert_system_message and
    _convert_messages make them."""
    messages: list[dict[str, Any]] = []
    if body.system:
        # vLLM's: a top-level string is kept whole, billing header or not.
        text = body.system if isinstance(body.system, str) else _system_text(body.system)
        if text:
            messages.append({"role": "system", "content": text})
    for index, message in enumerate(body.messages):
        where = f"messages[{index}]"
        if message.role == "system":
            text = _system_text(message.content, f"{where}.content")
            if text:
                messages.append({"role": "system", "content": text})
            continue
        if isinstance(message.content, str):
            messages.append({"role": message.role, "content": message.content})
            continue
        converted = _blocks(message.role, message.content, f"{where}.content", messages)
        if message.role == "assistant" or "content" in converted:
            messages.append(converted)
    return messages


def _system_text(system: str | list[Block], where: str = "system") -> str:
    if isinstance(system, str):
        return "" if system.startswith(BILLING_HEADER) else system
    parts = []
    for number, block in enumerate(system):
        if block.type in ("tool_addition", "tool_removal"):
            raise unsupported(f"{where}[{number}].type", f"'{block.type}' blocks are not supported")
        if block.type == "image":
            raise unsupported(f"{where}[{number}].type", NO_IMAGES)
        if block.type == "text" and block.text and not block.text.startswith(BILLING_HEADER):
            parts.append(block.text)
    return "".join(parts)


def _blocks(
    role: str, blocks: list[Block], where: str, messages: list[dict[str, Any]]
) -> dict[str, Any]:
    """One message of blocks as a chat message; a user's tool results are tool messages
    appended to `messages` first."""
    message: dict[str, Any] = {"role": role}
    parts: list[dict[str, str]] = []
    calls: list[dict[str, Any]] = []
    thoughts: list[str] = []
    for number, block in enumerate(blocks):
        at = f"{where}[{number}]"
        if block.type == "text" and block.text:
            parts.append({"type": "text", "text": block.text})
        elif block.type == "image":
            raise unsupported(f"{at}.type", NO_IMAGES)
        elif block.type in ("tool_addition", "tool_removal"):
            raise unsupported(f"{at}.type", f"'{block.type}' blocks are not supported")
        elif block.type == "thinking" and block.thinking is not None:
            thoughts.append(block.thinking)
        elif block.type == "tool_use":
            arguments = json.dumps(block.input or {}, ensure_ascii=False)
            function = {"name": block.name or "", "arguments": arguments}
            calls.append({"id": block.id or "call", "type": "function", "function": function})
        elif block.type == "tool_result":
            text = _result_text(block.content, f"{at}.content")
            if role == "user":
                messages.append(
                    {"role": "tool", "tool_call_id": block.tool_use_id or "", "content": text}
                )
            else:
                parts.append({"type": "text", "text": f"Tool result: {text}"})
    if thoughts:
        message["reasoning"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    if len(parts) == 1:
        message["content"] = parts[0]["text"]
    elif parts:
        message["content"] = parts
    return message


def _result_text(content: str | list[dict[str, Any]] | None, where: str) -> str:
    """A tool result's text: a string, or its text blocks joined by a line break."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for number, item in enumerate(content):
        kind = item.get("type")
        if kind == "image":
            raise unsupported(f"{where}[{number}].type", NO_IMAGES)
        if kind == "text":
            text = item.get("text", "")
            if not isinstance(text, str):
                raise OpenAIError(
                    f"Invalid value for '{where}[{number}].text': a string",
                    param=f"{where}[{number}].text",
                )
            texts.append(text)
    return "\n".join(texts)
