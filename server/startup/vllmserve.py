"""vLLM's flags of how its HTTP server serves, read as vLLM reads them, into one recorded
setting (`Settings.serving`) that part_settings.py hands to the front end:

- `--sse-keep-alive-interval N`: whole seconds, 0 (off) by default; a negative number is
  refused in vLLM's words. /v1 chat and completions streams send `: keep-alive` when idle
  that long (http/openai/keepalive.py).
- `--root-path PATH`: the prefix of a proxy that routes by path, FastAPI's `root_path` in
  vLLM (http/rootpath.py); "" (given empty or alone) or "/": none. It must start with
  "/", and a trailing "/" is dropped (with it, no prefixed path would reach a route).
- `--disable-fastapi-docs [BOOL]`: a switch (alone: true): no `/openapi.json` (404), as
  vLLM's; ge-serve serves no `/docs` or `/redoc` pages either way (http/app.py).

The last value of a flag wins, as argparse's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ge_serve.backends.text_bool import parse_bool

from .flags import Flag, flag

_KEEP_ALIVE: Final = "--sse-keep-alive-interval"
_ROOT_PATH: Final = "--root-path"
_NO_DOCS: Final = "--disable-fastapi-docs"


@dataclass(frozen=True, slots=True)
class Serving:
    sse_keep_alive_interval: int = 0
    root_path: str = ""
    disable_fastapi_docs: bool = False


def flags() -> Mapping[str, Flag]:
    return flag(
        _KEEP_ALIVE,
        _ROOT_PATH,
        _NO_DOCS,
        record_flag=True,
        bare=True,
        check=_read,
        metavar="VALUE",
        help="vLLM's: --sse-keep-alive-interval N: /v1 chat and completions streams send an "
        "SSE comment ': keep-alive' after N idle seconds (0, the default: never); "
        "--root-path PATH: the prefix of a proxy that routes by path (paths are served "
        "with and without it); --disable-fastapi-docs: no /openapi.json",
    )


def _interval(name: str, text: str) -> int:
    if not text:  # given alone: argparse's words for a flag that needs its value
        raise ValueError(f"argument {name}: expected one argument")
    try:
        seconds = int(text)
    except ValueError:
        raise ValueError(f"argument {name}: invalid int value: '{text}'") from None
    if seconds < 0:
        raise ValueError(
            f"Error: {name} must be a non-negative integer (0 disables keep-alive comments)."
        )
    return seconds


def _root_path(name: str, text: str) -> str:
    if text and not text.startswith("/"):
        raise ValueError(f"{name} must start with '/', got '{text}'")
    return text.rstrip("/")


def _switch(name: str, text: str) -> bool:
    """A switch's value: given alone, true; else a BOOL, refused naming the flag."""
    try:
        return not text or parse_bool(text)
    except ValueError as exc:
        raise ValueError(f"argument {name}: {exc}") from None


def _read(_name: str, given: Sequence[tuple[str, str]]) -> Serving:
    interval, root_path, no_docs = 0, "", False
    for name, text in given:
        if name == _KEEP_ALIVE:
            interval = _interval(name, text)
        elif name == _ROOT_PATH:
            root_path = _root_path(name, text)
        else:
            no_docs = _switch(name, text)
    return Serving(interval, root_path, no_docs)
