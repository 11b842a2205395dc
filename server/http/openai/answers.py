"""A generative model's responses read back: each response's `Piece` (its text delta,
finish reason, counts, log probabilities and ids), a request's pieces as they come
(`pieces`, which turns a core error into OpenAI's and cancels the request when closed),
the whole answer (`collect`), and vLLM's `usage` they add up to.

Each response carries `text_output` (a text delta when streaming, the whole text when
not) and, on the last one, `finish_reason` (earlier ones may carry "None" or "", as
Triton's vLLM backend's str(None)); `num_output_tokens` counts the tokens of its own
response, so they are summed, as Triton's frontend sums them; `num_input_tokens` is the
prompt's count on whichever response has it. Both are 0 for a model that does not report
them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from ge_serve.server.errors import ServerError
from ge_serve.server.inference.core import InferenceServer
from ge_serve.server.inference.types import InferRequest, InferResponse
from ge_serve.server.inference.wire import bytes_elements

from .catalog import TEXT_OUTPUT
from .errors import from_server_error
from .generation import LOGPROBS, PROMPT_LOGPROBS
from .logprobs import Entry, parse, parse_prompt
from .tokenids import Thoughts, output_ids


@dataclass(slots=True)
class Piece:
    """What one response adds: text, and the finish reason and counts when it has them."""

    text: str
    finish_reason: str | None = None
    # The `logprobs` output's entries for this response's tokens (logprobs.py), if any.
    logprobs: list[Entry] | None = None
    # The `prompt_logprobs` output's list (None first), on the first response.
    prompt_logprobs: list[Entry | None] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # vLLM's `stop_reason`: the stop string or stop token id that ended the answer, from
    # the last response's parameter of that name (the `llm` engine's); None otherwise.
    stop_reason: int | str | None = None
    # The response's generated ids (`output_ids`), read only where asked (Params.ids).
    token_ids: list[int] | None = None
    # The prompt tokens found in the prefix cache (`num_cached_tokens`; Params.cached).
    cached_tokens: int | None = None


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The prompt's log probabilities (vLLM's list), where the model sent them: they ride
    # with the counts from the answer's pieces to its JSON.
    prompt_logprobs: list[Entry | None] | None = None
    # The answer's `stop_reason` (Piece's), likewise.
    stop_reason: int | str | None = None
    # vLLM's `return_token_ids`: the generated ids so far (None: not asked for).
    token_ids: list[int] | None = None
    # --reasoning-parser: the answer's thought tokens, counted as the ids come (tokenids.py;
    # None: no parser, and no `completion_tokens_details` in a streamed usage).
    thoughts: Thoughts | None = None
    # vLLM's `num_cached_tokens` (None: not asked for, or the model reports none).
    cached_tokens: int | None = None

    def add(self, piece: Piece) -> None:
        if piece.token_ids is not None:
            if self.token_ids is not None:
                self.token_ids += piece.token_ids
            if self.thoughts is not None:
                self.thoughts.feed(piece.token_ids)
        if piece.prompt_logprobs is not None:
            self.prompt_logprobs = piece.prompt_logprobs
        if piece.stop_reason is not None:
            self.stop_reason = piece.stop_reason
        if piece.prompt_tokens is not None:
            self.prompt_tokens = piece.prompt_tokens
        if piece.cached_tokens is not None:
            self.cached_tokens = piece.cached_tokens
        if piece.completion_tokens is not None:
            self.completion_tokens += piece.completion_tokens

    def as_json(self, details: bool = True, cached: bool = True) -> dict[str, Any]:
        """vLLM's usage; `details`: with its `completion_tokens_details`, the thought
        tokens' count (null without --reasoning-parser), which vLLM's answers carry, and
        its streamed usage only where it has a value; `cached`: with its
        `prompt_tokens_details` where the cached tokens were asked for (vLLM leaves the
        field out otherwise, and on the chunks of a continuous usage but the first)."""
        found: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }
        if cached and self.cached_tokens is not None:
            found["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        if details:
            thoughts = self.thoughts
            found["completion_tokens_details"] = (
                None if thoughts is None else {"reasoning_tokens": thoughts.count}
            )
        return found


def piece_of(response: InferResponse) -> Piece:
    outputs = {tensor.name: tensor for tensor in response.outputs}
    text = outputs.get(TEXT_OUTPUT)
    piece = Piece(b"".join(bytes_elements(text.data)).decode("utf-8", "replace") if text else "")
    found_logprobs = outputs.get(LOGPROBS)
    if found_logprobs is not None and found_logprobs.data.size:
        piece.logprobs = parse(bytes_elements(found_logprobs.data)[0])
    found_prompt = outputs.get(PROMPT_LOGPROBS)
    if found_prompt is not None and found_prompt.data.size:
        piece.prompt_logprobs = parse_prompt(bytes_elements(found_prompt.data)[0])
    reason = outputs.get("finish_reason")
    if reason is not None:
        found = b"".join(bytes_elements(reason.data)).decode("utf-8", "replace")
        # Not finished yet: "None" (vLLM's str(None)) or empty.
        piece.finish_reason = found if found not in ("", "None") else None
    if response.parameters:
        stop = response.parameters.get("stop_reason")
        # A string or a token id; a bool (an int to Python) is no stop token.
        if isinstance(stop, str) or (isinstance(stop, int) and not isinstance(stop, bool)):
            piece.stop_reason = stop
    for name, attribute in (
        ("num_input_tokens", "prompt_tokens"),
        ("num_output_tokens", "completion_tokens"),
        ("num_cached_tokens", "cached_tokens"),
    ):
        tensor = outputs.get(name)
        if tensor is not None and tensor.data.size:
            setattr(piece, attribute, int(tensor.data.reshape(-1)[0]))
    return piece


@dataclass(frozen=True, slots=True)
class Params:
    """What a model's refusal may name: the field holding the prompt (`messages` or
    `prompt`) and the sampling parameters sent to the model."""

    prompt: str
    sent: frozenset[str] = frozenset()
    # Read each response's generated ids (`return_token_ids`, or to count thoughts).
    ids: bool = False
    # Read the prompt's cached tokens (--enable-prompt-tokens-details, Responses API).
    cached: bool = False


async def pieces(
    core: InferenceServer, request: InferRequest, params: Params
) -> AsyncGenerator[Piece, None]:
    """The request's pieces as the model answers; a core error is OpenAI's. Closing this
    closes the core's response stream, which cancels the request."""
    responses: AsyncGenerator[InferResponse, None] = core.infer_responses(request)
    try:
        async for response in responses:
            piece = piece_of(response)
            if params.ids:
                piece.token_ids = output_ids(response)
            if not params.cached:  # a config without the flag sends it unasked
                piece.cached_tokens = None
            yield piece
    except ServerError as exc:
        raise from_server_error(exc, params.prompt, params.sent) from None
    finally:
        await responses.aclose()


async def collect(
    core: InferenceServer, request: InferRequest, params: Params, thoughts: Thoughts | None = None
) -> tuple[str, str, Usage, list[Entry]]:
    """The whole answer: its text, finish reason, usage and logprobs entries. The
    prompt's (`prompt_logprobs`) go in `usage.prompt_logprobs`, and with `params.ids` its
    generated ids in `usage.token_ids`, counted by `thoughts` where given."""
    texts: list[str] = []
    usage = Usage(token_ids=[] if params.ids else None, thoughts=thoughts)
    reason: str | None = None
    entries: list[Entry] = []
    async for piece in pieces(core, request, params):
        texts.append(piece.text)
        usage.add(piece)
        reason = piece.finish_reason or reason
        entries += piece.logprobs or ()
    return "".join(texts), reason or "stop", usage, entries


def cached_total(usages: list[Usage]) -> int | None:
    """The cached tokens of several prompts' usages (each prompt's first choice's), summed
    as vLLM's batch chat sums them; None unless every prompt has its count."""
    counts = [usage.cached_tokens for usage in usages]
    return None if None in counts else sum(count or 0 for count in counts)
