"""A gRPC front-end worker process (see server/workers/).

It listens on the server's gRPC address beside its sibling workers (SO_REUSEPORT: the
kernel spreads connections over them), decodes and encodes ModelInfer itself with the
same codec, guard and drain gate as the servicer, and runs each request in the server
process over its link (server/workers/remote.py). Every other RPC of the inference service,
health checking and reflection, streams included, goes on as bytes to the server's own
gRPC front end on its Unix socket (server/workers/loopback.py), with its metadata and
deadline, and its answer or status comes back as it is.

    python -m ge_serve.server.grpc.worker '{"target": ..., "forward": ..., "link_fd": ...}'
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import uvloop
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from ge_serve.link.child import leave_stop_signals_to_parent
from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.server.control.logformat import worker_logging

from ..control.stopping import DrainGate
from ..errors import decoding
from ..inference.header_forward import HeaderForward
from ..startup.gcheap import settle_heap
from ..workers.remote import RemoteCore
from . import codec
from .call_intake import CallIntake
from .errors import guard
from .restricted import RestrictedProtocolInterceptor
from .servicer import INFERENCE_SERVICE, lenient_parser
from .stream import metadata_value
from .tls import GrpcTls

log = logging.getLogger("ge_serve.grpc.worker")

MODEL_INFER = f"/{INFERENCE_SERVICE}/ModelInfer"
# Metadata the channel sets itself, not passed on.
_OWN_METADATA = ("user-agent", "grpc-", ":")


class WorkerServicer:
    """ModelInfer, as GrpcServicer serves it, over the remote core."""

    def __init__(self, core: RemoteCore, forward: HeaderForward | None = None) -> None:
        self.core = core
        self.forward = forward
        self.gate = DrainGate()

    @guard
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> Any:
        self.gate.enter()
        try:
            with decoding("inference request"):
                decoded = codec.decode_infer_request(request)
            if self.forward is not None:
                self.forward.apply(decoded.request, context.invocation_metadata() or ())
            # Whether tracing is on is the server's to know: the context always goes along.
            decoded.request.traceparent = metadata_value(context, "traceparent")
            return await self.core.infer(
                decoded.request, "ModelInfer RPC", codec.encode_infer_response
            )
        finally:
            self.gate.leave()


def _methods() -> dict[str, tuple[bool, bool]]:
    """Every method the server offers: path -> (client streaming, server streaming)."""
    found: dict[str, tuple[bool, bool]] = {}
    for descriptor in (pb.DESCRIPTOR, health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR):
        for service in descriptor.services_by_name.values():
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                found[path] = (method.client_streaming, method.server_streaming)
    return found


class WorkerHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, servicer: WorkerServicer, forward: grpc.aio.Channel) -> None:
        self.infer = grpc.unary_unary_rpc_method_handler(
            servicer.ModelInfer,
            request_deserializer=lenient_parser(pb.ModelInferRequest),
            response_serializer=pb.ModelInferResponse.SerializeToString,
        )
        self._forward = forward
        self._methods = _methods()
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler | None:
        method = str(handler_call_details.method)
        if method == MODEL_INFER:
            return self.infer
        handler = self._handlers.get(method)
        if handler is None:
            kind = self._methods.get(method)
            if kind is None:
                return None  # UNIMPLEMENTED, as the server answers it
            handler = _forwarding(self._forward, method, kind)
            self._handlers[method] = handler
        return handler


def _passed_on(context: Any) -> list[tuple[str, Any]]:
    return [
        (key, value)
        for key, value in (context.invocation_metadata() or ())
        if not key.startswith(_OWN_METADATA)
    ]


async def _relay_error(context: Any, err: grpc.aio.AioRpcError) -> None:
    await context.abort(err.code(), err.details() or "", err.trailing_metadata() or ())


def _forwarding(
    channel: grpc.aio.Channel, method: str, kind: tuple[bool, bool]
) -> grpc.RpcMethodHandler:
    """A handler that makes the same call on the server's own front end, bytes as they are."""
    client_streaming, server_streaming = kind
    if not client_streaming and not server_streaming:
        call_unary = channel.unary_unary(method)

        async def unary(request: bytes, context: Any) -> bytes:
            try:
                answer: bytes = await call_unary(
                    request, metadata=_passed_on(context), timeout=context.time_remaining()
                )
                return answer
            except grpc.aio.AioRpcError as err:
                await _relay_error(context, err)
                raise  # pragma: no cover - abort raises

        return grpc.unary_unary_rpc_method_handler(unary)

    async def relay(call: Any, context: Any) -> AsyncIterator[bytes]:
        try:
            async for item in call:
                yield item
        except grpc.aio.AioRpcError as err:
            await _relay_error(context, err)

    # grpc.aio streams a handler's answers only from an async generator function.
    if not client_streaming:
        call_stream = channel.unary_stream(method)

        async def unary_stream(request: bytes, context: Any) -> AsyncIterator[bytes]:
            call = call_stream(
                request, metadata=_passed_on(context), timeout=context.time_remaining()
            )
            async for item in relay(call, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream)
    call_both = channel.stream_stream(method)

    async def stream_stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        call = call_both(requests, metadata=_passed_on(context), timeout=context.time_remaining())
        async for item in relay(call, context):
            yield item

    if server_streaming:
        return grpc.stream_stream_rpc_method_handler(stream_stream)
    call_in = channel.stream_unary(method)

    async def stream_unary(requests: AsyncIterator[bytes], context: Any) -> bytes:
        try:
            answer: bytes = await call_in(
                requests, metadata=_passed_on(context), timeout=context.time_remaining()
            )
            return answer
        except grpc.aio.AioRpcError as err:
            await _relay_error(context, err)
            raise  # pragma: no cover - abort raises

    return grpc.stream_unary_rpc_method_handler(stream_unary)


