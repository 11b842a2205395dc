"""The composition root: builds every part from the settings, starts them in order and
stops them in reverse."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Generator
from pathlib import Path

import uvicorn
import uvloop

from ge_serve.backends.base import Backend, LoadedModel
from ge_serve.backends.onnxruntime import OnnxRuntimeBackend
from ge_serve.protos import model_config_pb2
from ge_serve.scheduler.base import Scheduler
from ge_serve.scheduler.direct import DirectScheduler
from ge_serve.scheduler.dispatch import ExecutorSlot, SlotPool

from .cli import Settings
from .core import InferenceServer
from .errors import ServerError
from .grpc.server import GrpcFrontEnd, GrpcSettings
from .http.app import HttpFrontEnd, HttpSettings
from .lifecycle import LifecycleSettings, ModelLifecycle
from .repository import ModelRepository

log = logging.getLogger("ge_serve")


class EmbeddedUvicorn(uvicorn.Server):
    """A uvicorn server that leaves signal handling to us, so several servers share a loop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def configure_logging(settings: Settings) -> None:
    level = (
        logging.DEBUG
        if settings.log_verbose > 0
        else (logging.INFO if settings.log_info else logging.WARNING)
    )
    logging.basicConfig(level=level, format="%(asctime)s %(levelname).1s %(name)s] %(message)s")


def make_scheduler(config: model_config_pb2.ModelConfig, loaded: LoadedModel) -> Scheduler:
    pool = SlotPool([ExecutorSlot(executor) for executor in loaded.executors])
    return DirectScheduler(pool, loaded.gears, batching=config.max_batch_size > 0)


def make_backends(settings: Settings) -> dict[str, Backend]:
    return {"onnxruntime": OnnxRuntimeBackend()}


class ServerApp:
    """Everything one `ge-serve` process runs, wired together."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.repository = ModelRepository([Path(p) for p in settings.model_repositories])
        self.lifecycle = ModelLifecycle(
            self.repository,
            make_backends(settings),
            make_scheduler,
            LifecycleSettings(
                autocomplete=not settings.disable_auto_complete_config,
                unload_timeout_s=settings.exit_timeout_secs,
            ),
        )
        self.core = InferenceServer(self.lifecycle, strict_readiness=settings.strict_readiness)
        self.http = HttpFrontEnd(self.core, HttpSettings(settings.http_max_input_size))
        self.grpc = GrpcFrontEnd(self.core, GrpcSettings.from_settings(settings))
        self._servers: list[EmbeddedUvicorn] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.stopping = asyncio.Event()

    def startup_models(self) -> list[str]:
        mode = self.settings.model_control_mode
        if mode == "explicit":
            wanted = self.settings.load_models
            if "*" in wanted:
                return sorted(self.repository.scan())
            return list(dict.fromkeys(wanted))
        return sorted(self.repository.scan())

    async def start(self) -> bool:
        """Load the startup models, then open the endpoints. False means: exit with error."""
        try:
            names = self.startup_models()
        except ServerError as exc:
            log.error("%s", exc.message)
            return False
        errors = await self.lifecycle.load_many(names)
        self.log_model_table()
        if errors and self.settings.exit_on_error:
            for name, message in sorted(errors.items()):
                log.error("model '%s' failed to load: %s", name, message)
            log.error(
                "exiting: %d model(s) failed to load (use --exit-on-error=false to serve the "
                "rest): %s",
                len(errors),
                ", ".join(sorted(errors)),
            )
            return False
        if self.settings.allow_http:
            await self._start_uvicorn(
                self.http.build(), self.settings.http_address, self.settings.http_port, "HTTP"
            )
        if self.settings.allow_grpc:
            try:
                await self.grpc.start()
            except RuntimeError as exc:
                log.error("%s", exc)
                return False
            log.info("Started GRPCInferenceService at %s", self.grpc.settings.target)
        return True

    async def _start_uvicorn(self, app: object, host: str, port: int, what: str) -> None:
        config = uvicorn.Config(
            app,  # type: ignore[arg-type]
            host=host,
            port=port,
            loop="none",
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=int(self.settings.exit_timeout_secs),
            http="httptools",
            ws="none",
        )
        server = EmbeddedUvicorn(config)
        task = asyncio.create_task(server.serve(), name=f"uvicorn-{what}")
        self._servers.append(server)
        self._tasks.append(task)
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError(f"{what} server on {host}:{port} exited during startup")
            await asyncio.sleep(0.01)
        log.info("Started %sService at %s:%d", what, host, port)

    def log_model_table(self) -> None:
        rows = self.lifecycle.index()
        width = max([len(r["name"]) for r in rows] + [5])
        lines = [f"{'Model':<{width}} | Version | Status"]
        lines.append("-" * (width + 1) + "+---------+" + "-" * 30)
        for row in rows:
            status = row["state"] or "UNAVAILABLE"
            if row["reason"] and row["state"] != "READY":
                status += f": {row['reason']}"
            lines.append(f"{row['name']:<{width}} | {row['version']:<7} | {status}")
        log.info("models:\n%s", "\n".join(lines))

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish within the exit timeout, close."""
        self.core.stop_accepting()
        for server in self._servers:
            server.should_exit = True
        grpc_stopped = asyncio.create_task(self.grpc.stop(self.settings.exit_timeout_secs))
        await asyncio.wait(
            [*self._tasks, grpc_stopped], timeout=self.settings.exit_timeout_secs + 1
        )
        await self.lifecycle.close()


async def serve(settings: Settings) -> int:
    app = ServerApp(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, app.stopping.set)
    try:
        if not await app.start():
            await app.lifecycle.close()
            return 1
        await app.stopping.wait()
        log.info(
            "signal received: stopping (waiting up to %ss for in-flight requests)",
            settings.exit_timeout_secs,
        )
        await app.stop()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    log.info("stopped")
    return 0


def run(settings: Settings) -> int:
    configure_logging(settings)
    return uvloop.run(serve(settings))
