"""How a setting is written on the command line: its `Flag` (names, help, parse and
check functions, --help section), the parse and check functions that
server/startup/settings.py names in its fields, and the flags it gives several fields.
Each parse or check raises ValueError with a message for people, which the command line
turns into a usage error.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ge_serve.backends.ge.sim_cost import parse_sim_cost
from ge_serve.backends.text_bool import parse_bool

from ..control.restrictions import GRPC_HEADER_PREFIX, RestrictedApis
from ..inference.header_forward import pattern_setting
from ..observability.metricsconfig import MetricsConfig
from ..observability.traceconfig import check_level

Rule = tuple[str, str, str]

FLAG: Final = "flag"


@dataclass(frozen=True, slots=True)
class Flag:
    """How one setting is written on the command line."""

    # The first is the one messages name; empty: `--<field-name>`.
    names: tuple[str, ...] = ()
    help: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    # text -> value; None: the default's type (bool: parse_bool), or the text itself.
    parse: Callable[[str], Any] | None = None
    # Given any number of times; the setting is the tuple of the parsed values.
    repeat: bool = False
    # One or more values after the flag (vLLM's list flags); given again, more of them.
    several: bool = False
    # Left out: the value of this environment variable, as one of `several`.
    env: str | None = None
    required: bool = False
    # Present or absent, taking no value.
    switch: bool = False
    # A BOOL that may also be given alone, meaning true (vLLM's boolean flags).
    bare: bool = False
    # Repeated, each as (the flag's name as given, its value).
    record_flag: bool = False
    # A deprecated BOOL spelling of a switch: true turns the switch on.
    true_alias: tuple[str, str] | None = None  # (name, help)
    # Left out (or empty): the value of this other, earlier setting.
    fallback: str | None = None
    # (flag name, value) -> the setting's value, once the whole command line is parsed.
    check: Callable[[str, Any], Any] | None = None
    group: str | None = None


def flag(*names: str, **options: Any) -> Mapping[str, Flag]:
    """Field metadata: `field(default=..., metadata=flag("--name", help=...))`."""
    return {FLAG: Flag(names=names, **options)}


def flag_of(setting: dataclasses.Field[Any]) -> Flag:
    """A field's flag, with the implied name, parse function and metavar filled in."""
    spec: Flag = setting.metadata.get(FLAG, Flag())
    names = spec.names or ("--" + setting.name.replace("_", "-"),)
    parse, metavar = spec.parse, spec.metavar
    default = setting.default
    if parse is None and not spec.switch and not spec.repeat:
        if isinstance(default, bool):
            parse, metavar = parse_bool, metavar or "BOOL"
        elif isinstance(default, int | float):
            parse = type(default)
    return dataclasses.replace(spec, names=names, parse=parse, metavar=metavar)


def given_value(name: str, text: str) -> str:
    """A recorded flag's value (`record_flag`); given alone, refused in argparse's words
    for a flag that needs its value."""
    if not text:
        raise ValueError(f"argument {name}: expected one argument")
    return text


def switch_value(name: str, text: str) -> bool:
    """A recorded switch's value (vLLM's boolean flags): given alone, true; else a BOOL,
    refused naming the flag."""
    try:
        return not text or parse_bool(text)
    except ValueError as exc:
        raise ValueError(f"argument {name}: {exc}") from None


def key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ValueError(f"expected <key>=<value>, got '{text}'")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def backend_setting(text: str) -> tuple[str, str]:
    """`<backend>,<key>=<value>` as (`<backend>.<key>`, value); Triton's backend-agnostic
    `<key>=<value>` (e.g. `default-max-batch-size=8`) as (`<key>`, value). An empty backend,
    setting or value is refused in Triton's words (command_line_parser.cc)."""
    backend, comma, rest = text.partition(",")
    if comma and not backend:
        raise ValueError(
            "No backend specified. --backend-config option format is <backend name>,"
            f"<setting>=<value> or <setting>=<value>. Got {text}"
        )
    if not comma or "=" in backend:
        backend, rest = "", text
    key, value = key_value(rest)
    if not key or not value:
        raise ValueError(
            f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {text}"
        )
    return (f"{backend}.{key}" if backend else key), value


def model_config_name(text: str) -> str:
    """Triton's --model-config-name: a name, never empty."""
    if not text:
        raise ValueError("empty argument")
    return text


# Triton's backend-agnostic --backend-config key, also given per backend.
DEFAULT_MAX_BATCH_SIZE_KEY: Final = "default-max-batch-size"


