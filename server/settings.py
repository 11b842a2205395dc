"""The server's settings, each defined once: its name, type, default, flag and help.

`Settings` is the frozen value the composition root (server/app.py) builds every part
from. The command line (server/cli.py) is generated from its fields, so a setting that is
added here is a flag at once, with this default and this help, and nothing else repeats it.

A field is the flag `--<field-name>` (underscores as dashes), parsed by its default's type
(a bool as true/false, shown as BOOL). `field(metadata=flag(...))` says what differs: other
names, a help line, a repeatable flag, a parse or check function, the --help section.
Parse and check functions raise ValueError with a message for people; the command line
turns it into a usage error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ge_serve.backends.ge.sim_cost import parse_sim_cost
from ge_serve.scheduler.ratelimit import resource_limit

from .boolean import parse_bool
from .cacheconfig import cache_setting, cache_size
from .logsettings import FORMATS
from .metricsconfig import MetricsConfig
from .restrictions import RestrictedApis
from .traceconfig import TraceSettings, check_level, trace_setting, trace_settings
from .tritonflags import INAPPLICABLE

FLAG: Final = "flag"

# --help sections, in the order they are shown.
GRPC: Final = "gRPC"
RESTRICTED: Final = "restricted APIs"
DEVICE: Final = "device (GE backend)"
SCHEDULER: Final = "scheduler"
METRICS: Final = "metrics"
LOGGING: Final = "logging"
MODELS: Final = "model loading"
CACHE: Final = "response cache"
TRACING: Final = "tracing"
RATE_LIMIT: Final = "rate limiter"
INAPPLICABLE_GROUP: Final = "accepted for Triton compatibility, with no effect"

Rule = tuple[str, str, str]


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
    required: bool = False
    # Present or absent, taking no value.
    switch: bool = False
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


def key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ValueError(f"expected <key>=<value>, got '{text}'")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def backend_setting(text: str) -> tuple[str, str]:
    """`<backend>,<key>=<value>` as (`<backend>.<key>`, value); Triton's backend-agnostic
    `<key>=<value>` (e.g. `default-max-batch-size=8`) as (`<key>`, value)."""
    backend, comma, rest = text.partition(",")
    if not comma or "=" in backend:
        return key_value(text)
    key, value = key_value(rest)
    return f"{backend}.{key}", value


def verbose_level(text: str) -> int:
    """Triton's --log-verbose: a level, or true (1) / false (0)."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return int(lowered == "true")
    try:
        return int(lowered)
    except ValueError:
        raise ValueError(f"expected a verbose level or true/false, got '{text}'") from None


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
    return [(c.strip(), header.strip().lower(), value.strip()) for c in categories.split(",")]


def restriction_rules(name: str, groups: tuple[list[Rule], ...]) -> tuple[Rule, ...]:
    """Every rule of a repeated flag, checked by the class that will enforce them."""
    rules = tuple(rule for group in groups for rule in group)
    try:
        RestrictedApis(rules)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    return rules


