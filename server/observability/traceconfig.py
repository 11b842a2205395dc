"""`--trace-config [<mode>,]<setting>=<value>`: Triton's trace settings at startup.

Global settings (`rate`, `level`, `count`, `mode`) have no mode; `triton,file=...` and
`triton,log-frequency=...` belong to Triton's trace files; `opentelemetry,url=...`,
`resource=k=v` and the batch span processor's `bsp_*` to OpenTelemetry export. The
deprecated `--trace-file`, `--trace-level`, `--trace-rate`, `--trace-count` and
`--trace-log-frequency` say the same, and `--trace-config` wins where both are given.

`TraceSettings` is also what the trace extension reads and changes at run time (its
names there are `trace_file`, `trace_level`, `trace_rate`, `trace_count` and
`log_frequency`).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Final

TRITON: Final = "triton"
OPENTELEMETRY: Final = "opentelemetry"
MODES: Final = (TRITON, OPENTELEMETRY)
LEVELS: Final = ("OFF", "TIMESTAMPS", "TENSORS")
DEFAULT_OTLP_URL: Final = "http://localhost:4318/v1/traces"

_GLOBAL: Final = ("rate", "level", "count", "mode")
_BY_MODE: Final = {
    TRITON: ("file", "log-frequency", "log_frequency"),
    OPENTELEMETRY: (
        "url",
        "resource",
        "bsp_max_queue_size",
        "bsp_schedule_delay",
        "bsp_max_export_batch_size",
    ),
}


@dataclass(frozen=True, slots=True)
class OtelSettings:
    url: str = DEFAULT_OTLP_URL
    resource: tuple[tuple[str, str], ...] = (("service.name", "triton-inference-server"),)
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay_ms: int = 5000
    bsp_max_export_batch_size: int = 512


@dataclass(frozen=True, slots=True)
class TraceSettings:
    mode: str = TRITON
    # Empty: OFF. TIMESTAMPS and/or TENSORS otherwise.
    level: tuple[str, ...] = ()
    rate: int = 1000
    # Traces still to take; -1: no limit.
    count: int = -1
    log_frequency: int = 0
    file: str = ""
    otel: OtelSettings = OtelSettings()


def trace_setting(text: str) -> tuple[str, str, str]:
    """`triton,file=/tmp/t.json` as ("triton", "file", "/tmp/t.json"); `rate=1` as
    ("", "rate", "1"). The mode is checked here; a setting this server does not know is
    kept, to be warned about and ignored (`unknown_settings`), as Triton ignores it."""
    head, equals, value = text.partition("=")
    if not equals:
        raise ValueError(f"--trace-config option format is '<mode>,<setting>=<value>'. Got {text}")
    mode, comma, key = head.partition(",")
    if not comma:
        mode, key = "", head
    mode, key = mode.strip().lower(), key.strip()
    if mode and mode not in MODES:
        raise ValueError(f"unknown trace mode '{mode}': expected 'triton' or 'opentelemetry'")
    return mode, key, value.strip()


def _known(mode: str, key: str) -> bool:
    return key in (_BY_MODE[mode] if mode else _GLOBAL)


def unknown_settings(entries: tuple[tuple[str, str, str], ...]) -> list[str]:
    """A warning for each `--trace-config` setting that is ignored, naming the setting
    that was probably meant."""
    spellings = [key for key in _GLOBAL] + [
        f"{mode},{key}" for mode, keys in _BY_MODE.items() for key in keys
    ]
    warnings = []
    for mode, key, _ in entries:
        if _known(mode, key):
            continue
        written = f"{mode},{key}" if mode else key
        where = f"'{mode}' " if mode else "global "
        # The same key under another mode first (a global key given as a mode's, or the
        # other way round), then the closest spelling.
        close = [s for s in spellings if s.split(",")[-1] == key] or difflib.get_close_matches(
            written, spellings, n=1, cutoff=0.5
        )
        hint = f"; did you mean '{close[0]}'?" if close else ""
        warnings.append(f"--trace-config: ignoring unknown {where}trace setting '{key}'{hint}")
    return warnings


def _int(key: str, value: str, low: int) -> int:
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"trace setting '{key}' must be an integer, got '{value}'") from None
    if number < low:
        raise ValueError(f"trace setting '{key}' must be >= {low}, got {number}")
    return number


# Triton's startup flags also take these words, in any case (command_line_parser.cc
# ParseTraceLevelOption); qa's L0_cmdline_trace and L0_batcher start with MIN and MAX. The
# trace extension takes only OFF, TIMESTAMPS and TENSORS, as Triton's does.
_ALIASES: Final = {
    "FALSE": "OFF",
    "TRUE": "TIMESTAMPS",
    "ON": "TIMESTAMPS",
    "MIN": "TIMESTAMPS",
    "MAX": "TIMESTAMPS",
}


def check_level(values: tuple[str, ...]) -> tuple[str, ...]:
    """Trace levels as kept: OFF alone means none."""
    levels: list[str] = []
    for value in values:
        upper = value.strip().upper()
        upper = _ALIASES.get(upper, upper)
        if upper not in LEVELS:
            raise ValueError(
                f"invalid trace level '{value}': expected OFF, TIMESTAMPS or TENSORS "
                "(or false, true, on, min, max)"
            )
        if upper == "OFF":
            levels.clear()
        elif upper not in levels:
            levels.append(upper)
    return tuple(levels)


def trace_settings(
    entries: tuple[tuple[str, str, str], ...],
    file: str = "",
    level: tuple[str, ...] = (),
    rate: int | None = None,
    count: int | None = None,
    log_frequency: int | None = None,
) -> TraceSettings:
    """The startup trace settings: the deprecated flags first, then `--trace-config`."""
    base = TraceSettings()
    settings = dataclasses.replace(
        base,
        file=file,
        level=check_level(level),
        rate=base.rate if rate is None else _int("rate", str(rate), 0),
        count=base.count if count is None else _int("count", str(count), -1),
        log_frequency=(
            base.log_frequency
            if log_frequency is None
            else _int("log-frequency", str(log_frequency), 0)
        ),
    )
    levels: list[str] = []
    otel = settings.otel
    resource = dict(otel.resource)
    for mode, key, value in entries:
        if not _known(mode, key):
            continue  # warned about at startup (unknown_settings)
        if not mode:
            if key == "rate":
                settings = dataclasses.replace(settings, rate=_int(key, value, 0))
            elif key == "count":
                settings = dataclasses.replace(settings, count=_int(key, value, -1))
            elif key == "mode":
                if value.lower() not in MODES:
                    raise ValueError(
                        f"unknown trace mode '{value}': expected 'triton' or 'opentelemetry'"
                    )
                settings = dataclasses.replace(settings, mode=value.lower())
            else:
                levels.append(value)
        elif mode == TRITON:
            if key == "file":
                settings = dataclasses.replace(settings, file=value)
            else:
                settings = dataclasses.replace(settings, log_frequency=_int(key, value, 0))
        elif key == "url":
            otel = dataclasses.replace(otel, url=value)
        elif key == "resource":
            name, equals, text = value.partition("=")
            if not equals or not name:
                raise ValueError(f"trace resource must be <key>=<value>, got '{value}'")
            resource[name.strip()] = text.strip()
        elif key == "bsp_schedule_delay":
            otel = dataclasses.replace(otel, bsp_schedule_delay_ms=_int(key, value, 0))
        elif key == "bsp_max_queue_size":
            otel = dataclasses.replace(otel, bsp_max_queue_size=_int(key, value, 1))
        else:
            otel = dataclasses.replace(otel, bsp_max_export_batch_size=_int(key, value, 1))
    if levels:
        settings = dataclasses.replace(settings, level=check_level(tuple(levels)))
    otel = dataclasses.replace(otel, resource=tuple(resource.items()))
    if otel.bsp_max_export_batch_size > otel.bsp_max_queue_size:
        raise ValueError(
            "trace setting 'bsp_max_export_batch_size' must be <= 'bsp_max_queue_size'"
        )
    return dataclasses.replace(settings, otel=otel)
