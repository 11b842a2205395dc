"""A request's place in a sequence: its correlation ID and START / END flags.

Clients send them as the request parameters `sequence_id` (an unsigned integer or a
string), `sequence_start` and `sequence_end` (booleans), over HTTP, gRPC and gRPC
streaming alike; every front end hands the core the same protocol-neutral parameters,
and the core reads them here. An ID of 0 or "" means "no sequence", as in Triton.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ge_serve.server.errors import invalid_arg

CorrelationId = int | str

ID_KEY = "sequence_id"
START_KEY = "sequence_start"
END_KEY = "sequence_end"
SEQUENCE_KEYS = frozenset((ID_KEY, START_KEY, END_KEY))
# Triton's request flags (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END).
FLAG_START = 1
FLAG_END = 2
# Triton refuses longer string IDs (tritonserver.cc).
MAX_STRING_ID = 128


@dataclass(frozen=True, slots=True)
class SequenceFlags:
    """`correlation_id` is 0 or "" when the request names no sequence."""

    correlation_id: CorrelationId
    start: bool = False
    end: bool = False

    @property
    def in_sequence(self) -> bool:
        return self.correlation_id not in (0, "")

    def id_text(self) -> str:
        return str(self.correlation_id)


def sequence_flags(parameters: Mapping[str, object]) -> SequenceFlags | None:
    """The request's sequence facts, or None when it carries none of the parameters.
    Raises INVALID_ARG for a value of the wrong type, with Triton's wording."""
    if ID_KEY not in parameters and START_KEY not in parameters and END_KEY not in parameters:
        return None
    raw = parameters.get(ID_KEY, 0)
    correlation: CorrelationId
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise invalid_arg("Unable to parse 'sequence_id'")
    if isinstance(raw, int):
        if raw < 0 or raw >= 1 << 64:
            raise invalid_arg("Unable to parse 'sequence_id'")
        correlation = raw
    else:
        if len(raw) > MAX_STRING_ID:
            raise invalid_arg("string correlation ID cannot be longer than 128 characters")
        correlation = raw
    flags = []
    for key in (START_KEY, END_KEY):
        value = parameters.get(key, False)
        if not isinstance(value, bool):
            raise invalid_arg(f"Unable to parse '{key}'")
        flags.append(value)
    return SequenceFlags(correlation, flags[0], flags[1])
