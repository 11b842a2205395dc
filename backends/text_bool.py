"""True or false written as text: the one spelling that flags (`--exit-on-error=false`),
`--metrics-config` values and model config parameters (`adaptive_batching`) all accept."""

from __future__ import annotations

from typing import Final

TRUE: Final = frozenset({"1", "true", "yes", "on"})
FALSE: Final = frozenset({"0", "false", "no", "off"})


def parse_bool(text: str) -> bool:
    """`text` as a boolean, any case, surrounding space ignored; ValueError otherwise."""
    lowered = text.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise ValueError(f"expected true or false, got '{text}'")


def triton_bool(text: str, refusal: str) -> bool:
    """`text` as Triton reads a boolean (its ParseBoolValue and ParseOption<bool>): true,
    on or 1, false, off or 0, in any case, nothing around them; else ValueError with
    `refusal`, formatted with the text (`{text}`), since each of Triton's readers words it
    its own way."""
    lowered = text.lower()
    if lowered in ("true", "on", "1"):
        return True
    if lowered in ("false", "off", "0"):
        return False
    raise ValueError(refusal.format(text=text))
