"""HTTP routes of the shared-memory extensions (Triton's
docs/protocol/extension_shared_memory.md):

    GET  /v2/systemsharedmemory[/region/{region}]/status
    POST /v2/systemsharedmemory/region/{region}/register   {"key", "offset", "byte_size"}
    POST /v2/systemsharedmemory[/region/{region}]/unregister

and the same under /v2/cudasharedmemory, where nothing can be registered (no CUDA devices):
status lists nothing and unregister has nothing to do, so clients that clean up at start-up
(perf_analyzer) work.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ge_serve.server.control.sharedmemory import RegionStatus
from ge_serve.server.errors import ErrorCode, ServerError, decoding, invalid_arg

from .bodies import SystemSharedMemoryRegisterRequest, decode_body
from .openapi import Body
from .responses import json_response
from .routing import RouteHost

SYSTEM = "/v2/systemsharedmemory"
CUDA = "/v2/cudasharedmemory"
REGION = "/region/{region}"


def _region(request: Request) -> str:
    return str(request.path_params.get("region", ""))


def _status_json(regions: list[RegionStatus]) -> list[dict[str, Any]]:
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for r in regions
    ]


# sizeof(cudaIpcMemHandle_t): the bytes a CUDA IPC handle holds.
CUDA_HANDLE_BYTES = 64


def _check_cuda_handle(body: bytes) -> None:
    """Triton's checks of a CUDA register request's `raw_handle`, before it tries to open
    the handle (which here always fails)."""
    try:
        doc = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise invalid_arg(f"failed to parse the register request JSON buffer: {exc}") from None
    handle = doc.get("raw_handle") if isinstance(doc, dict) else None
    if handle is None:
        raise invalid_arg("Shared memory register request has no 'raw_handle' field")
    text = handle.get("b64") if isinstance(handle, dict) else None
    try:
        size = len(base64.b64decode(text, validate=True)) if isinstance(text, str) else -1
    except binascii.Error:
        size = -1
    if size != CUDA_HANDLE_BYTES:
        raise invalid_arg("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")


def routes(front: RouteHost) -> list[Route]:
    shm = front.core.shared_memory

    async def system_status(request: Request) -> Response:
        return json_response(_status_json(shm.status(_region(request))))

    async def system_register(request: Request) -> Response:
        shm.check_enabled()  # before the body is read, as Triton refuses it
        body = await front.read_body(request)
        with decoding("shared memory register request"):
            doc = decode_body(
                SystemSharedMemoryRegisterRequest, body, "shared memory register request"
            )
        try:
            await shm.register(_region(request), doc.key, doc.offset, doc.byte_size)
        except ServerError as exc:
            if exc.code is not ErrorCode.INTERNAL:
                raise
            # A key that names nothing: Triton's INTERNAL, which gRPC clients match on,
            # but over HTTP a 400, since bad input is never a 500 here.
            raise invalid_arg(exc.message) from None
        return Response(status_code=200)

    async def system_unregister(request: Request) -> Response:
        shm.unregister(_region(request))
        return Response(status_code=200)

    async def cuda_status(request: Request) -> Response:
        return json_response(_status_json(shm.cuda_status(_region(request))))

    async def cuda_register(request: Request) -> Response:
        shm.check_enabled()
        _check_cuda_handle(await front.read_body(request))
        shm.cuda_register(_region(request))
        return Response(status_code=200)  # pragma: no cover - cuda_register always raises

    async def cuda_unregister(request: Request) -> Response:
        shm.cuda_unregister(_region(request))
        return Response(status_code=200)

    table: list[Route] = []
    register_body = Body(SystemSharedMemoryRegisterRequest)
    for base, status, register, unregister, body in (
        (SYSTEM, system_status, system_register, system_unregister, register_body),
        (CUDA, cuda_status, cuda_register, cuda_unregister, None),
    ):
        table += [
            front.route(base + "/status", status, ["GET"]),
            front.route(base + REGION + "/status", status, ["GET"]),
            front.route(base + REGION + "/register", register, ["POST"], body),
            front.route(base + "/unregister", unregister, ["POST"]),
            front.route(base + REGION + "/unregister", unregister, ["POST"]),
        ]
    return table
