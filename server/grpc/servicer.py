"""The gRPC front end: every RPC of inference.GRPCInferenceService, each a thin adapter over
`InferenceServer`, mirroring the HTTP routes in server/http/app.py.

The RPCs that start work (inference, streams, model loads and unloads) pass the servicer's
`DrainGate` (see server/control/stopping.py): once the server stops they are refused
UNAVAILABLE, and those running are counted until they end. Health, metadata and
statistics keep answering.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from typing import Any, Final, TypeVar

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message

from ge_serve.protos import grpc_service_pb2 as pb
from ge_serve.protos import grpc_service_pb2_grpc as pb_grpc

from ..control.model_control import FILE_PREFIX
from ..control.stopping import DrainGate
from ..errors import ErrorCode, ServerError, bad_version_string, decoding
from ..inference import error_texts
from ..inference.core import InferenceServer
from ..inference.header_forward import HeaderForward
from ..inference.types import ParamValue
from ..observability.fronttrace import FrontTrace
from . import codec, encode
from .errors import Handler, Undecodable, abort, guard
from .stream import MAX_IN_FLIGHT, MAX_UNWRITTEN, StreamSession, metadata_value

INFERENCE_SERVICE: Final = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name

log = logging.getLogger(__name__)


def _call_trace(context: Any) -> FrontTrace:
    """Triton's gRPC timestamps of one ModelInfer call: grpc has read the request before
    the handler runs, so the wait for it ends as the handler starts; the answer is sent
    when the call is done, and the trace is written then."""
    front = FrontTrace("GRPC_WAITREAD_START", deferred=True)
    front.mark("GRPC_WAITREAD_END")

    def done(_: Any) -> None:
        front.mark("GRPC_SEND_END")
        front.release()

    context.add_done_callback(done)
    return front


# RepositoryModelLoad parameters: a JSON config, and files as "file:<version>/<name>".
LOAD_CONFIG = "config"
UNLOAD_DEPENDENTS = "unload_dependents"


Req = TypeVar("Req")
Resp = TypeVar("Resp")


def admitted(
    handler: Handler[GrpcServicer, Req, Resp],
) -> Handler[GrpcServicer, Req, Resp | None]:
    """A guarded unary handler that passes the gate: refused while the server stops, and
    counted while it runs."""

    @functools.wraps(handler)
    async def counted(self: GrpcServicer, request: Req, context: Any) -> Resp:
        self.gate.enter()
        try:
            return await handler(self, request, context)
        finally:
            self.gate.leave()

    return guard(counted)


class GrpcServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, core: InferenceServer, forward: HeaderForward | None = None) -> None:
        self.core = core
        # --grpc-header-forward-pattern: the metadata that becomes request parameters.
        self.forward = forward
        # Per-stream backpressure limits (see stream.py).
        self.max_in_flight = MAX_IN_FLIGHT
        self.max_unwritten = MAX_UNWRITTEN
        self._streams: set[StreamSession] = set()
        self.gate = DrainGate()

    def drain(self) -> None:
        """Refuse new work from now on, and end open streams once their requests are
        answered; `gate.wait_idle()` tells when everything admitted has ended."""
        self.gate.close()
        self.stop_streams()

    def stop_streams(self) -> None:
        """Open streams read no more requests; each ends once its requests are answered."""
        for session in list(self._streams):
            session.stop_reading()

    # --- health and metadata -------------------------------------------------------------

    @guard
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Any
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.core.live())

    @guard
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: Any
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.core.ready() and self.gate.is_open)

    @guard
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Any
    ) -> pb.ModelReadyResponse:
        # Triton's (grpc_server.cc): a version string it cannot read is INVALID_ARGUMENT.
        unreadable = bad_version_string(request.version) if request.version else None
        if unreadable is not None:
            raise unreadable
        return pb.ModelReadyResponse(ready=self.core.model_ready(request.name, request.version))

    @guard
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Any
    ) -> pb.ServerMetadataResponse:
        return encode.server_metadata(self.core.metadata())

    @guard
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Any
    ) -> pb.ModelMetadataResponse:
        return encode.model_metadata(self.core.model_metadata(request.name, request.version))

    @guard
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: Any
    ) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=self.core.model_config(request.name, request.version))

    # --- inference -----------------------------------------------------------------------

    @admitted
    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: Any
    ) -> pb.ModelInferResponse:
        front = None
        if self.core.tracing.active:
            front = _call_trace(context)
        with decoding("inference request"):
            decoded = codec.decode_infer_request(request)
        if self.forward is not None:
            self.forward.apply(decoded.request, context.invocation_metadata() or ())
        if front is not None:
            decoded.request.traceparent = metadata_value(context, "traceparent")
            decoded.request.front = front
        response = await self.core.infer(decoded.request, "ModelInfer RPC")
        encoded = codec.encode_infer_response(response)
        if front is not None:
            front.mark("INFER_RESPONSE_COMPLETE")
            front.mark("GRPC_SEND_START")
        return encoded

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterable[pb.ModelInferRequest], context: Any
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        try:
            self.gate.enter()
        except ServerError as exc:
            await abort(context, exc)
        # Registered before the first await, so a drain that starts later reaches it.
        session = StreamSession(
            self.core,
            request_iterator,
            context,
            self.max_in_flight,
            self.max_unwritten,
            self.forward,
        )
        self._streams.add(session)
        try:
            async for response in session.run():
                yield response
        finally:
            self._streams.discard(session)
            self.gate.leave()

    # --- statistics ----------------------------------------------------------------------

    @guard
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Any
    ) -> pb.ModelStatisticsResponse:
        return encode.statistics(self.core.statistics(request.name, request.version))

    # --- repository ----------------------------------------------------------------------

    @guard
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Any
    ) -> pb.RepositoryIndexResponse:
        _no_repository_name(request.repository_name)
        return encode.repository_index(await self.core.repository_index(request.ready))

    @admitted
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        _no_repository_name(request.repository_name, request.model_name, "load")
        with decoding("load request parameters"):
            config, files = load_parameters(request.parameters)
        await self.core.load_model(request.model_name, config, files)
        return pb.RepositoryModelLoadResponse()

    @admitted
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        _no_repository_name(request.repository_name, request.model_name, "unload")
        with decoding("unload request parameters"):
            dependents = unload_parameters(request.parameters)
        await self.core.unload_model(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()

    # --- shared memory -------------------------------------------------------------------

    @guard
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.core.shared_memory.status(request.name):
            response.regions[region.name].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(
                    name=region.name,
                    key=region.key,
                    offset=region.offset,
                    byte_size=region.byte_size,
                )
            )
        return response

    @guard
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self.core.shared_memory.register(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @guard
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self.core.shared_memory.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @guard
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Any
    ) -> pb.CudaSharedMemoryStatusResponse:
        # No CUDA region can be registered: this lists nothing, or names what is missing.
        self.core.shared_memory.cuda_status(request.name)
        return pb.CudaSharedMemoryStatusResponse()

    @guard
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Any
    ) -> pb.CudaSharedMemoryRegisterResponse:
        self.core.shared_memory.cuda_register(request.name)
        return pb.CudaSharedMemoryRegisterResponse()  # pragma: no cover - always raises

    @guard
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Any
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self.core.shared_memory.cuda_unregister(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # --- tracing -------------------------------------------------------------------------

    @guard
    async def TraceSetting(
        self, request: pb.TraceSettingRequest, context: Any
    ) -> pb.TraceSettingResponse:
        if request.settings:
            changes = {key: (list(value.value) or None) for key, value in request.settings.items()}
            current = self.core.update_trace_settings(request.model_name, changes)
        else:
            current = self.core.trace_settings(request.model_name)
        response = pb.TraceSettingResponse()
        for key, value in current.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    # --- logging -------------------------------------------------------------------------

    @guard
    async def LogSettings(
        self, request: pb.LogSettingsRequest, context: Any
    ) -> pb.LogSettingsResponse:
        if request.settings:
            with decoding("log settings request"):
                changes = {key: _log_value(value, key) for key, value in request.settings.items()}
            current = self.core.update_log_settings(changes)
        else:
            current = self.core.log_settings()
        response = pb.LogSettingsResponse()
        for key, value in current.items():
            _set_log_value(response.settings[key], key, value)
        return response


def _no_repository_name(name: str, model: str | None = None, action: str = "") -> None:
    """Triton's gRPC repository calls refuse a named repository, the index too; a load or
    unload (`model` given) that names no model also says why a KServe client's does."""
    if name:
        message = error_texts.REPOSITORY_NAME_UNSUPPORTED
        if model is not None:
            message = error_texts.repository_name_unsupported(name, model, action)
        raise ServerError(ErrorCode.UNSUPPORTED, message)


