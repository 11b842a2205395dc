"""`--cache-config <cache>,<setting>=<value>`: which response cache, and how large.

Triton loads a cache implementation by name; ge-serve has one built in, `local`, an LRU
within a byte budget (`size`, Triton's key). The deprecated `--response-cache-byte-size`
means `--cache-config local,size=<bytes>`, and giving both is an error, as in Triton.
"""

from __future__ import annotations

from typing import Final

LOCAL: Final = "local"
_SETTINGS: Final = ("size",)


def cache_setting(text: str) -> tuple[str, str, str]:
    """`local,size=1048576` as ("local", "size", "1048576"), checked."""
    name, comma, rest = text.partition(",")
    if not comma or not name.strip():
        raise ValueError(
            f"No cache specified. --cache-config option format is "
            f"<cache name>,<setting>=<value>. Got {text}"
        )
    key, equals, value = rest.partition("=")
    if not equals or not key.strip() or not value.strip():
        raise ValueError(
            f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {text}"
        )
    # Which cache, and its settings, are checked with all the flags (cache_size): Triton
    # refuses several caches before it looks for any of them.
    return name.strip(), key.strip(), value.strip()


def cache_size(entries: tuple[tuple[str, str, str], ...], byte_size: int) -> int | None:
    """The local cache's byte budget, or None when the server runs without a cache."""
    if entries and byte_size:
        raise ValueError(
            "Incompatible flags --response-cache-byte-size and --cache-config both provided. "
            "Please provide one or the other."
        )
    if byte_size < 0:
        raise ValueError(f"--response-cache-byte-size must be a byte count, got {byte_size}")
    if byte_size:
        return byte_size
    if len({name for name, _, _ in entries}) > 1:
        raise ValueError(
            "found multiple cache configurations, but only a single cache is currently supported"
        )
    size: int | None = None
    for name, key, value in entries:
        if name != LOCAL:
            raise ValueError(
                f"cache '{name}' is not available: ge-serve has only the '{LOCAL}' cache"
            )
        if key not in _SETTINGS:
            raise ValueError(f"unknown '{LOCAL}' cache setting '{key}': expected 'size'")
        if not value.isdigit():
            raise ValueError(f"'{LOCAL}' cache 'size' must be a byte count, got '{value}'")
        size = int(value)
    return size
