"""grpc core's I/O path for the gRPC front end, chosen before grpc is imported.

grpc core reads `GRPC_EXPERIMENTS` once, when its module loads. In current grpcio the
server's connections are served by the EventEngine listener: its own thread pool reads
and writes each connection and hands every completed operation on to the completion
queue that grpc.aio's poller thread drains for the event loop. That is one more thread
hop for every read and write of every call. With the listener switched off
(`-event_engine_listener`) the poller thread does the socket I/O itself, as grpc did
before EventEngine. On `simple` this took server CPU per request down by about 7 % at
concurrency 1 and 16, in the bare grpc.aio server and in ge-serve alike, with the same
or better throughput (bench/RESULTS.md, "gRPC core's listener").

A `GRPC_EXPERIMENTS` the user set is kept as it is. When a grpcio release drops the
experiment, grpc logs "Unknown experiment" at start-up; a test asserts the installed
release still knows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

VARIABLE: Final = "GRPC_EXPERIMENTS"
# Experiments switched off: the EventEngine listener.
EXPERIMENTS: Final = "-event_engine_listener"


def grpc_core_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to set before grpc is imported: none when the user chose."""
    if VARIABLE in environ:
        return {}
    return {VARIABLE: EXPERIMENTS}