def load_parameters(params: Any) -> tuple[str | None, dict[str, bytes] | None]:
    """RepositoryModelLoad parameters as `core.load_model` arguments.

    `config` (string_param) is the model config as JSON; each `file:<version>/<name>`
    (bytes_param) is a file of the model's version folders, as raw bytes.
    """
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, param in params.items():
        value = _repository_value(param, key)
        if key == LOAD_CONFIG:
            if not isinstance(value, str):
                raise ServerError(
                    ErrorCode.INVALID_ARG, "load parameter 'config' must be a string_param (JSON)"
                )
            config = value
        elif key.startswith(FILE_PREFIX):
            if not isinstance(value, bytes):
                raise ServerError(
                    ErrorCode.INVALID_ARG, f"load parameter '{key}' must be a bytes_param"
                )
            path = key[len(FILE_PREFIX) :]
            if not path:
                raise ServerError(ErrorCode.INVALID_ARG, f"load parameter '{key}' has no path")
            files[path] = value
        else:
            raise ServerError(
                ErrorCode.INVALID_ARG,
                f"unexpected load parameter '{key}': expected 'config' or 'file:<path>'",
            )
    return config, files or None


def unload_parameters(params: Any) -> bool:
    """RepositoryModelUnload parameters: `unload_dependents` (bool_param) or nothing."""
    dependents = False
    for key, param in params.items():
        value = _repository_value(param, key)
        if key != UNLOAD_DEPENDENTS:
            raise ServerError(ErrorCode.INVALID_ARG, f"unexpected unload parameter '{key}'")
        if not isinstance(value, bool):
            raise ServerError(
                ErrorCode.INVALID_ARG, f"unload parameter '{key}' must be a bool_param"
            )
        dependents = value
    return dependents


