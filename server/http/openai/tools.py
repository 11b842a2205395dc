"""Tool calling on /v1/chat/completions, as vLLM 0.34 and Triton's OpenAI front end serve it.

- `tools` reach the chat template (as the request's list of functions, the fields sent),
  whatever `tool_choice` is, as vLLM passes them; with --exclude-tools-when-tool-choice-none
  not for "none", as vLLM's renderer.
- `tool_choice` defaults to "auto" where tools are given ("none" where none are; an empty
  list is none, as OpenAI's). "none": the answer is text.
- A named function, or "required": the answer is constrained by structured outputs
  (vLLM's schemas: the function's `parameters`; for "required", an array of at least one
  `{"name", "parameters"}` of the tools, their `$defs` (and `definitions`) hoisted to its
  root, so that their `$ref`s resolve), given to the model as the `structured_outputs`
  sampling key or TensorRT-LLM's guided decoding inputs (guided.py), and read back as
  `message.tool_calls` (content ""; cut short, no calls and no content). Streamed, a
  "required" answer's calls are sent as they grow, as vLLM streams them (cut short, what
  was sent stays).
  It replaces `response_format` (vLLM's adjust_request); only a constraint of
  `structured_outputs` itself clashes with a named function. A model that takes neither
  cannot be constrained: a 400 on `tool_choice`.
- "auto": the calls are parsed from the model's text by the server's
  `--tool-call-parser` (toolparse.py); without one, a 400 on `tool_choice`.

finish_reason is vLLM's: "tool_calls" where the answer has calls and the model stopped on
its own, except for a named function ("stop"); a cut ("length") stays visible.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from .errors import OpenAIError, unsupported
from .toolmistral import TAGS as MISTRAL_TAGS
from .toolparse import DEFAULT_MAX_PARSE_BYTES, Call, Stream, call, parse, tool_id
from .toolstream import REQUIRED, Calls

_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


@dataclass(frozen=True, slots=True)
class ToolSettings:
    """How /v1 reads a model's text: --tool-call-parser ("" none),
    --max-tool-call-parse-bytes, and --reasoning-parser ("" none; reasoning.py); and
    what its usage reports: --enable-prompt-tokens-details (the prompt's cached tokens),
    --enable-force-include-usage (usage on every stream and chunk); how logprobs name
    tokens where a request does not say: --return-tokens-as-token-ids; and whether
    `tool_choice: "none"` keeps the tools out of the template:
    --exclude-tools-when-tool-choice-none; and the seconds after which an idle stream
    sends a keep-alive comment: --sse-keep-alive-interval (keepalive.py; 0: never)."""

    parser: str = ""
    max_parse_bytes: int = DEFAULT_MAX_PARSE_BYTES
    reasoning_parser: str = ""
    prompt_tokens_details: bool = False
    force_include_usage: bool = False
    tokens_as_ids: bool = False
    exclude_tools_when_none: bool = False
    sse_keep_alive: float = 0.0


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class ToolFunction(_Body):
    name: str
    description: str | None = None
    # A JSON schema (an object); none: no arguments.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: ToolFunction


def template_tools(
    tools: list[Tool] | None, tool_choice: Any = None, settings: ToolSettings | None = None
) -> list[dict[str, Any]] | None:
    """The tools as sent (the fields set), as transformers gives them to a template; none
    where `tool_choice` is "none" and the server's --exclude-tools-when-tool-choice-none
    keeps them out (vLLM's renderer)."""
    excluded = settings is not None and settings.exclude_tools_when_none
    if not tools or (excluded and tool_choice == "none"):
        return None
    return [tool.model_dump(exclude_unset=True) for tool in tools]


def choice(tools: list[Tool] | None, tool_choice: Any) -> Any:
    """The request's `tool_choice` as vLLM reads it ("none", "auto", "required", or a
    named function's name as `{"name": ...}`), checked, in vLLM's words."""
    # OpenAI's: an empty list is none ("auto" and "required" have nothing to call).
    if tools == [] and tool_choice in ("auto", "required"):
        return "none"
    if tool_choice is None:
        return "auto" if tools else "none"
    if tool_choice == "none":
        return "none"
    if tools is None:
        raise OpenAIError("When using `tool_choice`, `tools` must be set.", param="tool_choice")
    if tool_choice in ("auto", "required"):
        return tool_choice
    if not isinstance(tool_choice, dict):
        raise OpenAIError(
            f"Invalid value for `tool_choice`: {tool_choice}! Only named tools, "
            '"none", "auto" or "required" are supported.',
            param="tool_choice",
        )
    function = tool_choice.get("function")
    if not isinstance(function, dict):
        raise OpenAIError(
            f"Invalid value for `function`: `{function}` in `tool_choice`! {_USAGE}",
            param="tool_choice.function",
        )
    if "name" not in function:
        raise OpenAIError(
            f"Expected field `name` in `function` in `tool_choice`! {_USAGE}",
            param="tool_choice.function.name",
        )
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise OpenAIError(
            f"Invalid `name` in `function`: `{name}` in `tool_choice`! {_USAGE}",
            param="tool_choice.function.name",
        )
    if not any(tool.function.name == name for tool in tools):
        raise OpenAIError(
            f"The tool `{name}` specified in `tool_choice` does not match any of the "
            "specified `tools`",
            param="tool_choice",
        )
    return {"name": name}


def _parameters(tool: Tool) -> dict[str, Any]:
    # vLLM's: missing or empty parameters still make the arguments a JSON object.
    return tool.function.parameters or {"type": "object", "properties": {}}


# Where a schema keeps its subschemas for `$ref`: JSON Schema's and draft 7's.
_DEFS = ("$defs", "definitions")


def _hoisted(tools: list[Tool]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """vLLM's _get_tool_schema_defs: each tool's parameters without its subschemas, and
    those of all tools, by where they go at the root of the array schema (a name two tools
    define differently is a 400). `definitions` too, which vLLM leaves in place, where its
    `$ref`s cannot resolve."""
    parameters: list[dict[str, Any]] = []
    hoisted: dict[str, dict[str, Any]] = {}
    for tool in tools:
        params = dict(_parameters(tool))
        for where in _DEFS:
            defs = params.pop(where, {})
            if not isinstance(defs, dict):
                raise OpenAIError(
                    f"`{where}` in the parameters of tool '{tool.function.name}' must be an "
                    f"object, got {type(defs).__name__}.",
                    param="tools",
                )
            found = hoisted.setdefault(where, {})
            for name, schema in defs.items():
                if name in found and found[name] != schema:
                    raise OpenAIError(
                        f"Tool definition '{name}' has multiple schemas, which is not supported.",
                        param="tools",
                    )
                found[name] = schema
        parameters.append(params)
    return parameters, {where: defs for where, defs in hoisted.items() if defs}


def constraint(
    tools: list[Tool] | None, chosen: Any, parallel: bool | None = None
) -> dict[str, Any] | None:
    """vLLM's structured outputs for a named function or "required" (None otherwise)."""
    if not tools:
        return None
    if isinstance(chosen, dict):
        tool = next(t for t in tools if t.function.name == chosen["name"])
        return {"json": _parameters(tool)}
    if chosen != "required":
        return None
    parameters, hoisted = _hoisted(tools)
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": {
            "type": "object",
            "anyOf": [
                {
                    "properties": {
                        "name": {"type": "string", "enum": [tool.function.name]},
                        "parameters": params,
                    },
                    # No other key: a JSON schema is read strictly (xgrammar's default,
                    # backends/llm/strictschema.py), as vLLM's "auto" backend reads it.
                    "required": ["name", "parameters"],
                }
                for tool, params in zip(tools, parameters, strict=True)
            ],
        },
    }
    if parallel is False:
        schema["maxItems"] = 1
    return {"json": {**schema, **hoisted}}


def check_constraints(chosen: Any, given: dict[str, Any] | None) -> None:
    """vLLM's check_structured_outputs_count: a named function and a constraint of the
    request's own `structured_outputs` (here also the legacy guided_* fields) cannot both
    hold; `response_format` is not one (the function's schema replaces it)."""
    constrained = given is not None and any(
        given.get(k) is not None for k in ("json", "regex", "choice")
    )
    if isinstance(chosen, dict) and constrained:
        raise OpenAIError(
            "You can only either use constraints for structured outputs or tools, not both.",
            param="tool_choice",
        )


@dataclass(frozen=True, slots=True)
class ToolUse:
    """How one request's answer becomes tool calls: `chosen` as `choice` gives it,
    `parser` for "auto"."""

    chosen: Any
    parser: str = ""
    max_parse_bytes: int = DEFAULT_MAX_PARSE_BYTES
    # OpenAI's `parallel_tool_calls`: false keeps the first call only, as vLLM.
    parallel: bool = True

    def kept_special_tokens(self) -> tuple[str, ...]:
        """The special tokens the answer's text keeps: the mistral parser's tags, control
        tokens in Mistral's tokenizer.json and GGUFs, which decoding would drop, and with
        them every call (vLLM's parser turns `skip_special_tokens` off for a tokenizer
        other than mistral-common's, whose decoding keeps them)."""
        return MISTRAL_TAGS if self.parser == "mistral" else ()

    def message(self, text: str) -> tuple[str | None, list[Call]]:
        """The answer's content and calls."""
        if isinstance(self.chosen, dict):
            return "", ([call(self.chosen["name"], text)] if text.strip() else [])
        if self.chosen == "required":
            return "", self._keep(_required(text))
        content, calls = parse(self.parser, text)
        return content, self._keep(calls)

    def _keep(self, calls: list[Call]) -> list[Call]:
        return calls if self.parallel else calls[:1]

    def finish_reason(self, reason: str, calls: bool) -> str:
        """vLLM's resolve_finish_reason."""
        if calls and reason == "stop" and not isinstance(self.chosen, dict):
            return "tool_calls"
        return reason

    def stream(self) -> ToolStream:
        return ToolStream(self)


def _required(text: str) -> list[Call]:
    """vLLM's reading of a "required" answer: a JSON array of {"name", "parameters"}."""
    try:
        found = json.loads(text)
    except ValueError:
        return []
    if not isinstance(found, list):
        return []
    calls = []
    for item in found:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return []
        arguments = json.dumps(item.get("parameters", {}), ensure_ascii=False)
        calls.append(call(item["name"], arguments))
    return calls


class ToolStream:
    """One streamed choice's deltas: a named function's arguments as the model writes
    them (its first delta names the call); "auto"'s calls as they grow (toolparse.Stream);
    "required"'s too, read from its array as they grow (toolstream.Calls), as vLLM streams
    them, or, where no call could be read so, parsed from the whole text at the end."""

    def __init__(self, use: ToolUse) -> None:
        self.use = use
        self.held: list[str] = []
        self.named_id = ""
        self.auto = Stream(use.parser, use.max_parse_bytes) if use.chosen == "auto" else None
        required = use.chosen == REQUIRED
        # Dumped as `_required` dumps the unstreamed calls' arguments (not ASCII).
        self.required = Calls(REQUIRED, False, tool_id) if required else None
        self.calls = False

    @property
    def truncated(self) -> bool:
        return self.auto is not None and self.auto.truncated

    def feed(self, text: str) -> list[dict[str, Any]]:
        if self.auto is not None:
            return self._kept(self.auto.feed(text))
        if self.required is not None:
            self.held.append(text)
            return self._kept(self.required.feed(text))
        if not isinstance(self.use.chosen, dict):
            return []
        if not text:
            return []
        if self.named_id:
            return [{"tool_calls": [{"index": 0, "function": {"arguments": text}}]}]
        first = call(self.use.chosen["name"], text)
        self.named_id = first["id"]
        self.calls = True
        return [{"tool_calls": [{"index": 0, **first}]}]

    def finish(self) -> list[dict[str, Any]]:
        if self.auto is not None:
            deltas = self._kept(self.auto.finish())
            self.calls = self.auto.called
            return deltas
        if self.required is None:
            return []
        if self.required.streamed:
            self.calls = True  # what was sent stays, as vLLM's
            return []
        calls = self.use._keep(_required("".join(self.held)))
        # vLLM's: what does not read as calls (cut by max_tokens) is no content either,
        # as not streamed.
        self.calls = bool(calls)
        return _deltas(calls)

    def _kept(self, deltas: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """vLLM's maybe_filter_parallel_tool_calls: without parallel calls, the deltas
        of the first call only."""
        if self.use.parallel:
            return deltas
        kept = []
        for delta in deltas:
            if "tool_calls" in delta:
                first = [c for c in delta["tool_calls"] if c["index"] == 0]
                delta = {**delta, "tool_calls": first} if first else {}
            if delta:
                kept.append(delta)
        return kept


def _deltas(calls: list[Call]) -> list[dict[str, Any]]:
    return [{"tool_calls": [{"index": index, **found}]} for index, found in enumerate(calls)]


def plan(
    chosen: Any,
    settings: ToolSettings,
    constrainable: bool,
    model: str,
    parallel: bool | None,
) -> ToolUse | None:
    """The request's ToolUse (None: the answer is text), or its 400."""
    if chosen == "none":
        return None
    if chosen == "auto":
        if not settings.parser:
            # vLLM's words (ge-serve has no --enable-auto-tool-choice: a parser enables it).
            raise OpenAIError(
                '"auto" tool choice requires --tool-call-parser to be set', param="tool_choice"
            )
    elif not constrainable:
        what = f'function "{chosen["name"]}"' if isinstance(chosen, dict) else '"required"'
        raise unsupported(
            "tool_choice",
            f"tool_choice={what} is not supported by the model '{model}': it "
            "has neither a 'sampling_parameters' input nor TensorRT-LLM's "
            "'guided_decoding_guide_type' input, so its answer cannot be constrained to "
            "the tool's arguments (structured outputs)",
        )
    return ToolUse(chosen, settings.parser, settings.max_parse_bytes, parallel is not False)