def tls_credentials(files: dict[str, Any] | None) -> grpc.ServerCredentials | None:
    """--grpc-use-ssl[-mutual]: the server's files (it read them at its start, so they
    were readable then), read again here; None for plaintext."""
    if files is None:
        return None
    mutual = bool(files["mutual"])
    root = Path(str(files["root"])).read_bytes() if mutual else None
    key, cert = (Path(str(files[name])).read_bytes() for name in ("key", "cert"))
    return GrpcTls(cert, key, root, mutual).credentials()


async def serve(config: dict[str, Any]) -> int:
    # Set by the server's `Stop`, or its link's end; never by a signal (main()).
    stopping = asyncio.Event()
    index = int(config["index"])
    core = RemoteCore(socket.socket(fileno=int(config["link_fd"])), f"grpc-{index}", stopping.set)
    options = [tuple(option) for option in config["options"] if option[0] != "grpc.so_reuseport"]
    # Forwarded answers are compressed once, by this process's server, not on the Unix socket too.
    local = [option for option in options if option[0] != "grpc.default_compression_level"]
    forward = grpc.aio.insecure_channel(str(config["forward"]), options=local)
    rules = tuple(tuple(rule) for rule in config["restricted"])
    interceptors = [RestrictedProtocolInterceptor.from_rules(rules)] if rules else []  # type: ignore[arg-type]
    server = grpc.aio.server(
        interceptors=interceptors, options=[*options, ("grpc.so_reuseport", 1)]
    )
    servicer = WorkerServicer(core, HeaderForward.of(str(config["header_forward_pattern"])))
    handler = WorkerHandler(servicer, forward)
    server.add_generic_rpc_handlers((handler,))
    intake = CallIntake(server, INFERENCE_SERVICE, "ModelInfer", handler.infer, interceptors)
    intake.register()
    target = str(config["target"])
    try:
        credentials = tls_credentials(config["tls"])
        if credentials is None:
            port = server.add_insecure_port(target)
        else:
            port = server.add_secure_port(target, credentials)
    except OSError as exc:
        port, why = 0, f"cannot read {exc.filename}: {exc.strerror}"
    except RuntimeError as exc:
        port, why = 0, str(exc)
    else:
        why = "the address could not be bound"
    if not port:
        core.ready(f"cannot listen for gRPC on {target}: {why}")
        await asyncio.sleep(0.1)  # the message leaves before the process does
        return 1
    await server.start()
    intake.attach()
    # Its standing heap never changes: no model loads here (startup/gcheap.py).
    settle_heap()
    core.ready()
    await stopping.wait()
    grace = float(config["grace_s"])
    deadline = time.monotonic() + grace
    servicer.gate.close()
    await servicer.gate.wait_idle(grace)
    await server.stop(max(deadline - time.monotonic(), 0.0))
    await intake.close()
    await forward.close()
    core.link.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    leave_stop_signals_to_parent()
    config: dict[str, Any] = json.loads(args[0])
    worker_logging(config)
    run: Callable[[Any], int] = uvloop.run
    return run(serve(config))


if __name__ == "__main__":
    raise SystemExit(main())
