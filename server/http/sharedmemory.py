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

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ge_serve.server.errors import ErrorCode, ServerError, decoding
from ge_serve.server.sharedmemory import RegionStatus

from . import codec
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


def decode_register(body: bytes) -> tuple[str, int, int]:
    """(key, offset, byte_size) of a register request body; `offset` defaults to 0."""
    doc = codec.decode_json_object(body, "shared memory register request")
    if "key" not in doc:
        raise ServerError(
            ErrorCode.INVALID_ARG, "Shared memory register request has no 'key' field"
        )
    if "byte_size" not in doc:
        raise ServerError(
            ErrorCode.INVALID_ARG, "Shared memory register request has no 'byte_size' field"
        )
    key = doc["key"]
    if not isinstance(key, str):
        raise ServerError(ErrorCode.INVALID_ARG, "'key' of the register request must be a string")
    return key, _count(doc.get("offset", 0), "offset"), _count(doc["byte_size"], "byte_size")


def _count(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ServerError(
            ErrorCode.INVALID_ARG,
            f"'{field}' of the register request must be a non-negative integer",
        )
    return value


def routes(front: RouteHost) -> list[Route]:
    shm = front.core.shared_memory

    async def system_status(request: Request) -> Response:
        return json_response(_status_json(shm.status(_region(request))))

    async def system_register(request: Request) -> Response:
        body = await front.read_body(request)
        with decoding("shared memory register request"):
            key, offset, byte_size = decode_register(body)
        await shm.register(_region(request), key, offset, byte_size)
        return Response(status_code=200)

    async def system_unregister(request: Request) -> Response:
        shm.unregister(_region(request))
        return Response(status_code=200)

    async def cuda_status(request: Request) -> Response:
        return json_response(_status_json(shm.cuda_status(_region(request))))

    async def cuda_register(request: Request) -> Response:
        shm.cuda_register(_region(request))
        return Response(status_code=200)  # pragma: no cover - cuda_register always raises

    async def cuda_unregister(request: Request) -> Response:
        shm.cuda_unregister(_region(request))
        return Response(status_code=200)

    table: list[Route] = []
    for base, status, register, unregister in (
        (SYSTEM, system_status, system_register, system_unregister),
        (CUDA, cuda_status, cuda_register, cuda_unregister),
    ):
        table += [
            front.route(base + "/status", status, ["GET"]),
            front.route(base + REGION + "/status", status, ["GET"]),
            front.route(base + REGION + "/register", register, ["POST"]),
            front.route(base + "/unregister", unregister, ["POST"]),
            front.route(base + REGION + "/unregister", unregister, ["POST"]),
        ]
    return table
