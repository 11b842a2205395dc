"""The listening endpoints' addresses and ports, checked together once the command line is
read, before any model loads.

As in Triton, a port is any integer when it is read (ParseOption<int>), and only an
endpoint that is on must have a usable one: qa L0_socket starts tritonserver with
`--http-port -47 --allow-http 0`. Two endpoints that are on may not share an address and
port (Triton's TritonServerParameters::CheckPortCollision, in its words); without this
check the second one would fail to bind only after every model had loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .cloudflags import SAGEMAKER, VERTEX_AI
from .settings import Settings

MAX_PORT: Final = 65535


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One listener: `name` as Triton's message names it, `flag` as a user wrote it."""

    name: str
    flag: str
    address: str
    port: int
    enabled: bool


def endpoints(settings: Settings) -> tuple[Endpoint, ...]:
    """Every endpoint ge-serve can open, in Triton's order (a further listener is one
    more entry here)."""
    return (
        Endpoint(
            "HTTP", "--http-port", settings.http_address, settings.http_port, settings.allow_http
        ),
        Endpoint(
            "GRPC", "--grpc-port", settings.grpc_address, settings.grpc_port, settings.allow_grpc
        ),
        Endpoint(
            "metrics",
            "--metrics-port",
            settings.metrics_address,
            settings.metrics_port,
            settings.allow_metrics,
        ),
        # Triton binds these on every interface (sagemaker_server.cc, vertex_ai_server.cc).
        Endpoint(
            SAGEMAKER,
            "--sagemaker-port",
            "0.0.0.0",
            settings.cloud.sagemaker_port,
            settings.cloud.allow_sagemaker,
        ),
        Endpoint(
            VERTEX_AI,
            "--vertex-ai-port",
            "0.0.0.0",
            settings.cloud.vertex_ai_port,
            settings.cloud.allow_vertex_ai,
        ),
    )


def check_endpoints(listeners: Sequence[Endpoint]) -> None:
    """ValueError, with a message for people, if the endpoints that are on cannot all
    listen: two on one address and port, or a port out of range."""
    on = [endpoint for endpoint in listeners if endpoint.enabled]
    for index, first in enumerate(on):
        for second in on[index + 1 :]:
            # Compared as written, as Triton does: 0.0.0.0 and 127.0.0.1 differ here, and
            # the bind reports that clash. Port 0 asks for a free port, chosen for each
            # endpoint on its own, so two of them never clash (Triton refuses them).
            if (first.address, first.port) == (second.address, second.port) and first.port:
                raise ValueError(
                    f"The server cannot listen to {first.name} requests and {second.name} "
                    f"requests at the same address and port {first.address}:{first.port}"
                )
    for endpoint in on:
        if not 0 <= endpoint.port <= MAX_PORT:
            # Triton fails to bind only after loading the models; grpc core would even
            # bind such a port modulo 65536 while the log named the one asked for.
            raise ValueError(f"{endpoint.flag}: a port is 0 to {MAX_PORT}, got {endpoint.port}")


def check_safe_range(listeners: Sequence[Endpoint], safe: tuple[int, int] | None) -> None:
    """Triton's CheckPortCollision for `--sagemaker-safe-port-range`: with SageMaker on,
    every other endpoint that is on at its address must use a port in the range."""
    sagemaker = next((e for e in listeners if e.name == SAGEMAKER and e.enabled), None)
    if sagemaker is None or safe is None:
        return
    for other in listeners:
        if other is sagemaker or not other.enabled or other.address != sagemaker.address:
            continue
        if not safe[0] <= other.port <= safe[1]:
            raise ValueError(
                f"The server cannot listen to {other.name} requests at port {other.port}, "
                f"allowed port range is [{safe[0]}, {safe[1]}]"
            )
