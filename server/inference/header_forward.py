"""--http-header-forward-pattern / --grpc-header-forward-pattern: the HTTP headers (gRPC
metadata) whose names match a regular expression become request parameters, as Triton
forwards them (server src/http_server.cc ForwardHeaders, src/grpc/infer_handler.h
ForwardHeadersAsParameters).

Triton's semantics:
- the pattern is searched for anywhere in the name (RE2::PartialMatch), without regard
  to case: Triton puts `(?i)` before it, so a pattern that starts `(?-i)` is case
  sensitive again;
- each matching header is a string parameter, added after the body's parameters, so the
  header's value is the one a model sees for a name both carry (Triton appends it, and the
  python backend reads the list into one JSON object: the last one wins);
- a matching header named as a reserved parameter (`sequence_id`, `priority`, ...) or
  starting with `triton_` fails the request INVALID_ARG.

Names are matched as the front end gets them: gRPC metadata keys are lower case on the
wire, and the HTTP server gives header names in lower case too (Triton's HTTP server keeps
the client's case). A front end with no pattern makes no `HeaderForward` and does no work
per request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from ..errors import ErrorCode, ServerError
from .types import RESERVED_PARAMETER_PREFIX, InferRequest

# Triton's kReservedParameterKeys (server src/common.h).
RESERVED_KEYS: Final = frozenset(
    {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "headers",
        "binary_data_output",
    }
)

# RE2's inline flags at the start of the pattern, which Python only takes there as a
# group of their own: `(?-i)` turns off the `(?i)` Triton adds.
_LEADING_FLAGS: Final = re.compile(r"\(\?([imsU]*)(?:-([imsU]*))?\)")
_FLAGS: Final = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL}


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """The pattern as Triton reads it: `(?i)` + pattern. ValueError says why one cannot
    be read."""
    flags = re.IGNORECASE
    rest = pattern
    while (lead := _LEADING_FLAGS.match(rest)) is not None:
        on, off = lead.group(1), lead.group(2) or ""
        if "U" in on + off:
            raise ValueError(f"'{pattern}': the U (ungreedy) flag is not supported")
        for letter in on:
            flags |= _FLAGS[letter]
        for letter in off:
            flags &= ~_FLAGS[letter]
        rest = rest[lead.end() :]
    try:
        return re.compile(rest, flags)
    except re.error as exc:
        raise ValueError(f"'{pattern}' is not a regular expression: {exc}") from None


def pattern_setting(name: str, pattern: str) -> str:
    """A forward pattern flag's check: one that does not compile is a usage error."""
    if pattern:
        try:
            compile_pattern(pattern)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return pattern


class HeaderForward:
    """Adds the matching headers of a request to its parameters."""

    __slots__ = ("_search", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._search = compile_pattern(pattern).search

    @classmethod
    def of(cls, pattern: str) -> HeaderForward | None:
        """None for no pattern: nothing is forwarded."""
        return cls(pattern) if pattern else None

    def apply(self, request: InferRequest, headers: Iterable[tuple[str, str | bytes]]) -> None:
        """Forward `headers` ((name, value) in the order they came) into `request`."""
        search = self._search
        params = request.parameters
        for name, value in headers:
            if search(name) is None:
                continue
            if name in RESERVED_KEYS or name.startswith(RESERVED_PARAMETER_PREFIX):
                raise ServerError(
                    ErrorCode.INVALID_ARG,
                    f"Header '{name}' is reserved for Triton usage and cannot be forwarded.",
                )
            if isinstance(value, bytes):  # a `-bin` gRPC metadata value
                value = value.decode("utf-8", "replace")
            params[name] = value

    def apply_http(self, request: InferRequest, raw: Iterable[tuple[bytes, bytes]]) -> None:
        """Forward an ASGI scope's headers (latin-1 bytes, as HTTP carries them)."""
        self.apply(request, ((n.decode("latin-1"), v.decode("latin-1")) for n, v in raw))
