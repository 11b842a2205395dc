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
