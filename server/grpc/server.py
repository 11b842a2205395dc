"""The grpc.aio server: the inference service, standard health checking and reflection, on
the event loop the HTTP server shares."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Final

import grpc
import grpc.aio
from grpc_health.v1 import health as grpc_health
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..control.stopping import ANSWER_S
from ..errors import ErrorCode, ServerError
from ..inference.core import InferenceServer
from ..inference.header_forward import HeaderForward
from ..startup.gcheap import collect_all
from .call_intake import CallIntake
from .restricted import RestrictedProtocolInterceptor
from .servicer import INFERENCE_SERVICE, GrpcServicer, method_handlers, service_handler
from .tls import GrpcTls

log = logging.getLogger(__name__)

# Triton's limit: a message may be as large as a signed 32-bit length allows.
MAX_MESSAGE_BYTES: Final = 2**31 - 1
# How often Health.Watch subscribers learn about readiness changes.
HEALTH_REFRESH_S: Final = 1.0


# --grpc-infer-response-compression-level, as grpc core's compression levels.
COMPRESSION_LEVELS: Final = {"none": 0, "low": 1, "medium": 2, "high": 3}


@dataclass(frozen=True, slots=True)
class GrpcSettings:
    """What the gRPC front end needs; the composition root derives it from `Settings`,
    which holds the defaults."""

    address: str
    port: int
    keepalive_time_ms: int
    keepalive_timeout_ms: int
    keepalive_permit_without_calls: bool
    http2_max_pings_without_data: int
    http2_min_recv_ping_interval_without_data_ms: int
    # --grpc-restricted-protocol: (category, header, value)
    restricted: tuple[tuple[str, str, str], ...]
    reuse_port: bool = False
    http2_max_ping_strikes: int = 2
    # 0: no limit.
    max_connection_age_ms: int = 0
    max_connection_age_grace_ms: int = 0
    compression_level: str = "none"
    tls: GrpcTls | None = None
    # --grpc-header-forward-pattern; "" forwards no metadata.
    header_forward_pattern: str = ""
    # A Unix socket's path to listen at instead of address:port: the server's own front
    # end where gRPC workers pass calls on (server/workers/loopback.py); never a user's.
    unix_socket: str = ""

    @property
    def target(self) -> str:
        if self.unix_socket:
            return f"unix:{self.unix_socket}"
        host = self.address
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{self.port}"

    def channel_options(self) -> list[tuple[str, int]]:
        options = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", int(self.keepalive_permit_without_calls)),
            ("grpc.http2.max_pings_without_data", self.http2_max_pings_without_data),
            (
                "grpc.http2.min_recv_ping_interval_without_data_ms",
                self.http2_min_recv_ping_interval_without_data_ms,
            ),
            ("grpc.http2.max_ping_strikes", self.http2_max_ping_strikes),
            # A port already in use must fail the bind, unless sharing it was asked for.
            ("grpc.so_reuseport", int(self.reuse_port)),
        ]
        if self.max_connection_age_ms:
            options.append(("grpc.max_connection_age_ms", self.max_connection_age_ms))
        if self.max_connection_age_grace_ms:
            options.append(("grpc.max_connection_age_grace_ms", self.max_connection_age_grace_ms))
        level = COMPRESSION_LEVELS[self.compression_level]
        if level:
            # Responses are compressed at this level with an algorithm the client accepts.
            options.append(("grpc.default_compression_level", level))
        return options


class CoreHealth(grpc_health.aio.HealthServicer):  # type: ignore[misc]
    """grpc.health.v1.Health: SERVING exactly when the core is ready.

    Check answers for any service name, as Triton's does (it never reads the name), so
    a probe configured with another name still sees the server's state; Watch follows
    the whole server ("") and inference.GRPCInferenceService.
    """

    SERVICES: Final = ("", INFERENCE_SERVICE)

    def __init__(self, core: InferenceServer) -> None:
        super().__init__()
        self._core = core
        self._stopping = False

    async def Check(self, request: health_pb2.HealthCheckRequest, context: Any) -> Any:
        await self.refresh()
        return health_pb2.HealthCheckResponse(status=self._status())

    def _status(self) -> Any:
        if self._core.ready() and not self._stopping:
            return health_pb2.HealthCheckResponse.SERVING
        return health_pb2.HealthCheckResponse.NOT_SERVING

    async def enter_graceful_shutdown(self) -> None:
        """NOT_SERVING from now on, for Check as for Watch."""
        self._stopping = True
        await super().enter_graceful_shutdown()

    async def refresh(self) -> None:
        status = self._status()
        for service in self.SERVICES:
            await self.set(service, status)

    async def follow(self, interval_s: float) -> None:
        """Keep the status current for Watch subscribers."""
        while True:
            await self.refresh()
            await asyncio.sleep(interval_s)


class GrpcFrontEnd:
    def __init__(self, core: InferenceServer, settings: GrpcSettings) -> None:
        self.core = core
        self.settings = settings
        self.servicer = GrpcServicer(core, HeaderForward.of(settings.header_forward_pattern))
        self.health = CoreHealth(core)
        self.port = 0
        self._server: Any = None
        self._intake: CallIntake | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._stopping: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Bind and start serving; an address that cannot be bound is a ServerError."""
        restricted = self.settings.restricted
        # Only when a group is restricted: an interceptor costs every call.
        interceptors = [RestrictedProtocolInterceptor.from_rules(restricted)] if restricted else []
        server = grpc.aio.server(interceptors=interceptors, options=self.settings.channel_options())
        handlers = method_handlers(self.servicer)
        server.add_generic_rpc_handlers((service_handler(handlers),))
        intake = CallIntake(
            server, INFERENCE_SERVICE, "ModelInfer", handlers["ModelInfer"], interceptors
        )
        intake.register()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (INFERENCE_SERVICE, grpc_health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        target = self.settings.target
        tls = self.settings.tls
        try:
            if tls is not None:
                port = server.add_secure_port(target, tls.credentials())
            else:
                port = server.add_insecure_port(target)
        except RuntimeError as exc:
            raise _cannot_listen(target, str(exc)) from None
        if not port:
            raise _cannot_listen(target, "the address could not be bound")
        await server.start()
        intake.attach()
        self._server, self._intake = server, intake
        self.port = int(port)
        await self.health.refresh()
        self._health_task = asyncio.create_task(
            self.health.follow(HEALTH_REFRESH_S), name="grpc-health"
        )

    async def stop(self, grace_s: float) -> None:
        """Drain, then stop, within `grace_s` and ANSWER_S more (see `_stop`); a second call
        waits for the stop already under way."""
        if self._stopping is None:
            self._stopping = asyncio.create_task(self._stop(grace_s), name="grpc-stop")
        await asyncio.shield(self._stopping)

    async def _stop(self, grace_s: float) -> None:
        """Drain, then stop, within `grace_s` and ANSWER_S more.

        Health turns NOT_SERVING and the RPCs that start work are refused UNAVAILABLE while
        the listener stays open; open streams read no more requests. Once every admitted
        call has ended and refusals have gone quiet (or `grace_s` has passed, the core has
        ended the calls still running and ANSWER_S has passed for their answers) the grpc
        server stops, cancelling what is left. Stopping it earlier would have grpc core
        drop calls that had arrived but were not yet handled, which their clients see as
        CANCELLED (see server/control/stopping.py).
        """
        if self._server is None:
            return
        deadline = time.monotonic() + grace_s
        self.servicer.drain()
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        await self.health.enter_graceful_shutdown()
        gate = self.servicer.gate
        # At the deadline the core ends the calls still running, UNAVAILABLE; their
        # answers get ANSWER_S to leave (server/control/stopping.py).
        answered = deadline + ANSWER_S
        if await gate.wait_idle(answered - time.monotonic()):
            await gate.linger(deadline - time.monotonic())
        else:
            log.warning(
                "%d gRPC call(s) still unanswered after the %ss exit timeout are cancelled",
                gate.active,
                grace_s,
            )
        server, self._server = self._server, None
        # grpc core ends a call that no handler has picked up by then CANCELLED, not
        # UNAVAILABLE (grpc/grpc#41785); the drain and linger above leave it none but
        # those of clients that kept retrying through the linger.
        await server.stop(max(answered - time.monotonic(), 0.0))
        intake, self._intake = self._intake, None
        if intake is not None:
            await intake.close()
        # The calls' ended contexts and aborts form reference cycles with the server; once
        # they are collected grpc releases its poller thread, rather than at exit. The
        # server was frozen with the standing heap, so the collection thaws it.
        del server
        collect_all()


def _cannot_listen(target: str, why: str) -> ServerError:
    return ServerError(ErrorCode.UNAVAILABLE, f"cannot listen for gRPC on {target}: {why}")
