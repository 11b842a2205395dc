"""Each part's own settings, derived from the one `Settings` the command line gives.

The composition root (app.py) builds the parts from what these return; each front end and
the scheduler see only their own frozen settings, never `Settings` itself.
"""

from __future__ import annotations

import logging
import os
import ssl as openssl
from pathlib import Path

from ge_serve.backends.onnx_io import DEFAULT_MAX_BATCH_SIZE
from ge_serve.scheduler.factory import (
    BACKLOG_DELAY_SCHEDULER_ENV,
    SchedulerOptions,
    delay_count_from,
)
from ge_serve.scheduler.ratelimit import RateLimiter

from ..control import uvicornlogs
from ..control.logsettings import LogControl, LogSettings
from ..errors import ErrorCode, ServerError
from ..grpc.server import GrpcSettings
from ..grpc.tls import GrpcTls
from ..http.app import HttpSettings
from ..http.openai.tools import ToolSettings
from ..inference.responsecache import ResponseCache
from ..observability.otel import make_sink
from ..observability.traceconfig import unknown_settings
from ..observability.tracing import TraceControl
from . import tritonflags
from .flags import DEFAULT_MAX_BATCH_SIZE_KEY
from .settings import Settings

log = logging.getLogger("ge_serve")


def configure_logging(settings: Settings) -> LogControl:
    """Logging that the logging extension can change at run time."""
    control = LogControl(
        LogSettings(
            log_file=settings.log_file,
            log_info=settings.log_info,
            log_warning=settings.log_warning,
            log_error=settings.log_error,
            log_verbose_level=settings.log_verbose,
            log_format=settings.log_format,  # type: ignore[arg-type]
        )
    )
    control.install()
    # uvicorn's lines to that log; with HTTP workers, they write the access lines.
    uvicornlogs.install(settings.serving.uvicorn, access=not settings.http_workers)
    return control


def warn_about_flags(settings: Settings) -> None:
    """One warning for the tritonserver flags that do nothing here, and one for each
    deprecated spelling used."""
    message = tritonflags.warning(settings.inapplicable)
    if message is not None:
        log.warning("%s", message)
    deprecated = {
        "--trace-file": settings.trace_file,
        "--trace-level": settings.trace_level,
        "--trace-rate": settings.trace_rate is not None,
        "--trace-count": settings.trace_count is not None,
        "--trace-log-frequency": settings.trace_log_frequency is not None,
        "--response-cache-byte-size": settings.response_cache_byte_size,
    }
    for name, given in deprecated.items():
        if given:
            instead = "--cache-config local,size=" if "cache" in name else "--trace-config"
            log.warning("'%s' is deprecated; use '%s' instead", name, instead)
    for warning in unknown_settings(settings.trace_config):
        log.warning("%s", warning)


def scheduler_options(settings: Settings) -> SchedulerOptions:
    # The environment is read here, once, as the server starts (Triton's test hook).
    limiter = None
    if settings.rate_limit == "execution_count":
        limiter = RateLimiter(settings.rate_limit_resource)
    return SchedulerOptions(
        adaptive_batching=settings.adaptive_batching,
        delay_count=delay_count_from(os.environ),
        backlog_delay_count=delay_count_from(os.environ, BACKLOG_DELAY_SCHEDULER_ENV),
        rate_limiter=limiter,
    )


def default_max_batch_size(settings: Settings, *backends: str) -> int:
    """Triton's default-max-batch-size for a backend (any of its names): its own
    `--backend-config=<backend>,default-max-batch-size=N`, else the global
    `--backend-config=default-max-batch-size=N`, else 4; the last given of a form wins."""
    own = {f"{backend}.{DEFAULT_MAX_BATCH_SIZE_KEY}" for backend in backends}
    found: dict[bool, int] = {}
    for key, text in settings.backend_config:
        if key == DEFAULT_MAX_BATCH_SIZE_KEY or key in own:
            found[key in own] = int(text)  # checked when the command line was read
    return found.get(True, found.get(False, DEFAULT_MAX_BATCH_SIZE))


def http_settings(settings: Settings) -> HttpSettings:
    return HttpSettings(
        max_input_size=settings.http_max_input_size,
        restricted_api=settings.http_restricted_api,
        header_forward_pattern=settings.http_header_forward_pattern,
        api_keys=settings.api_key,
        cors=settings.cors,
        chat=settings.chat,
        request_id_headers=settings.enable_request_id_headers,
        load_tracking=settings.serving.load_tracking,
        request_log=settings.serving.log,
        tls=settings.serving.tls,
        uvicorn_logs=settings.serving.uvicorn,
        root_path=settings.serving.root_path,
        openapi=not settings.serving.disable_fastapi_docs,
        tools=ToolSettings(
            settings.tool_call_parser,
            settings.max_tool_call_parse_bytes,
            settings.reasoning_parser,
            settings.enable_prompt_tokens_details,
            settings.enable_force_include_usage,
            settings.return_tokens_as_token_ids,
            settings.exclude_tools_when_tool_choice_none,
            sse_keep_alive=settings.serving.sse_keep_alive_interval,
        ),
    )