def backend_config(name: str, value: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """Check the --backend-config settings ge-serve reads itself: every
    default-max-batch-size, global or for one backend, is a whole number >= 0."""
    for key, text in value:
        if key.rpartition(".")[2] != DEFAULT_MAX_BATCH_SIZE_KEY:
            continue
        try:
            number = int(text)
        except ValueError:
            number = -1
        if number < 0:
            raise ValueError(f"{name} {key}: expected an integer >= 0, got '{text}'")
    return value


# The logging extension's verbose levels are unsigned 32-bit, as Triton's.
MAX_VERBOSE_LEVEL: Final = 2**32 - 1


def verbose_level(text: str) -> int:
    """Triton's --log-verbose: a level, or true (1) / false (0)."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return int(lowered == "true")
    try:
        level = int(lowered)
    except ValueError:
        level = -1
    if not 0 <= level <= MAX_VERBOSE_LEVEL:
        raise ValueError(
            f"expected a verbose level (0 to {MAX_VERBOSE_LEVEL}) or true/false, got '{text}'"
        )
    return level


def appendable_file(name: str, value: str) -> str:
    """A --log-file the server can append to. It is opened (so created) here, once, so
    that a path that cannot be written is a usage error, not a traceback as logging
    starts."""
    if value:
        try:
            with open(value, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise ValueError(f"{name}: cannot open '{value}': {exc.strerror}") from None
    return value


def whole_ms(text: str) -> int:
    """Milliseconds, where Triton also takes a fraction (--metrics-interval-ms 500.0)."""
    try:
        return int(float(text))
    except ValueError:
        raise ValueError(f"expected milliseconds, got '{text}'") from None


def trace_levels(name: str, values: tuple[str, ...]) -> tuple[str, ...]:
    return check_level(values)


def restriction(text: str) -> list[Rule]:
    """Triton's `<category>[,<category>...]:<header>=<value>`."""
    categories, sep, rest = text.partition(":")
    if not sep or "=" not in rest or not categories:
        raise ValueError(f"expected <category>[,<category>]:<header>=<value>, got '{text}'")
    header, value = rest.split("=", 1)
    return [(c.strip(), header.strip(), value.strip()) for c in categories.split(",")]


def restriction_rules(name: str, groups: tuple[list[Rule], ...]) -> tuple[Rule, ...]:
    """Every rule of a repeated flag, checked by the class that will enforce them."""
    rules = tuple(rule for group in groups for rule in group)
    RestrictedApis(rules, GRPC_HEADER_PREFIX if name.startswith("--grpc") else "")
    return rules


def restriction_flag(group: str) -> Mapping[str, Flag]:
    """The flag of each front end's restricted APIs: repeated <category>:<header>=<value>."""
    return flag(
        repeat=True,
        parse=restriction,
        check=restriction_rules,
        metavar="CATEGORY[,CATEGORY]:HEADER=VALUE",
        help="API categories that need this header and value",
        group=group,
    )


def forwarding_flag(what: str, group: str | None = None) -> Mapping[str, Flag]:
    """The flag of a front end's header forwarding: a regex ("" forwards nothing)."""
    help = f"{what} whose names match (anywhere, any case) become request parameters"
    return flag(check=pattern_setting, metavar="REGEX", help=help, group=group)


def metrics_config(name: str, pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    MetricsConfig.parse(pairs)  # a bad key is a usage error, not a failed start
    return pairs


def sim_cost(name: str, value: str) -> str:
    """--sim-cost must name a profile or give both figures (parsed again where used)."""
    parse_sim_cost(value)
    return value


def unique_folders(name: str, paths: tuple[Path, ...]) -> tuple[Path, ...]:
    """Each folder once, as given first: Triton keeps a set of repository paths, and a
    folder given twice (or by a link to it) would make every model in it a duplicate."""
    kept: dict[str, Path] = {}
    for path in paths:
        kept.setdefault(os.path.realpath(path), path)
    return tuple(kept.values())


def non_negative(name: str, value: int) -> int:
    if value < 0:
        raise ValueError(f"{name} must be >= 0")
    return value


def positive(name: str, value: int) -> int:
    """Triton's check of --http-max-input-size, with its words ("Error: " included: its qa
    greps the log for them)."""
    if value <= 0:
        raise ValueError(f"Error: {name} must be greater than 0.")
    return value


def port(text: str) -> int:
    """A TCP port as Triton reads one: any integer. Only an endpoint that is on needs one
    in range, checked once the whole command line is read (ports.py)."""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected a port number, got '{text}'") from None


def seconds(text: str) -> float:
    """A finite number of seconds >= 0 (Triton reads these flags as integers)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected seconds, got '{text}'") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"expected a finite number of seconds >= 0, got '{text}'")
    return value


_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}


def size(text: str) -> int:
    """A byte count with an optional unit: 1073741824, 512MiB, 16GiB, 2GB."""
    stripped = text.strip().lower()
    number = stripped.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = stripped[len(number) :]
    if unit not in _UNITS or not number:
        raise ValueError(f"expected a size such as 16GiB, got '{text}'")
    return int(float(number) * _UNITS[unit])
