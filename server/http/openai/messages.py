"""The chat messages of a /v1/chat/completions body (schemas.py checks the rest), and
`Body`, the base of every /v1 body: strict types, unknown fields ignored."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


# --- chat messages ------------------------------------------------------------------------


class TextPart(Body):
    # Only "text" is served; refuse_unsupported names the part of another type.
    type: str
    text: str | None = None


class ToolCallFunction(Body):
    name: str
    # JSON, as the model wrote it (template.py parses it for the template).
    arguments: str


class ToolCall(Body):
    id: str
    type: Literal["function"]
    function: ToolCallFunction


class ChatMessage(Body):
    # Any role, as vLLM takes it (its CustomChatCompletionMessageParam): the template
    # renders it (Llama 3.1's `ipython`) or refuses it with raise_exception (a 400).
    role: str
    # A string, or text parts (other part types, images and audio, are refused).
    content: str | list[TextPart] | None = None
    name: str | None = None
    # An assistant's calls, and the call a tool message answers: passed to the template.
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # An assistant's earlier thoughts (vLLM's interleaved thinking), for the template;
    # `reasoning_content` is vLLM's deprecated name of it.
    reasoning: str | None = None
    reasoning_content: str | None = None

    def thoughts(self) -> str | None:
        """The thoughts sent back, as vLLM reads them: `reasoning`, else the deprecated
        `reasoning_content` (an empty string is thoughts, none is null)."""
        return self.reasoning if self.reasoning is not None else self.reasoning_content

    def text(self) -> str:
        """The content as one string: text parts joined by a line break, as vLLM and
        TensorRT-LLM join them (joined with nothing, "Say" and "hello" were "Sayhello")."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text or "" for part in self.content)
