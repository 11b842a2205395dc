"""The composition root: builds every part from the settings, starts them in order and
stops them in reverse."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import uvloop

from ge_serve.backends.base import Backend, LoadedModel
from ge_serve.backends.ge.auto import DeviceUnavailable, select_runtime
from ge_serve.backends.ge.backend import GeBackend, backend_config_for
from ge_serve.backends.ge.sim_cost import parse_sim_cost
from ge_serve.backends.llm.backend import LlmBackend
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.backends.python.host.backend import PythonBackend
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.base import Scheduler
from ge_serve.scheduler.factory import SchedulerOptions, build_scheduler

from .control.logsettings import LogControl
from .control.model_control import ControlMode, ControlSettings, ModelControl
from .control.sharedmemory import SharedMemoryManager
from .control.stopping import ANSWER_S, DrainGate
from .errors import ServerError
from .grpc.server import GrpcFrontEnd
from .http.app import HttpFrontEnd
from .http.cloudstart import start_cloud
from .http.embedded import EmbeddedUvicorn, front_end_config
from .http.monitoring import MetricsApp, metrics_endpoint
from .inference.bls import CoreBridge
from .inference.core import InferenceServer, ServerInfo
from .inference.reports import RepositoryEntry
from .models.lifecycle import LifecycleSettings, ModelLifecycle
from .models.repository import ModelRepository
from .models.table import model_table
from .observability.metrics import ServerMetrics
from .observability.metricsconfig import MetricsConfig
from .observability.resources import DeviceMetricsProvider, ResourceSampler
from .startup.exiting import leave_running_executions
from .startup.gcheap import settle_heap
from .startup.grpc_core import grpc_core_environment
from .startup.listen import listen_socket
from .startup.malloc import limit_malloc_arenas, release_freed_memory
from .startup.part_settings import (
    configure_logging,
    default_max_batch_size,
    grpc_settings,
    grpc_tls_files,
    http_settings,
    response_cache,
    scheduler_options,
    trace_control,
    warn_about_flags,
)
from .startup.settings import Settings
from .workers.loopback import GRPC_SOCKET, HTTP_SOCKET, LoopbackSockets
from .workers.pool import FrontEndWorkers, WorkerSpec

log = logging.getLogger("ge_serve")


def make_scheduler(
    config: model_config_pb2.ModelConfig,
    loaded: LoadedModel,
    options: SchedulerOptions | None = None,
) -> Scheduler:
    """dynamic_batching: the (adaptive) dynamic batcher; otherwise one request, one run."""
    return build_scheduler(config, loaded, options or SchedulerOptions())


def make_backends(settings: Settings) -> dict[str, Backend]:
    """The host CPU backend, GE on the device runtime `--device` selects, Python
    models (one worker process per instance) and generative models (the engine)."""
    choice = select_runtime(
        settings.device,
        sim_devices=settings.sim_devices,
        sim_memory=settings.sim_device_memory,
        atc_cache_dir=settings.atc_cache_dir,
        sim_cost=parse_sim_cost(settings.sim_cost),
        sim_perturb=settings.sim_perturb,
    )
    log.info("GE backend: %s, chosen by %s", choice.runtime.describe(), choice.reason)
    ge = GeBackend(
        choice.runtime,
        backend_config_for(settings.backend_config),
        default_max_batch_size=default_max_batch_size(settings, "ge", "npu_ge"),
    )
    return {
        "onnxruntime": OnnxRuntimeBackend(default_max_batch_size(settings, "onnxruntime")),
        "ge": ge,
        "python": PythonBackend(backend_directory=settings.backend_directory),
        "llm": LlmBackend(ge),
    }


def close_backends(backends: dict[str, Backend]) -> None:
    for backend in backends.values():
        close = getattr(backend, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                log.exception("closing backend '%s' failed", backend.name)


class ServerApp:
    """Everything one `ge-serve` process runs, wired together."""

    def __init__(self, settings: Settings, log_control: LogControl | None = None) -> None:
        self.settings = settings
        self.repository = ModelRepository(
            [Path(p) for p in settings.model_repositories],
            settings.model_config_name,
            settings.model_namespacing,
        )
        self.backends = make_backends(settings)
        self.lifecycle = ModelLifecycle(
            self.repository,
            self.backends,
            functools.partial(make_scheduler, options=scheduler_options(settings)),
            LifecycleSettings(
                autocomplete=not settings.disable_auto_complete_config,
                default_backend="ge" if "ge" in self.backends else "onnxruntime",
                unload_timeout_s=settings.exit_timeout_secs,
                load_threads=settings.model_load_thread_count,
                load_retries=settings.model_load_retry_count,
            ),
        )
        self.control = ModelControl(
            self.lifecycle,
            self.repository,
            ControlSettings(
                ControlMode(settings.model_control_mode),
                settings.load_models,
                settings.repository_poll_secs,
            ),
        )
        self.core = InferenceServer(
            self.lifecycle,
            info=ServerInfo(name=settings.id),
            strict_readiness=settings.strict_readiness,
            control=self.control,
            log_control=log_control,
            shared_memory=SharedMemoryManager(enabled=settings.allow_client_shm),
            cache=response_cache(settings),
            tracing=trace_control(settings),
        )
        python = self.backends.get("python")
        self.python = python if isinstance(python, PythonBackend) else None
        if self.python is not None:
            # A version whose execute never returned still has its worker: end it. Any
            # backend's version: a Python-based backend's models have their own names.
            backend = self.python
            self.lifecycle.on_retired.append(lambda model: backend.retire(model.loaded))
        self.http = HttpFrontEnd(self.core, http_settings(settings))
        self.grpc_public = grpc_settings(settings)
        self.grpc_workers: FrontEndWorkers | None = None
        self.http_workers: FrontEndWorkers | None = None
        self._listeners: list[socket.socket] = []
        self.metrics = self._make_metrics() if settings.allow_metrics else None
        # With workers, this process's front ends answer what they pass on, on Unix
        # sockets only this user reaches (workers/loopback.py); they listen on the public
        # addresses.
        workers = settings.grpc_workers or settings.http_workers
        self.loopback = LoopbackSockets() if workers else None
        grpc_settings_ = self.grpc_public
        if settings.grpc_workers and self.loopback is not None:
            # TLS is the workers' to serve; the socket is this user's alone.
            grpc_settings_ = dataclasses.replace(
                self.grpc_public, unix_socket=self.loopback.path(GRPC_SOCKET), port=0,
                reuse_port=False, tls=None,
            )  # fmt: skip
        self.grpc = GrpcFrontEnd(self.core, grpc_settings_)
        self._servers: list[EmbeddedUvicorn] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.stopping = asyncio.Event()

    def _make_metrics(self) -> ServerMetrics:
        """Metrics observe every request; without them the hot path pays nothing for them."""
        settings = self.settings
        providers = [
            b for b in self.lifecycle.backends.values() if isinstance(b, DeviceMetricsProvider)
        ]
        sampler = ResourceSampler(
            settings.metrics_interval_ms / 1000,
            cpu=settings.allow_cpu_metrics,
            providers=providers if settings.allow_gpu_metrics else [],
        )
        metrics = ServerMetrics(
            self.core.stats,
            MetricsConfig.parse(settings.metrics_config),
            sampler,
            devices=settings.allow_gpu_metrics,
        )
        self.core.observers.append(metrics)
        if metrics.config.histogram_latencies:
            self.core.path.first_response = metrics.first_response
        if self.python is not None:
            metrics.registry.register(self.python)  # the Python models' custom metrics
        self.http.extra_routes.append(
            self.http.route("/metrics", metrics_endpoint(metrics.render), ["GET"])
        )
        return metrics

    async def start(self) -> bool:
        """Load the startup models, then open the endpoints. False means: exit with error."""
        if self.python is not None:
            # Python models' BLS calls enter the core on this loop.
            self.python.attach_core(CoreBridge(self.core, asyncio.get_running_loop()))
        try:
            self.repository.check_paths()
        except ServerError as exc:
            if self.settings.exit_on_error:
                log.error("%s", exc.message)
                return False
            # Triton's server failed to initialize: with --exit-on-error=false it still
            # opens its endpoints, not live and not ready, loading nothing.
            log.error(
                "%s: no models are loaded; the server runs not live and not ready "
                "(--exit-on-error=false)",
                exc.message,
            )
            self.core.fail_initialization()
        else:
            if not await self._load_startup_models():
                return False
        # gRPC and the cloud endpoints first: once HTTP answers ready, all are listening.
        if self.settings.allow_grpc:
            await self.grpc.start()
            if self.settings.grpc_workers and self.loopback is not None:
                self.loopback.restrict(GRPC_SOCKET)
                await self._start_grpc_workers()
            else:
                log.info("Started GRPCInferenceService at %s", self.grpc.settings.target)
        render = self.metrics.render if self.metrics is not None else None
        parts = (self.settings.cloud, self.http, self.repository.registered, render)
        if not await start_cloud(*parts, self._start_uvicorn):
            return False
        if self.settings.allow_http and self.settings.http_workers:
            await self._start_http_workers()
        elif self.settings.allow_http:
            await self._start_uvicorn(
                self.http.build(),
                self.settings.http_address,
                self.settings.http_port,
                "HTTP",
                self.http.gate,
            )
        if self.metrics is not None:
            await self._start_uvicorn(
                MetricsApp(self.metrics.render),
                self.settings.metrics_address,
                self.settings.metrics_port,
                "Metrics",
            )
            if self.metrics.sampler is not None:
                self.metrics.sampler.start()
        # Models and front ends are up: the standing heap (startup/gcheap.py).
        settle_heap()
        return True

    async def _load_startup_models(self) -> bool:
        """Load the startup models; False means: exit with error."""
        try:
            errors = await self.control.start()
        except ServerError as exc:
            log.error("%s", exc.message)
            return False
        rows = self.lifecycle.index()
        self.log_model_table(rows)
        await asyncio.to_thread(release_freed_memory)
        # A model the table shows with its reason was logged as it failed; the others
        # (a name the repository lacks, say) are said here.
        explained = {row.name for row in rows if row.reason}
        for name, message in sorted(errors.items()):
            if name not in explained:
                log.error("model '%s' failed to load: %s", name, message)
        if errors and self.settings.exit_on_error:
            log.error(
                "exiting: %d model(s) failed to load (use --exit-on-error=false to serve the "
                "rest): %s",
                len(errors),
                ", ".join(sorted(errors)),
            )
            return False
        return True

    async def _start_grpc_workers(self) -> None:
        public = self.grpc_public
        # A port in use must fail here: the workers share theirs (SO_REUSEPORT), which
        # would not notice another server on it. Port 0 is chosen here, once, for all.
        probe = listen_socket(public.address, public.port, "gRPC", public.reuse_port)
        port = int(probe.getsockname()[1])
        probe.close()
        public = dataclasses.replace(public, port=port)
        config = {
            "target": public.target,
            "forward": self.grpc.settings.target,
            "options": public.channel_options(),
            "restricted": public.restricted,
            "header_forward_pattern": public.header_forward_pattern,
            "tls": grpc_tls_files(self.settings),
            "log_format": self.settings.log_format,
            # The calls this process ends at the exit timeout are answered through them.
            "grace_s": self.settings.exit_timeout_secs + ANSWER_S,
        }
        spec = WorkerSpec(
            "ge_serve.server.grpc.worker",
            "gRPC",
            self.settings.grpc_workers,
            config,
            # grpc core's I/O path as this process runs it (server/cli.py).
            env=grpc_core_environment(os.environ),
        )
        self.grpc_workers = FrontEndWorkers(self.core, spec)
        await self.grpc_workers.start()
        workers = self.settings.grpc_workers
        log.info("Started GRPCInferenceService at %s (%d worker processes)", public.target, workers)

    async def _start_http_workers(self) -> None:
        """The workers share one listening socket, bound here; what they pass on, the
        front end answers here on a Unix socket (workers/loopback.py)."""
        settings = self.settings
        assert self.loopback is not None
        app = self.http.build(marked=False)  # the workers put the marks on (http/marks.py)
        internal = self.loopback.listen(HTTP_SOCKET, "Internal HTTP")
        await self._start_uvicorn(app, "", 0, "Internal HTTP", self.http.gate, internal)
        sock = listen_socket(
            settings.http_address, settings.http_port, "HTTP", settings.reuse_http_port
        )
        self._listeners.append(sock)
        config = {
            "listen_fd": sock.fileno(),
            "forward_path": self.loopback.path(HTTP_SOCKET),
            "max_input_size": self.http.settings.max_input_size,
            "max_chunks": self.http.settings.max_chunks,
            **self.http.worker_config(),
            "header_forward_pattern": self.http.settings.header_forward_pattern,
            "log_format": settings.log_format,
            # The requests this process ends at the exit timeout are answered through them.
            "grace_s": settings.exit_timeout_secs + ANSWER_S,
        }
        spec = WorkerSpec(
            "ge_serve.server.http.worker", "HTTP", settings.http_workers, config, (sock.fileno(),)
        )
        self.http_workers = FrontEndWorkers(self.core, spec)
        await self.http_workers.start()
        host, port = sock.getsockname()[:2]
        log.info("Started HTTPService at %s:%d (%d worker processes)", host, port,
                 settings.http_workers)  # fmt: skip

    async def _start_uvicorn(
        self,
        app: object,
        host: str,
        port: int,
        what: str,
        gate: DrainGate | None = None,
        bound: socket.socket | None = None,
    ) -> int:
        """Serve `app` on host:port, or on `bound` (a Unix socket); returns the port."""
        tls = self.http.settings.tls.uvicorn_options() if what == "HTTP" else {}
        config = front_end_config(app, self.settings.exit_timeout_secs, host=host, port=port, **tls)
        # Bound here rather than by uvicorn, which calls sys.exit() from inside its task
        # when the address is taken; this way the reason is one clear line.
        reuse = self.settings.reuse_http_port and what == "HTTP"
        sock = bound if bound is not None else listen_socket(host, port, what, reuse)
        where = sock.getsockname()
        port = int(where[1]) if isinstance(where, tuple) else 0
        shown = f"{host}:{port}" if isinstance(where, tuple) else str(where)
        server = EmbeddedUvicorn(config, gate)
        task = asyncio.create_task(server.serve(sockets=[sock]), name=f"uvicorn-{what}")
        self._servers.append(server)
        self._tasks.append(task)
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError(f"{what} server on {shown} exited during startup")
            await asyncio.sleep(0.01)
        log.info("Started %sService at %s", what, shown)
        return port

    def log_model_table(self, rows: list[RepositoryEntry]) -> None:
        log.info("models:", extra={"table": model_table(rows)})

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish within the exit timeout, close.

        Readiness turns false at once. Both front ends drain at the same time, within the
        same exit timeout (see server/control/stopping.py): HTTP closes its listener, answers 503 on
        the connections already open and finishes the requests it has read; gRPC keeps
        its listener open, refuses new work UNAVAILABLE and finishes the calls it has
        admitted. Only then does the core refuse requests, so one whose body was still
        arriving at the signal is served rather than refused.

        What still runs at the exit timeout, the core ends with UNAVAILABLE then, and the
        front ends have ANSWER_S more to send those answers before they close
        (server/inference/cutoff.py): closing first would cancel the requests, and their
        clients would get a 500 or a stream cut mid-body instead.
        """
        timeout = self.settings.exit_timeout_secs
        self.core.begin_draining()
        deadline = time.monotonic() + timeout
        cut = asyncio.get_running_loop().call_later(timeout, self.core.end_running)
        for server in self._servers:
            server.stop(deadline)
        grpc_stopped = asyncio.create_task(self.grpc.stop(timeout), name="grpc-stop")
        stopping = [*self._tasks, grpc_stopped]
        for workers in (self.grpc_workers, self.http_workers):
            if workers is not None:
                stopping.append(asyncio.create_task(workers.stop(timeout + ANSWER_S)))
        await asyncio.wait(stopping, timeout=timeout + ANSWER_S + 2)
        cut.cancel()
        # The gRPC stop ends on its own once the timeout has passed (it cancels what is
        # left); it must end before the loop closes, or grpc's poller thread outlives it.
        try:
            await grpc_stopped
        except Exception:
            log.exception("stopping the gRPC server failed")
        for sock in self._listeners:
            sock.close()
        self.core.stop_accepting()
        await self.control.stop(deadline)
        if self.metrics is not None and self.metrics.sampler is not None:
            await asyncio.to_thread(self.metrics.sampler.stop)
        await self.lifecycle.close(deadline)
        self.core.tracing.close()
        self.core.shared_memory.close()
        close_backends(self.backends)
        if self.loopback is not None:
            self.loopback.close()