def _repository_value(param: pb.ModelRepositoryParameter, key: str) -> ParamValue | bytes:
    choice = param.WhichOneof("parameter_choice")
    if choice is None:
        raise ServerError(ErrorCode.INVALID_ARG, f"parameter '{key}' has no value")
    value: ParamValue | bytes = getattr(param, choice)
    return value


def _log_value(setting: pb.LogSettingsRequest.SettingValue, key: str) -> ParamValue:
    choice = setting.WhichOneof("parameter_choice")
    if choice is None:
        raise ServerError(ErrorCode.INVALID_ARG, f"log setting '{key}' has no value")
    value: ParamValue = getattr(setting, choice)
    return value


def _set_log_value(target: pb.LogSettingsResponse.SettingValue, key: str, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int) and value >= 0:
        target.uint32_param = value
    elif isinstance(value, str):
        target.string_param = value
    else:
        raise ServerError(
            ErrorCode.INTERNAL, f"log setting '{key}' has a value of type {type(value).__name__}"
        )


# grpc's method handler factory for each (request streaming, response streaming).
_HANDLER_KINDS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def service_handler(handlers: Mapping[str, grpc.RpcMethodHandler]) -> grpc.GenericRpcHandler:
    """`method_handlers` as the inference service's generic handler."""
    return grpc.method_handlers_generic_handler(INFERENCE_SERVICE, handlers)


def method_handlers(servicer: GrpcServicer) -> dict[str, grpc.RpcMethodHandler]:
    """The inference service's RPCs by method name, as the generated `add_..._to_server`
    registers them, except that a request message protobuf cannot parse reaches its
    handler as `Undecodable` (answered INVALID_ARGUMENT): grpc itself would end the call
    UNKNOWN."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)
        make = _HANDLER_KINDS[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=lenient_parser(request_type),
            response_serializer=response_type.SerializeToString,
        )
    return handlers


def lenient_parser(message_type: type[Message]) -> Callable[[bytes], Message | Undecodable]:
    name = message_type.DESCRIPTOR.name

    def parse(data: bytes) -> Message | Undecodable:
        try:
            return message_type.FromString(data)
        except Exception as exc:
            return Undecodable(name, str(exc) or type(exc).__name__)

    return parse