def grpc_settings(settings: Settings) -> GrpcSettings:
    return GrpcSettings(
        address=settings.grpc_address,
        port=settings.grpc_port,
        keepalive_time_ms=settings.grpc_keepalive_time_ms,
        keepalive_timeout_ms=settings.grpc_keepalive_timeout_ms,
        keepalive_permit_without_calls=settings.grpc_keepalive_permit_without_calls,
        http2_max_pings_without_data=settings.grpc_http2_max_pings_without_data,
        http2_min_recv_ping_interval_without_data_ms=(
            settings.grpc_http2_min_recv_ping_interval_without_data_ms
        ),
        restricted=settings.grpc_restricted_protocol,
        reuse_port=settings.reuse_grpc_port,
        http2_max_ping_strikes=settings.grpc_http2_max_ping_strikes,
        max_connection_age_ms=settings.grpc_max_connection_age_ms,
        max_connection_age_grace_ms=settings.grpc_max_connection_age_grace_ms,
        compression_level=settings.grpc_infer_response_compression_level,
        tls=grpc_tls(settings),
        header_forward_pattern=settings.grpc_header_forward_pattern,
    )


def grpc_tls(settings: Settings) -> GrpcTls | None:
    """--grpc-use-ssl[-mutual]: the PEM files, read now, so a missing one fails the start."""
    ssl = settings.grpc_ssl
    if not ssl.on:
        return None

    def read(flag: str, path: str) -> bytes:
        if not path:
            needs = "--grpc-use-ssl-mutual=true" if ssl.mutual else "--grpc-use-ssl"
            raise ServerError(ErrorCode.INVALID_ARG, f"{needs} needs {flag}")
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ServerError(
                ErrorCode.INVALID_ARG, f"cannot read {flag} '{path}': {exc.strerror}"
            ) from None

    cert = read("--grpc-server-cert", settings.grpc_server_cert)
    key = read("--grpc-server-key", settings.grpc_server_key)
    try:  # grpc would say only that the port could not be bound
        openssl.create_default_context(openssl.Purpose.CLIENT_AUTH).load_cert_chain(
            settings.grpc_server_cert, settings.grpc_server_key, password=""
        )
    except (openssl.SSLError, ValueError) as exc:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"--grpc-server-cert '{settings.grpc_server_cert}' and --grpc-server-key "
            f"'{settings.grpc_server_key}' are not a certificate and its key: {exc}",
        ) from None
    return GrpcTls(
        cert=cert,
        key=key,
        # Only client certificates are checked against it: with TLS that checks the server
        # alone, Triton reads a file it cannot open as empty and starts, and so does this.
        root=read("--grpc-root-cert", settings.grpc_root_cert) if ssl.mutual else None,
        mutual=ssl.mutual,
    )


def grpc_tls_files(settings: Settings) -> dict[str, object] | None:
    """--grpc-use-ssl[-mutual]'s files as gRPC workers are told them: their paths, which
    each worker reads, never their bytes (a command line is any user's to read)."""
    ssl = settings.grpc_ssl
    if not ssl.on:
        return None
    root = settings.grpc_root_cert if ssl.mutual else None
    return {"cert": settings.grpc_server_cert, "key": settings.grpc_server_key, "root": root,
            "mutual": ssl.mutual}  # fmt: skip


def response_cache(settings: Settings) -> ResponseCache | None:
    """--cache-config local,size=BYTES: the cache the models with response_cache use."""
    size = settings.cache_size()
    if size is None:
        return None
    log.info("response cache: local, %d bytes", size)
    return ResponseCache(size)


def trace_control(settings: Settings) -> TraceControl:
    """--trace-config: the startup trace settings and where finished traces go."""
    control = TraceControl(settings.trace())
    control.sink = make_sink(control)
    startup = control.startup
    if startup.level and not control.active:
        # Triton takes such a setting and traces nothing; say so rather than stay silent.
        log.warning(
            "tracing is off: trace level %s is set but no trace file is given "
            "(--trace-config triton,file=<path>)",
            ",".join(startup.level),
        )
    return control