async def serve(settings: Settings, log_control: LogControl | None = None) -> int:
    try:
        app = ServerApp(settings, log_control)
    except DeviceUnavailable as exc:
        log.error("%s", exc)
        return 1
    except ServerError as exc:  # a setting the parser cannot check: a TLS file, say
        log.error("%s", exc.message)
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, app.stopping.set)
    try:
        try:
            started = await app.start()
        except ServerError as exc:
            log.error("%s", exc.message)
            started = False
        if not started:
            await app.stop()
            return 1
        await app.stopping.wait()
        log.info(
            "signal received: stopping (waiting up to %ss for in-flight requests)",
            settings.exit_timeout_secs,
        )
        log.info("Waiting for in-flight requests to complete.")  # Triton's words
        await app.stop()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    log.info("stopped")
    return 0


def run(settings: Settings) -> int:
    log_control = configure_logging(settings)
    warn_about_flags(settings)
    configure_gil(settings)
    limit_malloc_arenas(settings.malloc_arena_max)
    code = uvloop.run(serve(settings, log_control))
    leave_running_executions(code)
    return code


def configure_gil(settings: Settings) -> None:
    """Apply --gil-switch-interval-us (0 leaves Python's setting).

    An executor slot's thread needs the GIL for a moment before and after each run
    (merging the batch, entering and leaving the runtime). With Python's 5 ms default, an
    event loop busy answering the previous batch makes it wait up to that long each time,
    and the slot sits idle between executions; a shorter interval cuts that idle time, but
    costs a loop-bound tiny model a little, hence 1 ms (bench/RESULTS.md, "Other
    measurements behind a default").
    """
    if settings.gil_switch_interval_us > 0:
        sys.setswitchinterval(settings.gil_switch_interval_us / 1e6)
