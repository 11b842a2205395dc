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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ge_serve.scheduler.ratelimit import resource_limit

from ..control.chat import ChatSettings
from ..control.cors import CorsSettings
from ..control.logsettings import FORMATS
from ..observability.traceconfig import TraceSettings, trace_setting, trace_settings
from . import vllmflags, vllmserve
from .cacheconfig import cache_setting, cache_size
from .chatflags import chat_flag
from .cloudflags import CloudSettings, cloud_flag
from .corsflags import cors_flag
from .flags import (
    Rule,
    appendable_file,
    backend_config,
    backend_setting,
    flag,
    forwarding_flag,
    key_value,
    metrics_config,
    model_config_name,
    non_negative,
    port,
    positive,
    restriction_flag,
    seconds,
    sim_cost,
    size,
    trace_levels,
    unique_folders,
    verbose_level,
    whole_ms,
)
from .grpcssl import GrpcSsl, grpc_ssl_flag
from .tritonflags import inapplicable_flag

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
            check=unique_folders,
            help="model repository folder (repeatable)",
        )
    )
    # Also vLLM's --host and --port.
    http_address: str = field(default="0.0.0.0", metadata=vllmflags.host_flag())
    http_port: int = field(default=8000, metadata=vllmflags.port_flag())
    grpc_address: str = field(
        default="0.0.0.0",
        metadata=flag(help="address the gRPC endpoint binds; 127.0.0.1 for this host only"),
    )
    grpc_port: int = field(default=8001, metadata=flag(parse=port, help="gRPC endpoint port"))
    metrics_address: str = field(
        default="0.0.0.0",
        metadata=flag(fallback="http_address", help="address /metrics binds; --http-address's"),
    )
    metrics_port: int = field(default=8002, metadata=flag(parse=port, help="port of /metrics"))
    allow_http: bool = field(default=True, metadata=flag(help="serve HTTP"))
    allow_grpc: bool = field(default=True, metadata=flag(help="serve gRPC"))
    allow_metrics: bool = field(default=True, metadata=flag(help="serve /metrics"))
    model_control_mode: str = field(
        default="none",
        metadata=flag(
            parse=str.lower,  # as Triton: EXPLICIT, Poll
            choices=("none", "poll", "explicit"),
            help="none: load every model at start; poll: follow the repository; explicit: "
            "load and unload through the repository API",
        ),
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
    repository_poll_secs: float = field(
        default=15.0, metadata=flag(parse=seconds, help="seconds between scans in poll mode")
    )
    strict_readiness: bool = field(default=True, metadata=flag(help="ready while all models are"))
    exit_on_error: bool = field(
        default=True, metadata=flag(help="exit when a model fails to load at start")
    )
    exit_timeout_secs: float = field(
        default=30.0, metadata=flag(parse=seconds, help="how long shutdown and unload wait")
    )
    disable_auto_complete_config: bool = field(
        default=False,
        metadata=flag(
            switch=True,
            true_alias=(
                "--strict-model-config",
                "deprecated Triton alias: true disables auto-complete",
            ),
            help="use configs as written; do not fill them in from the model files",
        ),
    )
    http_max_input_size: int = field(
        default=64 * 1024 * 1024, metadata=flag(check=positive, help="largest HTTP JSON, in bytes")
    )
    # Off unless asked for, as in Triton: a registered region is mapped and written to.
    allow_client_shm: bool = field(
        default=False, metadata=flag(help="let clients use shared memory")
    )
    log_verbose: int = field(
        default=0,
        metadata=flag(
            parse=verbose_level,
            metavar="LEVEL",
            help="ge-serve's verbose lines from 1 on; gRPC's own debug output is "
            "GRPC_VERBOSITY=debug's",
            group=LOGGING,
        ),
    )
    log_info: bool = field(default=True, metadata=flag(help="log info lines", group=LOGGING))
    log_warning: bool = field(default=True, metadata=flag(help="log warnings", group=LOGGING))
    log_error: bool = field(default=True, metadata=flag(help="log errors", group=LOGGING))
    log_format: str = field(
        default="default",
        metadata=flag(choices=FORMATS, help="line prefix: Triton's or ISO 8601", group=LOGGING),
    )
    log_file: str = field(
        default="",
        metadata=flag(
            check=appendable_file, help="append the log to this file, not stderr", group=LOGGING
        ),
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
        metadata=flag(parse=model_config_name, help="read configs/<NAME>.pbtxt", group=MODELS),
    )
    model_namespacing: bool = field(
        default=False,
        metadata=flag(
            help="each model repository is a namespace: a name may be in several of them",
            group=MODELS,
        ),
    )
    reuse_http_port: bool = field(
        default=False, metadata=flag(help="SO_REUSEPORT on the HTTP socket")
    )
    reuse_grpc_port: bool = field(
        default=False, metadata=flag(help="SO_REUSEPORT on the gRPC socket", group=GRPC)
    )
    metrics_config: tuple[tuple[str, str], ...] = field(
        default=(),
        metadata=flag(
            repeat=True,
            parse=key_value,
            check=metrics_config,
            metavar="KEY=VALUE",
            help="metric options, e.g. summary_latencies=true",
        ),
    )
    # ("<backend>.<key>", value)
    backend_config: tuple[tuple[str, str], ...] = field(
        default=(),
        metadata=flag(
            repeat=True,
            parse=backend_setting,
            check=backend_config,
            metavar="BACKEND,KEY=VALUE",
            help="a backend's setting, e.g. ge,device_ids=0,1",
        ),
    )
    backend_directory: Path = field(
        default=Path("/opt/tritonserver/backends"),  # Triton's
        metadata=flag(parse=Path, help="Python-based backends: <dir>/<name>/model.py"),
    )
    # --grpc-use-ssl and --grpc-use-ssl-mutual together: the last given wins (grpcssl.py)
    grpc_ssl: GrpcSsl = field(default=GrpcSsl(), metadata=grpc_ssl_flag(GRPC))
    grpc_server_cert: str = field(
        default="", metadata=flag(metavar="PEM", help="the server's certificate", group=GRPC)
    )
    grpc_server_key: str = field(
        default="", metadata=flag(metavar="PEM", help="the server's private key", group=GRPC)
    )
    grpc_root_cert: str = field(
        default="", metadata=flag(metavar="PEM", help="CA that signs client certs", group=GRPC)
    )
    grpc_infer_response_compression_level: str = field(
        default="none",
        metadata=flag(
            parse=str.lower,
            choices=("none", "low", "medium", "high"),
            help="compression of inference responses",
            group=GRPC,
        ),
    )
    grpc_keepalive_time_ms: int = field(
        default=7_200_000,
        metadata=flag(
            "--grpc-keepalive-time", metavar="MS", help="keepalive ping period", group=GRPC
        ),
    )
    grpc_keepalive_timeout_ms: int = field(
        default=20_000,
        metadata=flag("--grpc-keepalive-timeout", metavar="MS", help="ping ack wait", group=GRPC),
    )
    grpc_keepalive_permit_without_calls: bool = field(
        default=False, metadata=flag(help="keepalive pings with no call open", group=GRPC)
    )
    grpc_http2_max_pings_without_data: int = field(
        default=2, metadata=flag(help="pings sent with no data between (0: any)", group=GRPC)
    )
    grpc_http2_min_recv_ping_interval_without_data_ms: int = field(
        default=300_000,
        metadata=flag(
            "--grpc-http2-min-recv-ping-interval-without-data",
            metavar="MS",
            help="shortest ping interval accepted from a client",
            group=GRPC,
        ),
    )
    grpc_http2_max_ping_strikes: int = field(
        default=2, metadata=flag(help="bad pings before the connection closes", group=GRPC)
    )
    # 0: no limit (Triton: undefined).
    grpc_max_connection_age_ms: int = field(
        default=0,
        metadata=flag("--grpc-max-connection-age", metavar="MS", help="0: no limit", group=GRPC),
    )
    grpc_max_connection_age_grace_ms: int = field(
        default=0,
        metadata=flag(
            "--grpc-max-connection-age-grace",
            metavar="MS",
            help="time calls get after the age",
            group=GRPC,
        ),
    )
    # Restricted APIs: (category, header, value), Triton's <category>:<header>=<value>
    http_restricted_api: tuple[Rule, ...] = field(default=(), metadata=restriction_flag(RESTRICTED))
    grpc_restricted_protocol: tuple[Rule, ...] = field(
        default=(), metadata=restriction_flag(RESTRICTED)
    )
    # A regex; "" forwards nothing (server/inference/header_forward.py).
    http_header_forward_pattern: str = field(default="", metadata=forwarding_flag("HTTP headers"))
    grpc_header_forward_pattern: str = field(default="", metadata=forwarding_flag("metadata", GRPC))
    # vLLM's --api-key, VLLM_API_KEY's where absent: keys vLLM's routes need (http/apikey.py).
    api_key: tuple[str, ...] = field(default=(), repr=False, metadata=vllmflags.api_key_flag())
    # /v1 tool calling (Triton's OpenAI front end's flags).
    tool_call_parser: str = field(default="", metadata=vllmflags.tool_parser_flag())
    max_tool_call_parse_bytes: int = field(
        default=128 * 1024, metadata=vllmflags.tool_parse_bytes_flag()
    )
    # /v1 thoughts apart from answers (vLLM's flag).
    reasoning_parser: str = field(default="", metadata=vllmflags.reasoning_parser_flag())
    # vLLM's switches (vllmflags.py says what each does).
    enable_prompt_tokens_details: bool = field(default=False, metadata=vllmflags.details())
    enable_request_id_headers: bool = field(default=False, metadata=vllmflags.request_ids())
    enable_force_include_usage: bool = field(default=False, metadata=vllmflags.forced_usage())
    return_tokens_as_token_ids: bool = field(default=False, metadata=vllmflags.tokens_as_ids())
    enable_auto_tool_choice: bool = field(default=False, metadata=vllmflags.auto_tools())
    exclude_tools_when_tool_choice_none: bool = field(default=False, metadata=vllmflags.no_tools())
    # Front-end worker processes (server/workers/); 0: this process serves the protocol.
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
            check=sim_cost,
            help="model the simulated NPU's execution time as launch + per-sample x batch "
            "(results still come from onnxruntime; metrics and logs say the timing is "
            "simulated): a profile (npu_ge_resnet50, or default) or the two figures; "
            "off by default",
            group=DEVICE,
        ),
    )
    sim_perturb: float = field(
        default=0.0,
        metadata=flag(
            metavar="FRACTION",
            help="a test mode of the simulated NPU: float outputs come back as "
            "x * (1 + FRACTION) + FRACTION, as a conversion that lost accuracy would, so "
            "the load-time accuracy check (parameter accuracy_tolerance) can be seen to "
            "fail; 0 (off) by default",
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
        default=2000,
        metadata=flag(
            parse=whole_ms, metavar="MS", help="how often gauges are sampled", group=METRICS
        ),
    )
    allow_cpu_metrics: bool = field(
        default=True, metadata=flag(help="host CPU and memory gauges", group=METRICS)
    )
    allow_gpu_metrics: bool = field(
        default=True, metadata=flag(help="device (NPU) gauges", group=METRICS)
    )
    # (cache, setting, value), e.g. ("local", "size", "1048576")
    cache_config: tuple[tuple[str, str, str], ...] = field(
        default=(),
        metadata=flag(
            repeat=True,
            parse=cache_setting,
            metavar="CACHE,SETTING=VALUE",
            help="response cache, e.g. local,size=1048576",
            group=CACHE,
        ),
    )
    response_cache_byte_size: int = field(
        default=0, metadata=flag(help="deprecated: --cache-config local,size=BYTES", group=CACHE)
    )
    # (mode or "", setting, value)
    trace_config: tuple[tuple[str, str, str], ...] = field(
        default=(),
        metadata=flag(
            repeat=True,
            parse=trace_setting,
            metavar="[MODE,]SETTING=VALUE",
            help="trace settings, e.g. rate=100 or opentelemetry,url=...",
            group=TRACING,
        ),
    )
    trace_file: str = field(
        default="", metadata=flag(help="deprecated: --trace-config file=", group=TRACING)
    )
    trace_level: tuple[str, ...] = field(
        default=(),
        metadata=flag(
            repeat=True, check=trace_levels, help="deprecated: --trace-config level=", group=TRACING
        ),
    )
    # None: not given (--trace-config or the default decides).
    trace_rate: int | None = field(
        default=None,
        metadata=flag(parse=int, help="deprecated: --trace-config rate=", group=TRACING),
    )
    trace_count: int | None = field(
        default=None,
        metadata=flag(parse=int, help="deprecated: --trace-config count=", group=TRACING),
    )
    trace_log_frequency: int | None = field(
        default=None,
        metadata=flag(parse=int, help="deprecated: --trace-config log_frequency=", group=TRACING),
    )
    rate_limit: str = field(
        default="off",
        metadata=flag(
            parse=str.lower,
            choices=("off", "execution_count"),
            help="execution_count: instances run only when their resources are free",
            group=RATE_LIMIT,
        ),
    )
    # (resource, count, device or -1 for every device)
    rate_limit_resource: tuple[tuple[str, int, int], ...] = field(
        default=(),
        metadata=flag(
            repeat=True,
            parse=resource_limit,
            metavar="NAME:COUNT[:DEVICE]",
            help="a rate-limiter resource's count",
            group=RATE_LIMIT,
        ),
    )
    # Triton's SageMaker and Vertex AI endpoints (cloudflags.py).
    cloud: CloudSettings = field(default=CloudSettings(), metadata=cloud_flag())
    # vLLM's --allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials.
    cors: CorsSettings = field(default=CorsSettings(), metadata=cors_flag())
    chat: ChatSettings = field(default=ChatSettings(), metadata=chat_flag())  # chatflags.py
    # vLLM's flags of how its HTTP server serves: keep-alives, root path, /load... (vllmserve.py).
    serving: vllmserve.Serving = field(default=vllmserve.Serving(), metadata=vllmserve.flags())
    # (flag, value) of each tritonserver flag that does nothing here (tritonflags.py).
    inapplicable: tuple[tuple[str, str], ...] = field(default=(), metadata=inapplicable_flag())

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