def metrics_config(name: str, pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    MetricsConfig.parse(pairs)  # a bad key is a usage error, not a failed start
    return pairs


def _sim_cost(name: str, value: str) -> str:
    """--sim-cost must name a profile or give both figures (parsed again where used)."""
    parse_sim_cost(value)
    return value


def non_negative(name: str, value: int) -> int:
    if value < 0:
        raise ValueError(f"{name} must be >= 0")
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


def _restriction_flag() -> Mapping[str, Flag]:
    """The flag of each front end's restricted APIs: repeated <category>:<header>=<value>."""
    return flag(
        repeat=True,
        parse=restriction,
        check=restriction_rules,
        metavar="CATEGORY[,CATEGORY]:HEADER=VALUE",
        group=RESTRICTED,
    )


@dataclass(frozen=True, slots=True)
class Settings:
    model_repositories: tuple[Path, ...] = field(
        metadata=flag(
            "--model-repository",
            "--model-repo",
            "--model-store",
            parse=Path,
            repeat=True,
            required=True,
            help="model repository folder (repeatable)",
        )
    )
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    metrics_address: str = field(
        default="0.0.0.0", metadata=flag(fallback="http_address", help="defaults to --http-address")
    )
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    model_control_mode: str = field(
        default="none", metadata=flag(choices=("none", "poll", "explicit"))
    )
    load_models: tuple[str, ...] = field(
        default=(),
        metadata=flag(
            "--load-model",
            repeat=True,
            metavar="LOAD_MODEL",
            help="model to load at startup in explicit mode (repeatable; '*' loads all)",
        ),
    )
    repository_poll_secs: float = 15.0
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: float = 30.0
    disable_auto_complete_config: bool = field(
        default=False,
        metadata=flag(
            switch=True,
            true_alias=(
                "--strict-model-config",
                "deprecated Triton alias: true disables auto-complete",
            ),
        ),
    )
    http_max_input_size: int = 64 * 1024 * 1024
    allow_client_shm: bool = True
    log_verbose: int = field(
        default=0, metadata=flag(parse=verbose_level, metavar="LEVEL", group=LOGGING)
    )
    log_info: bool = field(default=True, metadata=flag(group=LOGGING))
    log_warning: bool = field(default=True, metadata=flag(group=LOGGING))
    log_error: bool = field(default=True, metadata=flag(group=LOGGING))
    log_format: str = field(default="default", metadata=flag(choices=FORMATS, group=LOGGING))
    log_file: str = field(
        default="", metadata=flag(help="append the log to this file, not stderr", group=LOGGING)
    )
    id: str = field(default="triton", metadata=flag(help="the server's name in its metadata"))
    model_load_thread_count: int = field(
        default=4, metadata=flag(help="models loaded at the same time", group=MODELS)
    )
    model_load_retry_count: int = field(
        default=0, metadata=flag(check=non_negative, help="retries of a failed load", group=MODELS)
    )
    model_config_name: str = field(
        default="",
        metadata=flag(
            help="read configs/<NAME>.pbtxt where a model has one, else config.pbtxt",
            group=MODELS,
        ),
    )
    model_namespacing: bool = field(
        default=False,
        metadata=flag(
            help="each model repository is a namespace: a name may be in several of them",
            group=MODELS,
        ),
    )
    reuse_http_port: bool = False
    reuse_grpc_port: bool = field(default=False, metadata=flag(group=GRPC))
    metrics_config: tuple[tuple[str, str], ...] = field(
        default=(),
        metadata=flag(
            repeat=True,
            parse=key_value,
            check=metrics_config,
            metavar="KEY=VALUE",
            help="e.g. summary_latencies=true",
        ),
    )
    # ("<backend>.<key>", value)
    backend_config: tuple[tuple[str, str], ...] = field(
        default=(), metadata=flag(repeat=True, parse=backend_setting, metavar="BACKEND,KEY=VALUE")
    )
    grpc_use_ssl: bool = field(default=False, metadata=flag(group=GRPC))
    grpc_use_ssl_mutual: bool = field(
        default=False, metadata=flag(help="TLS that also requires client certificates", group=GRPC)
    )
    grpc_server_cert: str = field(default="", metadata=flag(metavar="PEM", group=GRPC))
    grpc_server_key: str = field(default="", metadata=flag(metavar="PEM", group=GRPC))
    grpc_root_cert: str = field(default="", metadata=flag(metavar="PEM", group=GRPC))
    grpc_infer_response_compression_level: str = field(
        default="none", metadata=flag(choices=("none", "low", "medium", "high"), group=GRPC)
    )
    grpc_keepalive_time_ms: int = field(
        default=7_200_000, metadata=flag("--grpc-keepalive-time", metavar="MS", group=GRPC)
    )
    grpc_keepalive_timeout_ms: int = field(
        default=20_000, metadata=flag("--grpc-keepalive-timeout", metavar="MS", group=GRPC)
    )
    grpc_keepalive_permit_without_calls: bool = field(default=False, metadata=flag(group=GRPC))
    grpc_http2_max_pings_without_data: int = field(default=2, metadata=flag(group=GRPC))
    grpc_http2_min_recv_ping_interval_without_data_ms: int = field(
        default=300_000,
        metadata=flag("--grpc-http2-min-recv-ping-interval-without-data", metavar="MS", group=GRPC),
    )
    grpc_http2_max_ping_strikes: int = field(default=2, metadata=flag(group=GRPC))
    # 0: no limit (Triton: undefined).
    grpc_max_connection_age_ms: int = field(
        default=0, metadata=flag("--grpc-max-connection-age", metavar="MS", group=GRPC)
    )
    grpc_max_connection_age_grace_ms: int = field(
        default=0, metadata=flag("--grpc-max-connection-age-grace", metavar="MS", group=GRPC)
    )
    # Restricted APIs: (category, header, value), Triton's <category>:<header>=<value>
    http_restricted_api: tuple[Rule, ...] = field(
        default=(),
        metadata=_restriction_flag(),
    )
    grpc_restricted_protocol: tuple[Rule, ...] = field(
        default=(),
        metadata=_restriction_flag(),
    )
    # Front-end worker processes (server/workers.py); 0: this process serves the protocol.
    http_workers: int = field(
        default=0,
        metadata=flag(
            metavar="N",
            check=non_negative,
            help="processes that accept HTTP connections and decode and encode inference "
            "requests, feeding this process's schedulers; 0 serves HTTP in this process",
        ),
    )
    grpc_workers: int = field(
        default=0,
        metadata=flag(
            metavar="N",
            check=non_negative,
            help="processes that accept gRPC connections and decode and encode inference "
            "requests, feeding this process's schedulers; 0 serves gRPC in this process",
            group=GRPC,
        ),
    )
    device: str = field(
        default="auto",
        metadata=flag(
            choices=("auto", "npu", "sim"),
            help="auto: real pyACL when `import acl` works and reports a device",
            group=DEVICE,
        ),
    )
    sim_devices: int = field(default=1, metadata=flag(help="simulated NPU count", group=DEVICE))
    sim_device_memory: int = field(
        default=16 * 1024**3,
        metadata=flag(
            parse=size,
            metavar="BYTES",
            help="memory per simulated device, e.g. 16GiB",
            group=DEVICE,
        ),
    )
    atc_cache_dir: str = field(
        default="", metadata=flag(help="where compiled OM files are kept", group=DEVICE)
    )
    sim_cost: str = field(
        default="",
        metadata=flag(
            metavar="PROFILE|launch_us=US,per_sample_us=US",
            check=_sim_cost,
            help="model the simulated NPU's execution time as launch + per-sample x batch "
            "(results still come from onnxruntime; metrics and logs say the timing is "
            "simulated): a profile (npu_ge_resnet50, or default) or the two figures; "
            "off by default",
            group=DEVICE,
        ),
    )
    adaptive_batching: bool = field(
        default=False,
        metadata=flag(
            help="turn on the adaptive batch controller for every batching model",
            group=SCHEDULER,
        ),
    )
    gil_switch_interval_us: int = field(
        default=1000,
        metadata=flag(
            metavar="US",
            check=non_negative,
            help="how long the event loop may hold the GIL while an executor thread waits "
            "for it (Python's default is 5000); 0 leaves Python's setting",
            group=SCHEDULER,
        ),
    )
    malloc_arena_max: int = field(
        default=2,
        metadata=flag(
            metavar="N",
            check=non_negative,
            help="how many malloc arenas glibc may keep; more let a long-running server's "
            "memory creep up by fragments (MALLOC_ARENA_MAX wins); 0 leaves glibc's default",
            group=SCHEDULER,
        ),
    )
    metrics_interval_ms: int = field(
        default=2000, metadata=flag(parse=whole_ms, metavar="MS", group=METRICS)
    )
    allow_cpu_metrics: bool = field(default=True, metadata=flag(group=METRICS))
    allow_gpu_metrics: bool = field(default=True, metadata=flag(group=METRICS))
    # (cache, setting, value), e.g. ("local", "size", "1048576")
    cache_config: tuple[tuple[str, str, str], ...] = field(
        default=(),
        metadata=flag(repeat=True, parse=cache_setting, metavar="CACHE,SETTING=VALUE", group=CACHE),
    )
    response_cache_byte_size: int = field(
        default=0, metadata=flag(help="deprecated: --cache-config local,size=BYTES", group=CACHE)
    )
    # (mode or "", setting, value)
    trace_config: tuple[tuple[str, str, str], ...] = field(
        default=(),
        metadata=flag(
            repeat=True, parse=trace_setting, metavar="[MODE,]SETTING=VALUE", group=TRACING
        ),
    )
    trace_file: str = field(default="", metadata=flag(help="deprecated", group=TRACING))
    trace_level: tuple[str, ...] = field(
        default=(), metadata=flag(repeat=True, check=trace_levels, group=TRACING)
    )
    # None: not given (--trace-config or the default decides).
    trace_rate: int | None = field(default=None, metadata=flag(parse=int, group=TRACING))
    trace_count: int | None = field(default=None, metadata=flag(parse=int, group=TRACING))
    trace_log_frequency: int | None = field(default=None, metadata=flag(parse=int, group=TRACING))
    rate_limit: str = field(
        default="off", metadata=flag(choices=("off", "execution_count"), group=RATE_LIMIT)
    )
    # (resource, count, device or -1 for every device)
    rate_limit_resource: tuple[tuple[str, int, int], ...] = field(
        default=(),
        metadata=flag(
            repeat=True, parse=resource_limit, metavar="NAME:COUNT[:DEVICE]", group=RATE_LIMIT
        ),
    )
    # (flag, value) of each tritonserver flag that does nothing here (tritonflags.py).
    inapplicable: tuple[tuple[str, str], ...] = field(
        default=(),
        metadata=flag(
            *(entry.flag for entry in INAPPLICABLE),
            repeat=True,
            record_flag=True,
            metavar="VALUE",
            help="tritonserver flags accepted with a warning; they do nothing here",
            group=INAPPLICABLE_GROUP,
        ),
    )

    def cache_size(self) -> int | None:
        """The response cache's byte budget; None: no cache. ValueError for flags that
        contradict each other."""
        return cache_size(self.cache_config, self.response_cache_byte_size)

    def trace(self) -> TraceSettings:
        """The startup trace settings, deprecated flags and --trace-config together."""
        return trace_settings(
            self.trace_config,
            self.trace_file,
            self.trace_level,
            self.trace_rate,
            self.trace_count,
            self.trace_log_frequency,
        )
