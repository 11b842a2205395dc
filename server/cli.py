"""Command line: argv becomes frozen settings; `main` hands them to the composition root."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .restrictions import RestrictedApis


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _key_value(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected <key>=<value>, got '{text}'")
    key, value = text.split("=", 1)
    return key.strip(), value.strip()


def _restriction(text: str) -> list[tuple[str, str, str]]:
    """Triton's `<category>[,<category>...]:<header>=<value>`."""
    categories, sep, rest = text.partition(":")
    if not sep or "=" not in rest or not categories:
        raise argparse.ArgumentTypeError(
            f"expected <category>[,<category>]:<header>=<value>, got '{text}'"
        )
    header, value = rest.split("=", 1)
    return [(c.strip(), header.strip().lower(), value.strip()) for c in categories.split(",")]


def _restriction_rules(
    parser: argparse.ArgumentParser, flag: str, groups: list[list[tuple[str, str, str]]]
) -> tuple[tuple[str, str, str], ...]:
    """Every rule of a repeated flag, checked by the class that will enforce them."""
    rules = tuple(rule for group in groups for rule in group)
    try:
        RestrictedApis(rules)
    except ValueError as exc:
        parser.error(f"{flag}: {exc}")
    return rules


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


def _size(text: str) -> int:
    """A byte count with an optional unit: 1073741824, 512MiB, 16GiB, 2GB."""
    stripped = text.strip().lower()
    number = stripped.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = stripped[len(number) :]
    if unit not in _UNITS or not number:
        raise argparse.ArgumentTypeError(f"expected a size such as 16GiB, got '{text}'")
    return int(float(number) * _UNITS[unit])


@dataclass(frozen=True, slots=True)
class Settings:
    model_repositories: tuple[Path, ...]
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    model_control_mode: str = "none"
    load_models: tuple[str, ...] = ()
    repository_poll_secs: float = 15.0
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: float = 30.0
    disable_auto_complete_config: bool = False
    http_max_input_size: int = 64 * 1024 * 1024
    allow_client_shm: bool = True
    log_verbose: int = 0
    log_info: bool = True
    metrics_config: tuple[tuple[str, str], ...] = ()
    backend_config: tuple[tuple[str, str], ...] = ()
    # gRPC front end
    grpc_keepalive_time_ms: int = 7_200_000
    grpc_keepalive_timeout_ms: int = 20_000
    grpc_keepalive_permit_without_calls: bool = False
    grpc_http2_max_pings_without_data: int = 2
    grpc_http2_min_recv_ping_interval_without_data_ms: int = 300_000
    # Restricted APIs: (category, header, value), Triton's <category>:<header>=<value>
    http_restricted_api: tuple[tuple[str, str, str], ...] = ()
    grpc_restricted_protocol: tuple[tuple[str, str, str], ...] = ()
    # GE backend and its device
    device: str = "auto"
    sim_devices: int = 1
    sim_device_memory: int = 16 * 1024**3
    atc_cache_dir: str = ""
    # Scheduler
    adaptive_batching: bool = False
    gil_switch_interval_us: int = 1000
    # Metrics
    metrics_interval_ms: int = 2000
    allow_cpu_metrics: bool = True
    allow_gpu_metrics: bool = True
    extra: dict[str, str] = field(default_factory=dict)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ge-serve",
        description="Triton-compatible inference server for Ascend NPUs (CANN/GE), "
        "with a simulated device and a host CPU backend.",
    )
    add = parser.add_argument
    add(
        "--model-repository",
        "--model-repo",
        "--model-store",
        dest="model_repositories",
        action="append",
        type=Path,
        required=True,
        help="model repository folder (repeatable)",
    )
    add("--http-address", default="0.0.0.0")
    add("--http-port", type=int, default=8000)
    add("--grpc-address", default="0.0.0.0")
    add("--grpc-port", type=int, default=8001)
    add("--metrics-address", default=None, help="defaults to --http-address")
    add("--metrics-port", type=int, default=8002)
    add("--allow-http", type=_bool, default=True, metavar="BOOL")
    add("--allow-grpc", type=_bool, default=True, metavar="BOOL")
    add("--allow-metrics", type=_bool, default=True, metavar="BOOL")
    add("--model-control-mode", choices=["none", "poll", "explicit"], default="none")
    add(
        "--load-model",
        action="append",
        default=[],
        help="model to load at startup in explicit mode (repeatable; '*' loads all)",
    )
    add("--repository-poll-secs", type=float, default=15.0)
    add("--strict-readiness", type=_bool, default=True, metavar="BOOL")
    add("--exit-on-error", type=_bool, default=True, metavar="BOOL")
    add("--exit-timeout-secs", type=float, default=30.0)
    add("--disable-auto-complete-config", action="store_true")
    add(
        "--strict-model-config",
        type=_bool,
        default=None,
        metavar="BOOL",
        help="deprecated Triton alias: true disables auto-complete",
    )
    add("--http-max-input-size", type=int, default=64 * 1024 * 1024)
    add("--allow-client-shm", type=_bool, default=True, metavar="BOOL")
    add("--log-verbose", type=int, default=0)
    add("--log-info", type=_bool, default=True, metavar="BOOL")
    add(
        "--metrics-config",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="e.g. summary_latencies=true",
    )
    add("--backend-config", action="append", default=[], metavar="BACKEND,KEY=VALUE")
    grpc = parser.add_argument_group("gRPC")
    grpc.add_argument("--grpc-keepalive-time", type=int, default=7_200_000, metavar="MS")
    grpc.add_argument("--grpc-keepalive-timeout", type=int, default=20_000, metavar="MS")
    grpc.add_argument(
        "--grpc-keepalive-permit-without-calls", type=_bool, default=False, metavar="BOOL"
    )
    grpc.add_argument("--grpc-http2-max-pings-without-data", type=int, default=2)
    grpc.add_argument(
        "--grpc-http2-min-recv-ping-interval-without-data",
        type=int,
        default=300_000,
        metavar="MS",
    )
    restricted = parser.add_argument_group("restricted APIs")
    restricted.add_argument(
        "--http-restricted-api",
        action="append",
        type=_restriction,
        default=[],
        metavar="CATEGORY[,CATEGORY]:HEADER=VALUE",
    )
    restricted.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        type=_restriction,
        default=[],
        metavar="CATEGORY[,CATEGORY]:HEADER=VALUE",
    )
    device = parser.add_argument_group("device (GE backend)")
    device.add_argument(
        "--device",
        choices=["auto", "npu", "sim"],
        default="auto",
        help="auto: real pyACL when `import acl` works and reports a device",
    )
    device.add_argument("--sim-devices", type=int, default=1, help="simulated NPU count")
    device.add_argument(
        "--sim-device-memory",
        type=_size,
        default=16 * 1024**3,
        metavar="BYTES",
        help="memory per simulated device, e.g. 16GiB",
    )
    device.add_argument("--atc-cache-dir", default="", help="where compiled OM files are kept")
    sched = parser.add_argument_group("scheduler")
    sched.add_argument(
        "--adaptive-batching",
        type=_bool,
        default=False,
        metavar="BOOL",
        help="turn on the adaptive batch controller for every batching model",
    )
    sched.add_argument(
        "--gil-switch-interval-us",
        type=int,
        default=1000,
        metavar="US",
        help="how long the event loop may hold the GIL while an executor thread waits for "
        "it (Python's default is 5000); 0 leaves Python's setting",
    )
    metrics = parser.add_argument_group("metrics")
    metrics.add_argument("--metrics-interval-ms", type=int, default=2000)
    metrics.add_argument("--allow-cpu-metrics", type=_bool, default=True, metavar="BOOL")
    metrics.add_argument("--allow-gpu-metrics", type=_bool, default=True, metavar="BOOL")
    return parser


