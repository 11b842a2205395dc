"""vLLM's CORS flags, read as vLLM reads them: `--allowed-origins`, `--allowed-methods`
and `--allowed-headers` each take a JSON list (`'["https://app.example"]'`, `'["*"]'`),
and `--allow-credentials` is a switch. They are one recorded setting (`Settings.cors`),
read here into `CorsSettings` (the last value of a flag wins, as argparse's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from ..control.cors import CorsSettings
from .flags import Flag, flag, given_value, switch_value

_LISTS: Final = ("--allowed-origins", "--allowed-methods", "--allowed-headers")
_CREDENTIALS: Final = "--allow-credentials"


def cors_flag() -> Mapping[str, Flag]:
    return flag(
        *_LISTS,
        _CREDENTIALS,
        record_flag=True,
        bare=True,
        check=_read,
        metavar="JSON",
        help="vLLM's CORS settings: JSON lists of the origins, methods and headers a "
        "browser page on another origin may use (no origin by default: the browser "
        "refuses), and --allow-credentials for cookies and credentials",
        group="CORS",
    )


def _json_list(name: str, text: str) -> tuple[str, ...]:
    given_value(name, text)
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{name} takes a JSON list of strings, e.g. '[\"*\"]', got '{text}'")
    return tuple(value)


def _read(_name: str, given: Sequence[tuple[str, str]]) -> CorsSettings:
    values: dict[str, Any] = {}
    for name, text in dict(given).items():  # the last of each, as argparse keeps it
        key = name.removeprefix("--").replace("-", "_")
        values[key] = switch_value(name, text) if name == _CREDENTIALS else _json_list(name, text)
    return CorsSettings(**values)
