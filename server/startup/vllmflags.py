"""The flags of vLLM's OpenAI-compatible front end that ge-serve takes, as field metadata
for `Settings` (settings.py), with the values they take."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from .flags import Flag, flag, port, positive

# http/openai/toolparse.py's parsers.
TOOL_PARSERS: Final = (
    "llama3", "llama3_json", "mistral", "hermes", "granite", "phi4_mini_json",
)  # fmt: skip
# http/openai/reasoning.py's parsers.
REASONING_PARSERS: Final = ("deepseek_r1", "granite", "mistral", "olmo3", "qwen3")


def host_flag() -> Mapping[str, Flag]:
    """--http-address, which vLLM's launch lines call --host."""
    return flag(
        "--http-address",
        "--host",
        help="address the HTTP endpoint binds; 127.0.0.1 for this host only",
    )


def port_flag() -> Mapping[str, Flag]:
    """--http-port, which vLLM's launch lines call --port."""
    return flag("--http-port", "--port", parse=port, help="HTTP endpoint port")


def api_keys(name: str, keys: tuple[str, ...]) -> tuple[str, ...]:
    """The keys, less empty ones: `--api-key ""` (or an empty VLLM_API_KEY) needs none, as
    vLLM drops them."""
    return tuple(key for key in keys if key)


def api_key_flag() -> Mapping[str, Flag]:
    """vLLM's `--api-key KEY [KEY ...]`, VLLM_API_KEY's one key where the flag is absent."""
    return flag(
        several=True,
        env="VLLM_API_KEY",
        check=api_keys,
        metavar="KEY",
        help="/v1 and vLLM's other routes need one of these keys, as 'Authorization: Bearer "
        "KEY' or 'x-api-key: KEY' (default: $VLLM_API_KEY; none: no key is checked)",
    )


def tool_parser_flag() -> Mapping[str, Flag]:
    return flag(choices=TOOL_PARSERS, help="/v1 tools")


def tool_parse_bytes_flag() -> Mapping[str, Flag]:
    return flag(check=positive, help="most text a stream's tool-call parse holds")


def reasoning_parser_flag() -> Mapping[str, Flag]:
    return flag(choices=REASONING_PARSERS)


def _switch(help_text: str) -> Mapping[str, Flag]:
    """One of vLLM's boolean flags, which may be given alone, meaning true."""
    return flag(bare=True, help=help_text)


def details() -> Mapping[str, Flag]:
    """--enable-prompt-tokens-details: http/openai/answers.py."""
    return _switch("/v1 usage: the prompt tokens found in the prefix cache")


def request_ids() -> Mapping[str, Flag]:
    """--enable-request-id-headers: http/requestid.py."""
    return _switch("X-Request-Id on every HTTP answer (the request's own)")


def forced_usage() -> Mapping[str, Flag]:
    """--enable-force-include-usage: http/openai/text.py's identity()."""
    return _switch("/v1 streams: usage, and on every chunk, whatever stream_options say")


def tokens_as_ids() -> Mapping[str, Flag]:
    """--return-tokens-as-token-ids: the default of the request field of that name."""
    return _switch("/v1 logprobs: tokens as 'token_id:<id>' where a request does not say")


def auto_tools() -> Mapping[str, Flag]:
    """--enable-auto-tool-choice: taken for vLLM's launch lines. vLLM needs it for
    `tool_choice: "auto"`; here --tool-call-parser alone enables "auto", as Triton's
    OpenAI front end does, and this flag only requires that parser, as vLLM's does."""
    return _switch("vLLM's; needs --tool-call-parser, which alone enables tool_choice auto")


def no_tools() -> Mapping[str, Flag]:
    """--exclude-tools-when-tool-choice-none: http/openai/tools.py's template_tools()."""
    return _switch("/v1 chat: tool_choice none keeps the tools out of the chat template")