def parse_settings(argv: list[str]) -> Settings:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .metrics import MetricsConfig  # checked here so a bad key is a usage error

    try:
        MetricsConfig.parse(args.metrics_config)
    except ValueError as exc:
        parser.error(str(exc))
    if args.gil_switch_interval_us < 0:
        parser.error("--gil-switch-interval-us must be >= 0")
    autocomplete_off = args.disable_auto_complete_config or bool(args.strict_model_config)
    backend_config = []
    for item in args.backend_config:
        backend, _, rest = item.partition(",")
        key, value = _key_value(rest)
        backend_config.append((f"{backend}.{key}", value))
    return Settings(
        model_repositories=tuple(args.model_repositories),
        http_address=args.http_address,
        http_port=args.http_port,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        metrics_address=args.metrics_address or args.http_address,
        metrics_port=args.metrics_port,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_model),
        repository_poll_secs=args.repository_poll_secs,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        exit_timeout_secs=args.exit_timeout_secs,
        disable_auto_complete_config=autocomplete_off,
        http_max_input_size=args.http_max_input_size,
        allow_client_shm=args.allow_client_shm,
        log_verbose=args.log_verbose,
        log_info=args.log_info,
        metrics_config=tuple(args.metrics_config),
        backend_config=tuple(backend_config),
        grpc_keepalive_time_ms=args.grpc_keepalive_time,
        grpc_keepalive_timeout_ms=args.grpc_keepalive_timeout,
        grpc_keepalive_permit_without_calls=args.grpc_keepalive_permit_without_calls,
        grpc_http2_max_pings_without_data=args.grpc_http2_max_pings_without_data,
        grpc_http2_min_recv_ping_interval_without_data_ms=(
            args.grpc_http2_min_recv_ping_interval_without_data
        ),
        http_restricted_api=_restriction_rules(
            parser, "--http-restricted-api", args.http_restricted_api
        ),
        grpc_restricted_protocol=_restriction_rules(
            parser, "--grpc-restricted-protocol", args.grpc_restricted_protocol
        ),
        device=args.device,
        sim_devices=args.sim_devices,
        sim_device_memory=args.sim_device_memory,
        atc_cache_dir=args.atc_cache_dir,
        adaptive_batching=args.adaptive_batching,
        gil_switch_interval_us=args.gil_switch_interval_us,
        metrics_interval_ms=args.metrics_interval_ms,
        allow_cpu_metrics=args.allow_cpu_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
    )


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(sys.argv[1:] if argv is None else argv)
    from .app import run  # the composition root; imported late so --help stays fast

    return run(settings)


if __name__ == "__main__":
    sys.exit(main())
